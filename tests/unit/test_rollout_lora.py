"""The adapter-only LoRA weight sync on CPU (issue 40): the torch engine with adapters (hybridrl/rollout/lora.py)
against a full sync of the merged weights and against transformers + peft; WeightSync moving only the adapters after
the first sync, its checks naming a bad adapter; and the vLLM side's pure parts (hybridrl/rollout/vllm_lora.py: its
engine arguments, the base weights' renamed names, where each adapter tensor sits in vLLM's slot buffers) against
vLLM 0.26's layout written out by hand (set_lora / slice_lora_a / slice_lora_b of its LoRA layers)."""
import sys
import types
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from hybridrl.config.lora_checks import rollout_lora
from hybridrl.hybrid import SyncOptions, WeightSync, WeightSyncError
from hybridrl.protocol import DataProto
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.lora import AdapterLoadError, RolloutLora, peft_module, peft_name
from hybridrl.rollout.torch_engine import TorchRolloutEngine
from tests.fixtures.actor_stubs import StubActor

VOCAB, EOS, PAD = 96, 1, 0
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SPEC = RolloutLora(rank=4, alpha=6.0, targets=ALL)  # scaling 1.5: not a power of two


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def llama_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, eos_token_id=EOS,
                       pad_token_id=PAD, initializer_range=0.1)


