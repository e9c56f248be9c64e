"""Where a megatron update's time goes (adapters/megatron/phases.py, MegatronRole._phase_metrics), the per-micro-batch
metrics brought to the host at once instead of one synchronization per value (role.host_sums, the actor's and
critic's loss functions), and the overlap budget backing off after a forward/backward that retried allocations.

The loss functions run on the `meta` device: any float()/item()/tolist() of a device tensor raises there, so a loss
that still synchronizes per micro-batch fails these tests; the same functions on host tensors give the numbers the
old per-value float() computed."""
from __future__ import annotations

import logging
import os
import sys
import types

import pytest
import torch

from hybridrl.adapters.megatron import actor as actor_mod
from hybridrl.adapters.megatron import critic as critic_mod
from hybridrl.adapters.megatron import overlap
from hybridrl.adapters.megatron.actor import MegatronActor
from hybridrl.adapters.megatron.critic import MegatronCritic
from hybridrl.adapters.megatron.forward import TokenStats
from hybridrl.adapters.megatron.phases import Phases
from hybridrl.adapters.megatron.role import MegatronRole, host_sums
from hybridrl.algos import ActorObjective, GlobalBatch
from hybridrl.config.schema.actor import ActorConfig
from hybridrl.protocol import DataProto

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import update_split  # noqa: E402

GiB = 1 << 30


class _Ticks:
    """A clock and allocator counters the test moves by hand."""

    def __init__(self) -> None:
        self.t, self.c = 100.0, {"alloc_retries": 5, "cuda_mallocs": 10, "cuda_frees": 0}

    def clock(self) -> float:
        return self.t

    def counts(self) -> dict[str, int]:
        return dict(self.c)


def test_phases_add_up_per_name_and_to_the_whole():
    ticks = _Ticks()
    phases = Phases(counts=ticks.counts, clock=ticks.clock)
    ticks.t += 2.0
    ticks.c["cuda_mallocs"] += 3
    assert phases.mark("micro_batches") == 2.0
    ticks.t += 5.0
    ticks.c["alloc_retries"] += 2
    ticks.c["cuda_frees"] += 7
    phases.mark("forward_backward")
    ticks.t += 1.0  # a second mini-batch: the same names again
    phases.mark("micro_batches")
    ticks.t += 4.0
    ticks.c["alloc_retries"] += 1
    phases.mark("forward_backward")
    assert phases.seconds == {"micro_batches": 3.0, "forward_backward": 9.0}
    assert phases.elapsed() == 12.0
    assert phases.counts["forward_backward"] == {"alloc_retries": 3, "cuda_mallocs": 0, "cuda_frees": 7}
    assert phases.counts["micro_batches"] == {"alloc_retries": 0, "cuda_mallocs": 3, "cuda_frees": 0}
    assert phases.count("alloc_retries", ("forward_backward", "not_run")) == 3


def test_without_cuda_the_phases_count_nothing():
    phases = Phases()
    phases.mark("forward_backward")
    assert phases.counts == {"forward_backward": {}} and phases.seconds["forward_backward"] >= 0


def _role_metrics(counts: bool) -> dict[str, float]:
    ticks = _Ticks()
    phases = Phases(counts=ticks.counts if counts else dict, clock=ticks.clock)
    for name, s in (("micro_batches", 0.5), ("onload_begin", 0.25), ("stream_wait", 0.14), ("forward_backward", 10.0),
                    ("onload_wait", 1.5), ("optimizer_step", 0.1), ("metrics", 0.01)):
        ticks.t += s
        if name == "forward_backward":
            ticks.c["alloc_retries"] += 4
        if name == "onload_wait":
            ticks.c["cuda_mallocs"] += 9
        phases.mark(name)
    return MegatronRole._phase_metrics(types.SimpleNamespace(role="actor"), phases)


def test_the_update_metrics_split_the_whole_call():
    m = _role_metrics(counts=True)
    names = update_split.PHASES
    assert abs(sum(m[f"timing_s/actor_{p}"] for p in names) - m["timing_s/actor_update"]) < 1e-9
    assert m["timing_s/actor_update"] == pytest.approx(12.5)
    assert m["memory/actor_alloc_retries_forward_backward"] == 4.0
    assert m["memory/actor_cuda_mallocs_after_backward"] == 9.0 and m["memory/actor_cuda_mallocs_before_forward"] == 0
    assert not any(k.startswith("memory/") for k in _role_metrics(counts=False))  # CPU: no allocator to count


