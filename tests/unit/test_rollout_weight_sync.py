"""WeightSync bookkeeping with small in-test fakes (tests only): the phase order, one bucket alive,
bucket sizes, checksum mismatches named; then the same sync into the real torch engine."""
import weakref

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from hybridrl.adapters.base import OffloadReport
from hybridrl.hybrid import SyncOptions, WeightSync, WeightSyncError, generate_sequences, logprob_gap
from hybridrl.hybrid.checks import tensor_checksum
from hybridrl.protocol import DataProto
from hybridrl.rollout.base import RolloutEngine, SamplingParams
from hybridrl.rollout.torch_engine import TorchRolloutEngine
from tests.fixtures.actor_stubs import StubActor


class FakeActor(StubActor):
    """Exports a dict of tensors in greedy buckets; counts how many earlier-bucket tensors are alive
    whenever it builds a new bucket (the one-bucket-alive promise)."""

    def __init__(self, weights: dict[str, torch.Tensor], log: list, bucket_override=None):
        self.weights, self.log, self.bucket_override = weights, log, bucket_override
        self.alive_at_build: list[int] = []
        self._refs: list[weakref.ref] = []

    def export_weights(self, bucket_bytes):
        if self.bucket_override is not None:
            yield from self.bucket_override
            return
        bucket, size = [], 0
        for name, t in self.weights.items():
            nbytes = t.numel() * t.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            if not bucket:
                self.alive_at_build.append(sum(r() is not None for r in self._refs))
            copy = t.clone()  # a fresh tensor per export, as a gather would produce
            self._refs.append(weakref.ref(copy))
            bucket.append((name, copy))
            size += nbytes
            del copy
        yield bucket

    def offload(self, params, grads, optimizer):
        self.log.append(f"actor.offload(params={params}, grads={grads}, optimizer={optimizer})")
        return OffloadReport(params_bytes=10 * params, grads_bytes=20 * grads, optimizer_bytes=40 * optimizer)

    def onload(self, params, grads, optimizer):
        self.log.append(f"actor.onload(params={params}, grads={grads}, optimizer={optimizer})")
        return OffloadReport(params_bytes=10 * params, grads_bytes=20 * grads, optimizer_bytes=40 * optimizer)

    def begin_offload(self, params, optimizer):
        self.log.append(f"actor.begin_offload(params={params}, optimizer={optimizer})")



class FakeEngine(RolloutEngine):
    """Logs calls and keeps checksums of what it got; `corrupt` perturbs one named tensor on load;
    `fuse` sums the named group's members into one checksum, like a fused qkv parameter."""

    checksum_rtol = 0.0

    def __init__(self, log: list, corrupt=None, fuse=()):
        self.log, self.corrupt, self.fuse = log, corrupt, tuple(fuse)
        self.sums: dict[str, float] = {}

    def load_weights(self, weights):
        names = []
        for name, t in weights:
            if name == self.corrupt:
                t = t + 1e-3
            self.sums[name] = float(tensor_checksum(t))
            names.append(name)
        self.log.append(f"engine.load_weights({len(names)})")

    def finish_weight_sync(self):
        self.log.append("engine.finish_weight_sync")

    def checksum_terms(self, hf_name):
        return [(m, 1.0) for m in self.fuse] if hf_name in self.fuse else [(hf_name, 1.0)]

    def weight_checksums(self, hf_names):
        self.log.append("engine.weight_checksums")
        self.checked = list(hf_names)
        return {n: sum(self.sums[m] for m, _ in self.checksum_terms(n)) for n in hf_names}

    def wake_up(self, tags=None):
        self.log.append(f"engine.wake_up({tags})")

    def sleep(self, level=1):
        self.log.append("engine.sleep")

    def generate(self, prompts, sampling):
        self.log.append("engine.generate")
        return prompts


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()  # tiny matmuls on shared cores: threads only contend
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def toy_weights(n=6, size=256) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {f"model.layers.{i}.w": torch.randn(size, generator=g) for i in range(n)}  # 1 KiB each