def base_model(cfg, seed=0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def random_adapters(model, spec: RolloutLora, seed: int) -> dict[str, torch.Tensor]:
    """PEFT-named A [r, in], B [out, r] for every targeted linear (B nonzero: the adapters change the model)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for path, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and path.rsplit(".", 1)[-1] in spec.targets:
            out[peft_name(path, "A")] = torch.randn(spec.rank, m.in_features, generator=g) * 0.2
            out[peft_name(path, "B")] = torch.randn(m.out_features, spec.rank, generator=g) * 0.2
    return out


def merged(base: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor], spec: RolloutLora) -> dict:
    out = {n: t.clone() for n, t in base.items()}
    for name, a in adapters.items():
        module, which = peft_module(name)
        if which == "A":
            out[f"{module}.weight"] += spec.scaling * adapters[peft_name(module, "B")] @ a
    return out


def buckets(tensors: dict[str, torch.Tensor], bucket_bytes: int):
    bucket, size = [], 0
    for name, t in tensors.items():
        bucket.append((name, t.clone()))
        size += t.numel() * t.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


class LoraActor(StubActor):
    """The frozen base through export_weights, the adapters through export_adapter_weights (lora.merge=false)."""

    def __init__(self, base: dict, adapters: dict):
        self.base, self.adapters = base, adapters

    def export_weights(self, bucket_bytes, names=None):
        yield from buckets({n: t for n, t in self.base.items() if names is None or n in names}, bucket_bytes)

    def export_adapter_weights(self, bucket_bytes):
        yield from buckets(self.adapters, bucket_bytes)


class MergedActor(StubActor):
    def __init__(self, weights: dict):
        self.weights = weights

    def export_weights(self, bucket_bytes, names=None):
        yield from buckets({n: t for n, t in self.weights.items() if names is None or n in names}, bucket_bytes)


def prompts(lengths=(3, 7, 5), seed=1) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(2, VOCAB, (n,), generator=g)
        mask[i, width - n:] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def rollout(sync: WeightSync, step: int, sampling: SamplingParams) -> tuple[DataProto, dict]:
    metrics = sync.push(step)
    out = sync.engine.generate(prompts(), sampling)
    sync.release()
    return out, metrics


def nbytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def test_adapter_only_sync_generates_what_a_full_sync_of_the_merged_weights_does():
    """Two engines, one taking the base once and the adapters every step, one taking W + s*B@A in full every step:
    the same tokens and log-probs (fp32) at each of three adapter versions; after the first sync only the adapters'
    bytes move (reshard/bytes), and the base the engine holds is still the base."""
    cfg = llama_config()
    model = base_model(cfg)
    base = {n: t.clone() for n, t in model.state_dict().items()}
    lora_actor = LoraActor(base, random_adapters(model, SPEC, seed=1))
    merged_actor = MergedActor(merged(base, lora_actor.adapters, SPEC))
    with_adapters = WeightSync(lora_actor, TorchRolloutEngine(cfg, lora=SPEC), SyncOptions(adapters=True,
                                                                                           bucket_bytes=4096))
    full = WeightSync(merged_actor, TorchRolloutEngine(cfg), SyncOptions())
    sampling = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=7, stop_token_ids=(EOS,))
    adapter_bytes = nbytes(lora_actor.adapters)
    for step in (1, 2, 3):
        if step > 1:  # the policy moved: new adapters, and the merged weights they give
            lora_actor.adapters = random_adapters(model, SPEC, seed=step)
            merged_actor.weights = merged(base, lora_actor.adapters, SPEC)
        a, metrics = rollout(with_adapters, step, sampling)
        b, _ = rollout(full, step, sampling)
        assert torch.equal(a.batch["responses"], b.batch["responses"]), step
        diff = (a.batch["rollout_log_probs"] - b.batch["rollout_log_probs"]).abs().max()
        assert diff < 1e-5, (step, float(diff))
        assert metrics["reshard/adapter_bytes"] == adapter_bytes
        assert metrics["sync_check/adapter_tensors_checked"] == len(lora_actor.adapters)
        if step == 1:  # the base streamed once, with the first adapters
            assert metrics["reshard/bytes"] == nbytes(base) + adapter_bytes
        else:
            assert metrics["reshard/bytes"] == adapter_bytes and metrics["reshard/adapter_buckets"] > 1
            assert "sync_check/tensors_checked" not in metrics  # no base weight moved, none to check
    held = with_adapters.engine.named_weights()
    assert all(torch.equal(held[n], t) for n, t in base.items())


def test_torch_engine_adapters_compute_what_peft_does():
    """The engine's forward with adapters loaded equals transformers + peft with the same adapter (fp32)."""
    peft = pytest.importorskip("peft")
    cfg = llama_config()
    model = base_model(cfg)
    spec = RolloutLora(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))
    adapters = random_adapters(model, spec, seed=3)
    engine = TorchRolloutEngine(cfg, lora=spec)
    engine.load_weights(model.state_dict().items())
    engine.finish_weight_sync()
    engine.load_adapter(adapters.items())
    engine.finish_adapter_sync(1)
    ref = peft.get_peft_model(base_model(cfg), peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(spec.targets),
                                                               lora_dropout=0.0))
    result = peft.set_peft_model_state_dict(ref, adapters)
    assert not result.unexpected_keys
    ids = prompts().batch["input_ids"]
    with torch.no_grad():
        got, want = engine.model(input_ids=ids).logits, ref(input_ids=ids).logits
        plain = base_model(cfg)(input_ids=ids).logits
    assert (got - want).abs().max() < 1e-5
    assert (got - plain).abs().max() > 1e-2  # the adapters do something


def test_a_bad_or_missing_adapter_is_named():
    cfg = llama_config()
    model = base_model(cfg)
    base = {n: t.clone() for n, t in model.state_dict().items()}
    adapters = random_adapters(model, SPEC, seed=1)
    bad = sorted(adapters)[5]

    class Corrupting(TorchRolloutEngine):
        def load_adapter(self, tensors):
            super().load_adapter((n, t + 1e-3 if n == bad else t) for n, t in tensors)

    sync = WeightSync(LoraActor(base, adapters), Corrupting(cfg, lora=SPEC), SyncOptions(adapters=True))
    with pytest.raises(WeightSyncError, match=bad.replace(".", r"\.")):
        sync.push(1)
    missing = {n: t for n, t in adapters.items() if n != bad}
    sync = WeightSync(LoraActor(base, missing), TorchRolloutEngine(cfg, lora=SPEC), SyncOptions(adapters=True))
    with pytest.raises(AdapterLoadError, match="did not send 1 tensor"):
        sync.push(1)
    engine = TorchRolloutEngine(cfg, lora=SPEC)
    with pytest.raises(AdapterLoadError, match="shape"):
        engine.load_adapter([(bad, torch.zeros(3, 3))])
    with pytest.raises(AdapterLoadError, match="no adapter"):
        engine.load_adapter([("base_model.model.lm_head.lora_A.weight", torch.zeros(4, 32))])