def test_the_bench_reads_the_split_back():
    metrics = _role_metrics(counts=True)
    split = update_split.per_update(metrics, seconds=16.0, drain=3.0)
    assert split["update_outside_role_seconds"] == pytest.approx(3.5)
    assert split["phase_forward_backward_seconds"] == 10.0 and split["alloc_retries_forward_backward"] == 4.0
    m = {**update_split.mean([split, split]), "update_seconds": 16.0, "peak_memory_gib": 120.0,
         "peak_reserved_gib": 130.0}
    text = "\n".join(update_split.describe(m))
    assert "3.50 s outside it, of which 3.00 s waiting for other streams" in text
    assert "alloc_retries 0/4/0" in text and "cuda_mallocs 0/0/9" in text
    assert update_split.describe({"update_seconds": 1.0}) == []  # a result from before the split


def _per_micro():
    g = torch.Generator().manual_seed(3)
    per_micro = []
    for i in range(5):
        m = {"actor/pg_loss": torch.randn((), generator=g), "actor/pg_clipfrac": float(torch.rand((), generator=g))}
        if i != 2:  # a metric some micro-batches lack
            m["actor/ppo_kl"] = torch.randn((), generator=g, dtype=torch.float64)
        per_micro.append(m)
    return per_micro


def test_host_sums_are_the_per_value_sums_with_one_copy(monkeypatch):
    per_micro, names = _per_micro(), ["actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/absent"]
    want = [sum(float(m[n]) for m in per_micro if n in m) for n in names]  # what _rank_metrics summed before
    copies = []
    real_tolist = torch.Tensor.tolist

    def counted(self):
        copies.append(self.numel())
        return real_tolist(self)

    def no_sync(self, *a):
        raise AssertionError("a per-value host synchronization")

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    monkeypatch.setattr(torch.Tensor, "item", no_sync)
    monkeypatch.setattr(torch.Tensor, "__float__", no_sync)
    assert host_sums(per_micro, names) == want  # bitwise: float64, micro-batch order
    assert copies == [9]  # 5 pg_loss + 4 ppo_kl: one transfer; the floats need none


def _mini(n: int = 6, r: int = 5) -> DataProto:
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(n, r, generator=g) > 0.3).float()
    mask[:, 0] = 1
    return DataProto.from_dict({
        "response_mask": mask, "old_log_probs": -torch.rand(n, r, generator=g), "advantages": torch.randn(n, r, generator=g),
        "values": torch.randn(n, r, generator=g), "returns": torch.randn(n, r, generator=g)})


def _micro(mini: DataProto, rows: list[int], device: str, keys: list[str]):
    idx = torch.tensor(rows)
    return types.SimpleNamespace(rows=idx, extras={k: mini.batch[k][idx].to(device) for k in keys})


def _actor_loss(monkeypatch, mini: DataProto):
    cfg = ActorConfig(ppo_mini_batch_size=len(mini), ppo_micro_batch_size_per_gpu=2, loss_agg_mode="token-mean")
    tokens = float(mini.batch["response_mask"].sum())
    monkeypatch.setattr(actor_mod, "global_batch", lambda m, scale=None: GlobalBatch(1, tokens, float(len(m)), scale))
    # the model's output stands for the log-probs (response_log_probs needs megatron's tensor-parallel groups)
    monkeypatch.setattr(actor_mod, "response_log_probs",
                        lambda out, mb, *a, **k: TokenStats(out, out * 0 + 0.5, None))
    role = types.SimpleNamespace(objective=ActorObjective.from_config(cfg), cfg=cfg,
                                 arch=types.SimpleNamespace(vocab_size=7))
    return MegatronActor._loss_fn(role, mini, 1.0), role.objective, tokens