def test_phase_order_and_metrics():
    log: list = []
    actor, engine = FakeActor(toy_weights(), log), FakeEngine(log)
    sync = WeightSync(actor, engine, SyncOptions(bucket_bytes=2048, optimizer_offload=True))
    with sync.rollout_phase(step=0) as metrics:
        engine.generate(None, None)
    assert log == [
        "actor.offload(params=False, grads=True, optimizer=True)",
        "engine.wake_up(['weights'])",
        *["engine.load_weights(2)"] * 3,
        "engine.finish_weight_sync",
        "engine.weight_checksums",
        "engine.wake_up(['kv_cache'])",
        "engine.generate",
        "engine.sleep",
        "actor.onload(params=False, grads=True, optimizer=False)",
    ]
    assert metrics["reshard/bytes"] == 6 * 1024 and metrics["reshard/buckets"] == 3
    assert metrics["reshard/max_bucket_bytes"] == 2048 and metrics["sync_check/tensors_checked"] == 6
    assert metrics["offload/bytes"] == 60 and metrics["onload/bytes"] == 20  # the optimizer state comes back at the step
    assert metrics["timing_s/reshard"] > 0 and metrics["timing_s/reshard_wait"] == 0.0  # one process: no peers


def test_without_optimizer_offload_the_optimizer_state_stays_on_the_gpu():
    """verl's optimizer_offload=false: only the grads make room for the engine (released, not copied)."""
    log: list = []
    sync = WeightSync(FakeActor(toy_weights(2), log), FakeEngine(log), SyncOptions(bucket_bytes=4096))
    with sync.rollout_phase(step=0) as metrics:
        pass
    assert log[0] == "actor.offload(params=False, grads=True, optimizer=False)"
    assert log[-1] == "actor.onload(params=False, grads=True, optimizer=False)"
    assert metrics["offload/bytes"] == 20


def test_the_optimizer_state_starts_for_the_host_after_the_update_and_push_finishes_it():
    """optimizer_offload: after_update() begins the state's trip (its copies overlap what runs until the next step);
    push's offload waits for the rest and reports both times. Without optimizer_offload nothing begins."""
    log: list = []

    class Timed(FakeActor):
        def offload(self, params, grads, optimizer):
            report = super().offload(params, grads, optimizer)
            return OffloadReport(**{**report.__dict__, "optimizer_seconds": 1.5 * optimizer,
                                    "optimizer_exposed_seconds": 0.25 * optimizer})

    sync = WeightSync(Timed(toy_weights(2), log), FakeEngine(log), SyncOptions(bucket_bytes=4096, optimizer_offload=True))
    sync.after_update()
    with sync.rollout_phase(step=1) as metrics:
        sync.after_update()  # generating (pushed, not released): the state is on the host already, nothing to begin
    assert log[:2] == ["actor.begin_offload(params=False, optimizer=True)",
                       "actor.offload(params=False, grads=True, optimizer=True)"]
    assert log.count("actor.begin_offload(params=False, optimizer=True)") == 1
    assert metrics["timing_s/optimizer_offload"] == 1.5 and metrics["timing_s/optimizer_offload_exposed"] == 0.25
    kept: list = []
    plain = WeightSync(Timed(toy_weights(2), kept), FakeEngine(kept), SyncOptions(bucket_bytes=4096))
    plain.after_update()
    with plain.rollout_phase(step=1) as metrics:
        pass
    assert not any("begin_offload" in e for e in kept) and "timing_s/optimizer_offload" not in metrics


class OutOfMemoryEngine(FakeEngine):
    def wake_up(self, tags=None):
        if tags == ["kv_cache"]:
            raise RuntimeError("CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62")
        super().wake_up(tags)


def test_an_engine_that_cannot_wake_names_the_offload_keys():
    log: list = []
    sync = WeightSync(FakeActor(toy_weights(2), log), OutOfMemoryEngine(log), SyncOptions(bucket_bytes=4096))
    with pytest.raises(MemoryError) as e:
        sync.push(step=0)
    msg = str(e.value)
    assert "rank 0" in msg and "kv_cache" in msg and "optimizer state" in msg
    assert "actor_rollout_ref.actor.megatron.optimizer_offload=true" in msg
    assert "actor_rollout_ref.rollout.gpu_memory_utilization" in msg
    with pytest.raises(RuntimeError, match="unrelated"):  # other runtime errors pass through unchanged
        WeightSync(FakeActor(toy_weights(2), []), _Failing([]), SyncOptions()).push(step=0)


class _Failing(FakeEngine):
    def wake_up(self, tags=None):
        raise RuntimeError("unrelated failure")


