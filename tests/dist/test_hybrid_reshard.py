"""3D-HybridEngine over gloo: weights of a tiny random Llama (untied) and Qwen2 (tied, qkv bias) go
HF safetensors -> MegatronActor (tp, pp) = (2,1), (1,2), (2,2) on 4 ranks -> WeightSync -> torch
rollout engine for tp_g = 1 and 2; a tiny Qwen3-MoE (8 experts, top-2) the same way from (tp, ep) = (1, 2)
and (2, 2), its experts gathered over etp and ep ranks into the engine's fused expert weights. One
torchrun launch (hybrid_helpers/reshard_run.py, run by hybrid_run.py together with test_cross_copy.py's driver:
tests/dist/conftest.py); every rank reports, the test checks:
  * every streamed tensor equals the HF tensor bitwise; nothing missing, nothing twice; at the second
    sync every weight is copied directly (proven at the first): this rank's pieces in place, the others from
    the ranks that hold them (the cross-GPU copy, tests/dist/test_cross_copy.py checks it in depth);
  * the rollout log-probs equal the Megatron actor's teacher-forced log-probs (fp32, < 1e-5), also
    after a PPO update and a re-sync (the engine follows the trained weights);
  * the plan's placement agrees with megatron's parallel_state; replicas are consecutive tp_g ranks;
  * the ranks of a replica generate identical tokens, equal to an engine loaded from the safetensors.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3MoeConfig

WORLD = 4
TIMEOUT_S = 240

pytestmark = pytest.mark.dist


def save_tiny(folder: Path, cfg) -> str:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # random norms and biases, so a swapped norm or bias would show
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder)


def tiny_models(root: Path) -> list[str]:
    common = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, eos_token_id=1, pad_token_id=0,
                  initializer_range=0.1)
    return [
        save_tiny(root / "llama", LlamaConfig(tie_word_embeddings=False, **common)),
        save_tiny(root / "qwen2", Qwen2Config(tie_word_embeddings=True, use_sliding_window=False, **common)),
        save_tiny(root / "qwen3_moe", Qwen3MoeConfig(tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                                                     moe_intermediate_size=48, norm_topk_prob=True, **common)),
    ]
RUNS_PER_RANK = (2 * 3 + 2) * 3  # (dense models x layouts + MoE layouts) x (tp_g 1, tp_g 2, tp_g 2 after an update)


@pytest.fixture(scope="module")
def reports(hybrid_reports) -> list[list[dict]]:
    """reshard_run.py's per-rank reports over tiny_models' folders (tests/dist/conftest.py runs it in one torchrun
    launch with test_cross_copy.py's driver)."""
    return hybrid_reports["reshard"]


def where(r: dict) -> str:
    return (f"{r['model']} tp={r['tp']} pp={r['pp']} ep={r['ep']} dp={r['dp']} tp_g={r['tp_g']} "
            f"after_update={r.get('after_update', False)}")


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_streamed_tensors_equal_hf_bitwise(reports):
    runs = [r for rank in reports for r in rank]
    assert len(runs) == WORLD * RUNS_PER_RANK
    for r in runs:
        assert r["missing"] == [] and r["duplicates"] == 0, where(r)
        assert r["metrics"]["sync_check/max_rel_diff"] == 0.0, where(r)  # engine == sent, bitwise checksums
        if r.get("after_update"):
            # the second sync of this WeightSync: every weight was proven at the first and is now copied directly,
            # this rank's pieces in place and the rest (the tp peer's halves, the other stage's layers, the other
            # ep rank's experts: the torch engine holds the full model) from the ranks that hold them
            m = r["metrics"]
            tied = {"lm_head.weight"} if r["model"] == "qwen2" else set()
            assert r["streamed"] == 0 and m["reshard/buckets"] == 0, where(r)
            assert r["direct"] == sorted(set(r["reference_names"]) - tied), where(r)
            assert 0 < m["reshard/remote_bytes"] < m["reshard/direct_bytes"] == m["reshard/bytes"], where(r)
        else:  # a proof sync: everything streams through the export
            assert r["direct"] == [] and r["metrics"]["reshard/buckets"] > 1, where(r)
            # the export closes a bucket once it reaches the limit: at most one mapping entry over it
            # (the largest entry here: fc1 = gate + up, 2 x 96 x 64 fp32)
            assert r["metrics"]["reshard/max_bucket_bytes"] < r["bucket_bytes"] + 2 * 96 * 64 * 4, where(r)
        if r.get("after_update"):
            # the update changed every tensor and the engine got the trained values, not the file's
            assert r["update_applied"] == 1.0 and len(r["mismatches"]) == r["streamed"], where(r)
            assert not r["engine_equals_hf"], where(r)
        else:
            assert r["mismatches"] == [], where(r)
            assert r["engine_equals_hf"] and r["same_as_hf_engine"], where(r)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_rollout_log_probs_equal_the_megatron_actors(reports):
    runs = [r for rank in reports for r in rank]
    worst = max(r["gap"]["rollout_vs_actor/logprob_abs_diff_max"] for r in runs)
    mean = max(r["gap"]["rollout_vs_actor/logprob_abs_diff_mean"] for r in runs)
    print(f"rollout vs megatron actor log-prob |diff|: max {worst:.2e}, largest per-step mean {mean:.2e}")
    for r in runs:
        assert r["gap"]["rollout_vs_actor/logprob_abs_diff_max"] < 1e-5, where(r)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_plan_matches_megatron_and_replicas_agree(reports):
    for rank, runs in enumerate(reports):
        for r in runs:
            assert r["placement_errors"] == [], where(r)
            assert r["replica"] == rank // r["tp_g"], where(r)
            assert r["replica_ranks"] == list(range(r["replica"] * r["tp_g"], (r["replica"] + 1) * r["tp_g"])), where(r)
            by_rank = r["responses_by_rank"]
            for peer in r["replica_ranks"]:
                assert by_rank[peer] == by_rank[rank], where(r)
            others = [by_rank[p] for p in range(WORLD) if p // r["tp_g"] != r["replica"]]
            assert all(o != by_rank[rank] for o in others), where(r)  # other replicas had other prompts