def test_the_actor_loss_never_synchronizes_per_micro_batch(monkeypatch):
    mini = _mini()
    loss_fn, objective, tokens = _actor_loss(monkeypatch, mini)
    keys = objective.input_keys()
    # on the meta device any host conversion of a device tensor raises
    mb = _micro(mini, [1, 4], "meta", keys)
    loss, metrics = loss_fn(-torch.rand(2, 5, device="meta"), mb)
    assert loss.device.type == "meta" and set(metrics) >= set(objective.total_names() + objective.mean_names())
    # on host tensors: the numbers the per-value float() gave (the micro-batch's token share from its own mask)
    mb = _micro(mini, [1, 4], "cpu", keys)
    logp = -torch.rand(2, 5, generator=torch.Generator().manual_seed(2))
    _, metrics = loss_fn(logp, mb)
    result = objective(logp, logp * 0 + 0.5, mb.extras, GlobalBatch(1, tokens, float(len(mini))))
    w_tok = float(mb.extras["response_mask"].sum()) / tokens
    for k, v in result.means.items():
        assert float(metrics[k]) == float(v) * w_tok, k


def test_the_critic_loss_never_synchronizes_per_micro_batch(monkeypatch):
    mini = _mini()
    tokens = float(mini.batch["response_mask"].sum())
    monkeypatch.setattr(critic_mod, "global_batch", lambda m, scale=None: GlobalBatch(1, tokens, float(len(m)), scale))
    monkeypatch.setattr(critic_mod, "response_values", lambda out, mb: out)
    role = types.SimpleNamespace(cfg=types.SimpleNamespace(loss_agg_mode="token-mean", loss_scale_factor=None,
                                                           cliprange_value=0.2))
    loss_fn = MegatronCritic._loss_fn(role, mini)
    keys = ["response_mask", "values", "returns"]
    loss, metrics = loss_fn(torch.randn(2, 5, device="meta"), _micro(mini, [0, 3], "meta", keys))
    assert loss.device.type == "meta"
    mb = _micro(mini, [0, 3], "cpu", keys)
    vpreds = mb.extras["values"] + 0.5
    _, metrics = loss_fn(vpreds, mb)
    vf = critic_mod.value_loss(vpreds, mb.extras["returns"], mb.extras["values"], mb.extras["response_mask"], 0.2,
                               "token-mean", **GlobalBatch(1, tokens, float(len(mini))))
    assert float(metrics["critic/vf_clipfrac"]) == float(vf.vf_clipfrac * float(mb.extras["response_mask"].sum()) / tokens)


def test_a_budget_backs_off_after_retries_beside_an_overlapped_onload():
    budget = overlap.OverlapBudget(reserve=10 * GiB, free=lambda: 100 * GiB)
    assert budget.allowed() == 90 * GiB
    assert budget.observe(sent=0, retries=3) == 0 and budget.observe(sent=40 * GiB, retries=0) == 0
    assert budget.observe(sent=40 * GiB, retries=1) == 10 * GiB  # a quarter of what came back early
    assert budget.allowed() == 80 * GiB
    assert budget.observe(sent=4 * GiB, retries=2) == overlap.BACKOFF_MIN_BYTES
    assert budget.allowed() == 78 * GiB
    assert overlap.OverlapBudget(reserve=0, free=lambda: GiB, backoff=2 * GiB).allowed() == 0


def _phases_with(part: str, retries: int) -> Phases:
    ticks = _Ticks()
    phases = Phases(counts=ticks.counts, clock=ticks.clock)
    for name in ("micro_batches", "forward_backward", "onload_wait"):
        if name == part:
            ticks.c["alloc_retries"] += retries
        phases.mark(name)
    return phases


@pytest.mark.parametrize("part, retries, backs_off", [("forward_backward", 2, True), ("onload_wait", 5, False),
                                                      ("forward_backward", 0, False)])
def test_the_role_learns_from_its_forward_backward_only(part, retries, backs_off, caplog):
    """Retries while the rest of the state comes back (serial, after the backward) cost no overlap: only the
    forward/backward's count the budget."""
    budget = overlap.OverlapBudget(reserve=0, free=lambda: 64 * GiB)
    role = types.SimpleNamespace(role="actor", _onload_budget=budget,
                                 _onload=overlap.Moved(nbytes=48 * GiB, overlapped_bytes=32 * GiB))
    with caplog.at_level(logging.WARNING):
        MegatronRole._learn_onload_budget(role, _phases_with(part, retries))
    assert budget.backoff == (8 * GiB if backs_off else 0)
    assert ("retried 2 allocations" in caplog.text) == backs_off
    serial = types.SimpleNamespace(role="actor", _onload_budget=None, _onload=role._onload)
    MegatronRole._learn_onload_budget(serial, _phases_with("forward_backward", 3))  # nothing to learn
