"""A bf16 actor's fp32 master weights start from a float32 checkpoint's own values, not their bf16 rounding.

Why: megatron copies its master weights from the model params, so they used to start on the bf16 grid. A bf16
weight then stays put until the Adam steps add up to half a bf16 step: for SmolLM2's median weight about 49
steps of lr 1e-5, and hybridrl's GRPO on that model climbed about 2x slower than verl's FSDP actor, which keeps
the float32 values (benchmarks/results/peer_verl.md). One torchrun process on CPU with bf16 params
(master_init_run.py); a float32 and a bf16 copy of the tiny Qwen2 (tied embeddings, vocab padding).
"""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def result(one_rank_megatron):
    """master_init_run.py's rank0.json (tests/dist/conftest.py: one torchrun process with the other one-rank drivers)."""
    return one_rank_megatron["master_init"]


def test_master_weights_hold_the_float32_checkpoint(result):
    r = result["float32"]
    assert r["ckpt_on_bf16_grid"] < 0.05, r  # the checkpoint really has values bf16 cannot hold
    assert r["ckpt_sorted_equal"], f"the fp32 main params are not the checkpoint's values: {r}"
    assert r["embedding_max_diff"] == 0.0, r
    assert r["model_is_rounding"], f"a bf16 param is not its main param rounded: {r}"


def test_one_update_moves_the_masters_by_about_lr_from_the_checkpoint(result):
    """Two Adam steps move a master weight at most a few lr; from the rounded start the distance to the
    checkpoint was the rounding error, hundreds of lr for this model's largest weights."""
    r = result["float32"]
    assert 0.5 < r["moved_max_over_lr"] < 4, r
    assert r["ckpt_max_diff_after_over_lr"] <= r["moved_max_over_lr"] + 1e-6, r


def test_a_bf16_checkpoint_loads_as_before(result):
    r = result["bfloat16"]
    assert r["ckpt_on_bf16_grid"] == 1.0 and r["ckpt_sorted_equal"] and r["model_is_rounding"], r
    # the float32 start moves more bf16 weights in the same update: they no longer wait for half a bf16 step
    assert result["float32"]["bf16_changed"] > 1.2 * r["bf16_changed"], (result["float32"], r)