def test_sync_and_engine_must_agree_on_adapters():
    cfg = llama_config()
    with pytest.raises(ValueError, match="built without adapters"):
        WeightSync(StubActor.__new__(LoraActor), TorchRolloutEngine(cfg), SyncOptions(adapters=True))
    with pytest.raises(ValueError, match="built with adapters"):
        WeightSync(StubActor.__new__(MergedActor), TorchRolloutEngine(cfg, lora=SPEC), SyncOptions())
    with pytest.raises(RuntimeError, match="none was synced"):
        engine = TorchRolloutEngine(cfg, lora=SPEC)
        engine.load_weights(base_model(cfg).state_dict().items())
        engine.generate(prompts(), SamplingParams(max_tokens=2))


def test_rollout_lora_from_the_model_keys():
    model = SimpleNamespace(lora_rank=16, lora_alpha=32.0, target_modules="linear_qkv", exclude_modules=None,
                            lora=SimpleNamespace(merge=False))
    spec = rollout_lora(model)
    assert spec == RolloutLora(16, 32.0, ("q_proj", "k_proj", "v_proj")) and spec.scaling == 2.0
    assert rollout_lora(SimpleNamespace(**{**vars(model), "lora": SimpleNamespace(merge=True)})) is None
    assert rollout_lora(SimpleNamespace(**{**vars(model), "lora_rank": 0})) is None
    assert SyncOptions.from_config(_rollout_cfg(), None, model).adapters
    assert not SyncOptions.from_config(_rollout_cfg(), None, SimpleNamespace(**{**vars(model), "lora_rank": 0})).adapters


def _rollout_cfg():
    from hybridrl.config.schema.rollout import RolloutConfig

    return RolloutConfig()


# ------------------------------------------------------------------------------------------ vLLM's side, on CPU
def test_vllm_engine_arguments_and_base_names():
    from hybridrl.rollout.vllm_lora import _BaseNames, base_layer_name, vllm_lora_kwargs

    kw = vllm_lora_kwargs(RolloutLora(24, 48.0, ("q_proj", "v_proj", "up_proj")))
    assert kw == {"enable_lora": True, "max_loras": 1, "max_cpu_loras": 1, "max_lora_rank": 32,
                  "lora_target_modules": ["gate_up_proj", "qkv_proj"]}
    assert vllm_lora_kwargs(RolloutLora(8, 16.0, ALL))["max_lora_rank"] == 8
    with pytest.raises(ValueError, match="lora.merge=true"):
        vllm_lora_kwargs(RolloutLora(1024, 16.0, ALL))
    wrapped = {"model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj"}
    assert base_layer_name("model.layers.0.self_attn.k_proj.weight", wrapped) == \
        "model.layers.0.self_attn.k_proj.base_layer.weight"
    assert base_layer_name("model.layers.0.mlp.up_proj.weight", wrapped) == "model.layers.0.mlp.up_proj.base_layer.weight"
    for name in ("model.layers.0.mlp.down_proj.weight", "model.layers.1.self_attn.q_proj.weight", "lm_head.weight",
                 "model.layers.0.input_layernorm.weight"):
        assert base_layer_name(name, wrapped) == name
    lin = torch.nn.Module()
    lin.base_layer = torch.nn.Linear(2, 3, bias=False)
    holder = torch.nn.Module()
    holder.qkv_proj = lin
    assert [n for n, _ in _BaseNames(holder).named_parameters()] == ["qkv_proj.weight"]


