"""The cross-GPU direct copy (hybridrl.hybrid.remote) over gloo: a tiny random Qwen2 (tied embeddings, qkv bias)
goes HF safetensors -> MegatronActor on 4 ranks in tp2 x dp2 (rollout tp_g1 x dp_g4), pp2 x dp2 (tp_g2 and
tp_g1) and tp2 x pp2 (tp_g2) -> WeightSync -> the torch rollout engine, which holds the full model on every rank,
so every layout needs pieces that other ranks hold. One torchrun launch (tests/dist/hybrid_helpers/cross_run.py, run by
hybrid_run.py together with test_hybrid_reshard.py's driver: tests/dist/conftest.py);
after a PPO update the second sync of each WeightSync must:
  * leave the engine's weights bitwise equal to the actor's bucketed export of the trained weights (full HF
    tensors through the tp all-gathers and pp broadcasts: a path the cross copy does not use);
  * have taken the cross-GPU path for every weight (no export bucket, bytes received from other ranks, staging
    bounded by the bucket size) and passed its sampled checks;
  * give rollout log-probs equal to the actor's (fp32, < 1e-5);
and a remote piece corrupted after it landed must be named by the check on that rank; with
direct_weight_copy=false every weight streams through the export again.
"""
from __future__ import annotations

import pytest

TIMEOUT_S = 180
BUCKET_BYTES = 48 * 1024  # cross_run.BUCKET_BYTES
# (tp, pp, tp_g, zero copy), as cross_run.LAYOUTS runs them
ROWS = [(2, 1, 1, True), (2, 1, 1, False), (1, 2, 2, True), (1, 2, 1, False), (2, 2, 2, True)]

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def reports(hybrid_reports) -> list[list[dict]]:
    """cross_run.py's per-rank reports on a tiny random Qwen2 (tied embeddings, qkv bias; tests/dist/conftest.py runs
    it in one torchrun launch with test_hybrid_reshard.py's driver, on that test's Qwen2 folder)."""
    return hybrid_reports["cross"]


def where(rank: int, r: dict) -> str:
    how = "view to view" if r["zero_copy"] else "staged"
    return f"rank {rank}: tp={r['tp']} pp={r['pp']} dp={r['dp']} -> tp_g={r['tp_g']} ({how})"


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_after_an_update_the_engine_equals_the_export_bitwise_through_the_cross_gpu_copy(reports):
    for rank, runs in enumerate(reports):
        assert [(r["tp"], r["pp"], r["tp_g"], r["zero_copy"]) for r in runs] == ROWS
        for r in runs:
            m = r["metrics"]
            assert r["update_applied"] == 1.0, where(rank, r)
            assert r["reference_tensors"] == 26 and r["mismatches"] == [], where(rank, r)  # every weight, bitwise
            # nothing streamed: the local pieces and the pieces from other ranks wrote every weight
            assert m["reshard/buckets"] == 0 and m["reshard/direct_bytes"] == m["reshard/bytes"], where(rank, r)
            assert m["reshard/bytes"] == r["first_metrics"]["reshard/bytes"], where(rank, r)  # the whole model
            # this rank received what it does not hold: at tp2 about half of each split weight, under pp2 the other
            # stage's layers; never the whole model, never nothing
            assert 0.3 * m["reshard/bytes"] < m["reshard/remote_bytes"] < 0.85 * m["reshard/bytes"], where(rank, r)
            assert r["first_metrics"]["reshard/remote_bytes"] == 0, where(rank, r)  # the proof sync streams
            if r["zero_copy"]:
                # fp32 on both ends, contiguous views: most pieces go from the actor's storage into the engine's;
                # whatever remains is staged within the bucket
                assert 0.5 * m["reshard/remote_bytes"] <= m["reshard/remote_zero_copy_bytes"], where(rank, r)
                assert m["reshard/remote_zero_copy_bytes"] <= m["reshard/remote_bytes"], where(rank, r)
                assert m["reshard/remote_staging_bytes"] <= 2 * BUCKET_BYTES, where(rank, r)
            else:
                # two staging buffers take turns (a round's copies overlap the other's messages), each within the
                # bucket (half of it a round, unless one piece alone is larger); three rounds or more, so a buffer
                # is reused after its round landed
                assert m["reshard/remote_zero_copy_bytes"] == 0, where(rank, r)
                assert 0 < m["reshard/remote_staging_bytes"] <= 2 * BUCKET_BYTES, where(rank, r)
                assert m["reshard/remote_rounds"] >= 3, where(rank, r)
            assert m["sync_check/remote_checked"] > 0 and m["sync_check/direct_checked"] > 0, where(rank, r)
            assert m["sync_check/tensors_checked"] == 0, where(rank, r)  # nothing went through the export's check
            assert r["remote_names"], where(rank, r)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_rollout_log_probs_equal_the_actors_after_the_cross_gpu_copy(reports):
    for rank, runs in enumerate(reports):
        for r in runs:
            assert r["gap"]["rollout_vs_actor/logprob_abs_diff_max"] < 1e-5, where(rank, r)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_corrupted_remote_piece_is_named_and_direct_copy_off_streams_everything(reports):
    for rank, runs in enumerate(reports):
        for r in runs:
            if "corruption_caught" not in r:
                continue
            if rank == 1:  # cross_run.CORRUPT_RANK
                assert "the cross-GPU copy of" in r["corruption_caught"] and "did not land on rank 1" in \
                    r["corruption_caught"], where(rank, r)
            else:
                assert r["corruption_caught"] == "", where(rank, r)
            off = r["direct_off_metrics"]
            assert off["reshard/remote_bytes"] == 0 and off["reshard/direct_bytes"] == 0, where(rank, r)
            assert off["reshard/buckets"] > 1 and off["reshard/tensors"] == 26, where(rank, r)
