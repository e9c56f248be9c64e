"""The memory knobs the one-GPU scale runs use (benchmarks/runs.py's scale_SHAPE rows), on CPU in one torchrun process:
full activation recompute and grad_reduce_in_fp32=false give the plain actor's two PPO updates and log-probs
(knobs_run.py). Both used to fail before the first update: recompute asked torch.cuda for an RNG state, and the
DDP override collided with the adapter's own grad_reduce_in_fp32 keyword."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

REL_TOL = 1e-5  # float32 on CPU: recompute runs the same kernels again on the same inputs
KEYS = ["actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy", "actor/ppo_kl"]


@pytest.fixture(scope="module")
def result(one_rank_megatron):
    """knobs_run.py's rank0.json (tests/dist/conftest.py: one torchrun process with the other one-rank drivers)."""
    return one_rank_megatron["knobs"]


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b), 1e-8)


@pytest.mark.parametrize("knob", ["recompute", "bf16_grads"])
def test_knob_reproduces_the_plain_updates(result, knob):
    plain, run = result["plain"], result[knob]
    assert plain["steps"][0]["actor/grad_norm"] > 0 and plain["steps"][1]["actor/pg_loss"] != plain["steps"][0]["actor/pg_loss"]
    for step, (want, got) in enumerate(zip(plain["steps"], run["steps"])):
        for key in KEYS:
            assert _close(want[key], got[key]), f"{knob} update {step + 1} {key}: {got[key]} vs plain {want[key]}"
    diff = max(abs(a - b) for ra, rb in zip(plain["log_probs_after"], run["log_probs_after"]) for a, b in zip(ra, rb))
    assert diff < 1e-5, f"{knob}: log-probs after two updates differ from the plain actor's by {diff}"


def test_knobs_reach_megatron(result):
    assert result["plain"]["recompute_granularity"] is None and result["recompute"]["recompute_granularity"] == "full"
    assert result["plain"]["grad_reduce_in_fp32"] is True and result["bf16_grads"]["grad_reduce_in_fp32"] is False


def test_the_plan_counts_what_megatrons_mlp_keeps(result):
    """The plan's MLP activations (hybridrl/plan/memory.py) against the bytes megatron's MLP saves for its backward:
    fc1's input (counted with the norms in the plan's 4h) plus what mlp_kept_per_token says per unit of width."""
    from hybridrl.plan.memory import mlp_kept_per_token

    m = result["mlp_saved"]
    want = m["tokens"] * m["dtype_bytes"] * (m["hidden"] + mlp_kept_per_token(m["gated"]) * m["ffn"])
    assert m["gated"] and m["bytes"] == want, m