class FakeLayer:
    """vLLM's LoRA layer buffers: lora_a_stacked[i] [slots, 1, max_rank, in_local], lora_b_stacked[i] [slots, 1,
    out_local, max_rank] per packed member i, filled as its set_lora does (after reset_lora: zeros outside)."""

    def __init__(self, slots: int, max_rank: int, in_local: int, outs_local: list[int], dtype=torch.bfloat16):
        self.lora_a_stacked = tuple(torch.zeros(slots, 1, max_rank, in_local, dtype=dtype) for _ in outs_local)
        self.lora_b_stacked = tuple(torch.zeros(slots, 1, o, max_rank, dtype=dtype) for o in outs_local)

    def set_lora(self, index: int, a: list, b: list) -> None:  # already sliced for this rank, B already scaled
        for i, (ai, bi) in enumerate(zip(a, b)):
            if ai is not None:
                self.lora_a_stacked[i][index, 0, : ai.shape[0], : ai.shape[1]].copy_(ai)
                self.lora_b_stacked[i][index, 0, : bi.shape[0], : bi.shape[1]].copy_(bi)


def _vllm_slices(name: str, t: torch.Tensor, tp: int, rank: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """vLLM 0.26's tp slicing of one member tensor (column layers: B rows, q by rank and k/v by rank //
    num_kv_head_replicas; row layers: A columns; A of column layers and B of row layers whole)."""
    module, which = peft_module(name)
    kind = module.rsplit(".", 1)[-1]
    if which == "A":
        if kind in ("o_proj", "down_proj"):
            n = t.shape[1] // tp
            return t[:, rank * n:(rank + 1) * n]
        return t
    if kind in ("o_proj", "down_proj"):
        return t
    if kind in ("k_proj", "v_proj"):
        replicas = max(1, tp // kv_heads)
        n = max(1, kv_heads // tp) * head_dim
        return t[(rank // replicas) * n:(rank // replicas + 1) * n]
    n = t.shape[0] // tp
    return t[rank * n:(rank + 1) * n]


@pytest.mark.parametrize("tp, kv_heads", [(1, 2), (2, 2), (4, 2)])
def test_slot_places_hold_what_vllm_set_lora_writes(tp, kv_heads):
    """For every tp rank: vLLM's slots filled by its own slicing (written out above) equal, bitwise, what the in-place
    write puts at slot_places' views; the checksum factors add the ranks' sums up to the whole tensor's."""
    from hybridrl.rollout.vllm_lora import adapter_names, slot_places, write_places

    h, f, heads, d, r, max_rank, slot = 16, 24, 4, 4, 4, 8, 1  # slot 1 of 2: not the first one
    scaling = 1.5
    spec_targets = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")  # gate_proj left out
    g = torch.Generator().manual_seed(0)
    shapes = {"q_proj": (heads * d, h), "k_proj": (kv_heads * d, h), "v_proj": (kv_heads * d, h),
              "o_proj": (h, heads * d), "gate_proj": (f, h), "up_proj": (f, h), "down_proj": (h, f)}
    full = {}
    for m in spec_targets:
        out, inp = shapes[m]
        block = "self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
        full[peft_name(f"model.layers.0.{block}.{m}", "A")] = torch.randn(r, inp, generator=g)
        full[peft_name(f"model.layers.0.{block}.{m}", "B")] = torch.randn(out, r, generator=g)
    sums = {n: 0.0 for n in full}
    for rank in range(tp):
        kv_local = max(1, kv_heads // tp) * d
        layers = {"model.layers.0.self_attn.qkv_proj": FakeLayer(2, max_rank, h, [heads * d // tp, kv_local, kv_local]),
                  "model.layers.0.self_attn.o_proj": FakeLayer(2, max_rank, heads * d // tp, [h]),
                  "model.layers.0.mlp.gate_up_proj": FakeLayer(2, max_rank, h, [f // tp, f // tp]),
                  "model.layers.0.mlp.down_proj": FakeLayer(2, max_rank, f // tp, [h])}
        packed = {"model.layers.0.self_attn.qkv_proj": [f"model.layers.0.self_attn.{m}" for m in ("q_proj", "k_proj", "v_proj")],
                  "model.layers.0.mlp.gate_up_proj": ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]}
        manager = SimpleNamespace(modules=layers, packed_modules=packed, lora_index_to_id=[None, 7])
        assert adapter_names(manager, spec_targets) == frozenset(full)
        for path, layer in layers.items():  # what vLLM's activate_adapter -> set_lora leaves in slot 1
            members = packed.get(path, [path])
            a = [full.get(peft_name(m, "A")) for m in members]
            b = [full.get(peft_name(m, "B")) for m in members]
            layer.set_lora(slot, [None if x is None else _vllm_slices(peft_name(m, "A"), x.bfloat16(), tp, rank, kv_heads, d)
                                  for m, x in zip(members, a)],
                           [None if x is None else _vllm_slices(peft_name(m, "B"), x.bfloat16() * scaling, tp, rank,
                                                                kv_heads, d) for m, x in zip(members, b)])
        places = slot_places(manager, {n: tuple(t.shape) for n, t in full.items()}, 7, scaling, tp, rank)
        for name, place in places.items():
            assert place is not None, name
            assert torch.equal(place.dst, place.expected(full[name])), (name, rank)
            sums[name] += float(place.dst.double().sum()) * place.total_factor()
            before = place.dst.clone()
            place.dst.zero_()
            place.write(full[name])  # the in-place update writes the same bits
            assert torch.equal(place.dst, before), (name, rank)
        before = {n: p.dst.clone() for n, p in places.items()}
        for p in places.values():
            p.dst.zero_()
        write_places([(places[n], t) for n, t in full.items()])  # the same, a bucket at a time in foreach kernels
        assert all(torch.equal(places[n].dst, before[n]) for n in full), rank
    for name, t in full.items():
        module, which = peft_module(name)
        held = t.bfloat16() * (scaling if which == "B" else 1)
        assert sums[name] == pytest.approx(float(held.double().sum()), rel=1e-9, abs=1e-9), name


H, F, HEADS, KV, D, R = 16, 24, 4, 2, 4, 4
SHAPES = {"q_proj": (HEADS * D, H), "k_proj": (KV * D, H), "v_proj": (KV * D, H), "o_proj": (H, HEADS * D),
          "gate_proj": (F, H), "up_proj": (F, H), "down_proj": (H, F)}


def standin_vllm_engine(monkeypatch, spec: RolloutLora):
    """VLLMLoraEngine (tp 1) on a stand-in for vllm.LLM: one layer's LoRA slots (FakeLayer), and `register` standing
    in for vLLM's loader as vLLM's does it (bf16 cast, B *= scaling, set_lora into the first free slot). Returns the
    engine and the list of ids the loader registered."""
    from hybridrl.rollout import vllm_lora

    layers = {"model.layers.0.self_attn.qkv_proj": FakeLayer(1, 8, H, [HEADS * D, KV * D, KV * D]),
              "model.layers.0.self_attn.o_proj": FakeLayer(1, 8, HEADS * D, [H]),
              "model.layers.0.mlp.gate_up_proj": FakeLayer(1, 8, H, [F, F]),
              "model.layers.0.mlp.down_proj": FakeLayer(1, 8, F, [H])}
    packed = {"model.layers.0.self_attn.qkv_proj": [f"model.layers.0.self_attn.{m}" for m in ("q_proj", "k_proj", "v_proj")],
              "model.layers.0.mlp.gate_up_proj": ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]}
    manager = SimpleNamespace(modules=layers, packed_modules=packed, lora_index_to_id=[None],
                              lora_config=SimpleNamespace(lora_dtype=torch.bfloat16))
    registered = []

    def register(mgr, tensors, lora, lora_id):
        registered.append(lora_id)
        mgr.lora_index_to_id[0] = lora_id
        for path, layer in mgr.modules.items():
            members = mgr.packed_modules.get(path, [path])
            held = {n: t.to(torch.bfloat16) for n, t in tensors.items()}
            layer.set_lora(0, [held[peft_name(m, "A")] for m in members],
                           [held[peft_name(m, "B")] * lora.scaling for m in members])

    monkeypatch.setattr(vllm_lora, "register", register)
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda **kw: SimpleNamespace(**kw)
    for parent in ("vllm", "vllm.lora"):  # on CPU there is no vLLM: the import below needs its packages
        monkeypatch.setitem(sys.modules, parent, sys.modules.get(parent) or types.ModuleType(parent))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)
    engine = vllm_lora.VLLMLoraEngine.__new__(vllm_lora.VLLMLoraEngine)
    engine.llm = SimpleNamespace(apply_model=lambda fn: [fn(SimpleNamespace(lora_manager=manager))])
    engine.tp_size, engine.lora, engine.checksum_rtol = 1, spec, 1e-6
    engine._names = vllm_lora.adapter_names(manager, spec.targets)
    engine._dtype, engine._shapes, engine._pending, engine._written = torch.bfloat16, {}, {}, set()
    engine._places, engine._in_place, engine._version = None, False, None
    monkeypatch.setattr(vllm_lora.VLLMLoraEngine, "_tp_rank", lambda self: 0)
    return engine, registered


def adapter_version(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for m, (o, i) in SHAPES.items():
        block = "self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
        out[peft_name(f"model.layers.0.{block}.{m}", "A")] = torch.randn(R, i, generator=g)
        out[peft_name(f"model.layers.0.{block}.{m}", "B")] = torch.randn(o, R, generator=g)
    return out


class BucketActor(StubActor):
    """Exports `items` in two buckets (the first five tensors, the rest)."""

    items: list = []

    def export_weights(self, bucket_bytes, names=None):
        raise AssertionError("an adapter-only sync exports no base")

    def export_adapter_weights(self, bucket_bytes):
        yield self.items[:5]
        yield self.items[5:]


def test_vllm_lora_engine_loads_once_through_vllm_then_writes_in_place(monkeypatch):
    """VLLMLoraEngine's adapter flow on a stand-in for vllm.LLM (tp 1): the first version goes through vLLM's loader
    (here `register` stood in by what vLLM's does: bf16 cast, B *= scaling, set_lora into the first free slot), the
    slots prove, and the next versions are written in place (the loader not called again); the engine's slot sums
    pass WeightSync's checks against the sender's sums of adapter_as_held (adapter_sync.py: taken a bucket at a time
    in a few kernels, the engine's tolerance being nonzero); a missing tensor is named."""
    from hybridrl.hybrid.adapter_sync import check_adapters, stream_adapters
    from hybridrl.hybrid.checks import SentChecksums
    from hybridrl.rollout import vllm_lora

    engine, registered = standin_vllm_engine(monkeypatch, RolloutLora(R, 6.0, ALL))
    actor = BucketActor()
    for v in (1, 2, 3):
        tensors = adapter_version(v)
        sent = SentChecksums(v, 1.0)
        actor.items = items = list(tensors.items())
        metrics = stream_adapters(actor, engine, 1 << 20, v, sent)
        assert metrics["reshard/adapter_tensors"] == len(tensors) and metrics["reshard/adapter_buckets"] == 2
        assert engine._in_place and registered == [vllm_lora.ADAPTER_ID]  # loaded by vLLM once, then in place
        assert engine._request_kwargs()["lora_request"].lora_name == f"hybridrl-v{v}"
        checked = check_adapters(engine, sent)
        assert checked["sync_check/adapter_tensors_checked"] == len(tensors)
        for name, t in tensors.items():  # the slot holds exactly what vLLM's loader would have put there
            place = engine._places[name]
            assert torch.equal(place.dst, place.expected(t)), (v, name)
    wrong = next(n for n in tensors if n.endswith("v_proj.lora_B.weight"))
    engine._places[wrong].dst[0, 0] += 1  # one slot value off: the batched sums still name it
    with pytest.raises(WeightSyncError, match="v_proj.lora_B"):
        check_adapters(engine, sent)
    engine.load_adapter(items[:5])
    with pytest.raises(AdapterLoadError, match=f"did not send {len(items) - 5} tensor"):
        engine.finish_adapter_sync(4)


@pytest.mark.parametrize("fault", ["stale", "misplaced"])
def test_vllm_in_place_write_that_is_stale_or_misplaced_is_named(monkeypatch, fault):
    """After the slots proved (v1, v2 in place), v3's in-place write goes wrong inside the engine while every name
    still counts as written: one slot keeps v2's values (stale), or q_proj's and k_proj's A (same shape) land in each
    other's slots (misplaced). The sender's batched sums against the engine's slot sums name the tensor."""
    from hybridrl.hybrid.adapter_sync import check_adapters, stream_adapters
    from hybridrl.hybrid.checks import SentChecksums
    from hybridrl.rollout import vllm_lora

    engine, _ = standin_vllm_engine(monkeypatch, RolloutLora(R, 6.0, ALL))
    actor = BucketActor()
    for v in (1, 2):
        actor.items = list(adapter_version(v).items())
        sent = SentChecksums(v, 1.0)
        stream_adapters(actor, engine, 1 << 20, v, sent)
        check_adapters(engine, sent)
    q, k = (peft_name(f"model.layers.0.self_attn.{m}", "A") for m in ("q_proj", "k_proj"))
    stale = peft_name("model.layers.0.mlp.up_proj", "B")
    write = vllm_lora.write_places

    def faulty(pairs):
        if fault == "stale":
            pairs = [(p, t) for p, t in pairs if p is not engine._places[stale]]
        else:
            swap = {id(engine._places[q]): engine._places[k], id(engine._places[k]): engine._places[q]}
            pairs = [(swap.get(id(p), p), t) for p, t in pairs]
        write(pairs)

    monkeypatch.setattr(vllm_lora, "write_places", faulty)
    actor.items = list(adapter_version(3).items())
    sent = SentChecksums(3, 1.0)
    stream_adapters(actor, engine, 1 << 20, 3, sent)  # finish_adapter_sync passes: every name was "written"
    with pytest.raises(WeightSyncError, match="up_proj.lora_B" if fault == "stale" else "(q|k)_proj.lora_A"):
        check_adapters(engine, sent)


def test_vllm_adapters_as_held_is_adapter_as_held_bitwise(monkeypatch):
    """The sender's view of a bucket as vLLM holds it, taken at once (a cast, one _foreach_mul for B), equals
    adapter_as_held one tensor at a time bitwise: fp32 sent into bf16 slots at scaling 1.5; at scaling 1 with the
    LoRA dtype sent, the very tensors come back (nothing computed)."""
    engine, _ = standin_vllm_engine(monkeypatch, RolloutLora(R, 6.0, ALL))
    bucket = list(adapter_version(1).items())
    held = engine.adapters_as_held(bucket)
    assert [n for n, _ in held] == [n for n, _ in bucket]
    for (name, t), (_, h) in zip(bucket, held):
        one = engine.adapter_as_held(name, t)
        assert h.dtype == torch.bfloat16 and torch.equal(h, one), name
        if name.endswith("lora_B.weight"):  # scaled: not merely the cast
            assert not torch.equal(h, t.to(torch.bfloat16)), name
    engine.lora = RolloutLora(R, float(R), ALL)  # scaling 1
    sent = [(n, t.to(torch.bfloat16)) for n, t in bucket]
    assert all(h is t for (_, t), (_, h) in zip(sent, engine.adapters_as_held(sent)))


def test_adapter_sync_names_an_adapter_sent_twice(monkeypatch):
    """A name exported twice in one sync, inside a bucket or in two, fails the sync naming it."""
    from hybridrl.hybrid.adapter_sync import stream_adapters
    from hybridrl.hybrid.checks import SentChecksums

    engine, _ = standin_vllm_engine(monkeypatch, RolloutLora(R, 6.0, ALL))
    items = list(adapter_version(1).items())
    actor = BucketActor()
    actor.items = items[:3] + [items[1]] + items[3:]  # twice in the first bucket
    with pytest.raises(WeightSyncError, match=f"{items[1][0]!r} twice"):
        stream_adapters(actor, engine, 1 << 20, 1, SentChecksums(1, 1.0))
    actor.items = items + [items[2]]  # in the first bucket and again in the second
    with pytest.raises(WeightSyncError, match=f"{items[2][0]!r} twice"):
        stream_adapters(actor, engine, 1 << 20, 1, SentChecksums(1, 1.0))