def test_param_offload_after_the_export_and_no_sleep_without_free_cache_engine():
    log: list = []
    sync = WeightSync(FakeActor(toy_weights(2), log), FakeEngine(log),
                      SyncOptions(bucket_bytes=4096, param_offload=True, optimizer_offload=True,
                                  free_cache_engine=False))
    with sync.rollout_phase(step=0):
        pass
    assert log == [
        "actor.offload(params=False, grads=True, optimizer=True)",
        "engine.wake_up(['weights'])",
        "engine.load_weights(2)",
        "engine.finish_weight_sync",
        "engine.weight_checksums",
        "actor.offload(params=True, grads=False, optimizer=False)",
        "engine.wake_up(['kv_cache'])",
        "actor.onload(params=True, grads=True, optimizer=False)",
    ]


def test_one_bucket_alive_at_a_time():
    actor = FakeActor(toy_weights(8), [])
    WeightSync(actor, FakeEngine([]), SyncOptions(bucket_bytes=1024)).push(step=0)
    assert len(actor.alive_at_build) == 8 and max(actor.alive_at_build) == 0


def test_bucket_sizes_follow_the_option_and_repeated_names_fail():
    w = toy_weights(6)
    for limit, buckets in ((1024, 6), (2048, 3), (3000, 3), (1 << 20, 1)):
        m = WeightSync(FakeActor(w, []), FakeEngine([]), SyncOptions(bucket_bytes=limit)).push(0)
        assert m["reshard/buckets"] == buckets and m["reshard/max_bucket_bytes"] <= limit
    twice = [[("a", torch.zeros(1))], [("a", torch.zeros(1))]]
    with pytest.raises(WeightSyncError, match="'a' twice"):
        WeightSync(FakeActor(w, [], twice), FakeEngine([]), SyncOptions(bucket_bytes=2048)).push(0)


def test_checksum_mismatch_is_named_and_training_state_comes_back():
    log: list = []
    sync = WeightSync(FakeActor(toy_weights(), log), FakeEngine(log, corrupt="model.layers.4.w"),
                      SyncOptions(bucket_bytes=4096))
    with pytest.raises(WeightSyncError, match=r"'model\.layers\.4\.w' differs"):
        with sync.rollout_phase(step=0):
            pass
    assert log[-1] == "actor.onload(params=False, grads=True, optimizer=False)"


def test_sampled_checks_are_deterministic_per_step_and_keep_fused_groups():
    w = toy_weights(40)
    fused = ("model.layers.3.w", "model.layers.7.w", "model.layers.9.w")

    def checked(step):
        engine = FakeEngine([], fuse=fused)
        sync = WeightSync(FakeActor(w, []), engine, SyncOptions(bucket_bytes=1 << 20, check_fraction=0.3))
        m = sync.push(step)
        return m["sync_check/tensors_checked"], engine

    a, b = checked(1)[0], checked(1)[0]
    assert a == b and 0 < a < 40
    groups = []
    for step in range(12):
        engine = checked(step)[1]
        groups.append(tuple(sorted(engine.checked)))
        assert len(set(fused) & set(engine.checked)) in (0, 3)  # a fused group is checked all or nothing
    assert len(set(groups)) > 1  # a different subset per step
    assert any(set(fused) <= set(g) for g in groups)


def test_logprob_gap_over_response_tokens_only():
    rollout = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    actor = torch.tensor([[-1.1, -2.0, -9.0], [-0.2, -7.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    gap = logprob_gap(rollout, actor, mask)
    assert gap["rollout_vs_actor/logprob_abs_diff_max"] == pytest.approx(0.3)
    assert gap["rollout_vs_actor/logprob_abs_diff_mean"] == pytest.approx(0.4 / 3)


def test_sync_into_the_torch_engine_then_generate():
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    engine = TorchRolloutEngine(cfg)
    sync = WeightSync(FakeActor(state, []), engine, SyncOptions(bucket_bytes=16 * 1024))
    prompts = DataProto.from_dict({"input_ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
                                   "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
                                   "position_ids": torch.tensor([[0, 0, 1], [0, 1, 2]])})
    out, metrics = generate_sequences(sync, prompts, SamplingParams(n=2, max_tokens=4, seed=0), step=0)
    assert len(out) == 4 and metrics["reshard/tensors"] == len(state)
    assert metrics["reshard/bytes"] == sum(t.numel() * 4 for t in state.values())
    assert metrics["sync_check/max_rel_diff"] == 0.0  # bitwise
    assert all(torch.equal(engine.named_weights()[k], v) for k, v in state.items())
    with pytest.raises(RuntimeError, match="asleep"):  # released: the engine sleeps until the next push
        engine.generate(prompts, SamplingParams(max_tokens=1))
