"""benchmarks/moe_scale.py on fake run folders: which steps count, the sync floors (copied on the GPU, received over
NCCL), plan vs measured peaks, the issue's metric names and goals, the written files."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
GiB = 2 ** 30


def _step(step, sync, mfu, agree, gap, remote=0.0, captured=0.0, peak=30 * GiB):
    return {"step": step, "timing_s/step": 10.0, "timing_s/gen": 4.0, "timing_s/reshard_stream": sync,
            "reshard/bytes": 4e9, "reshard/direct_bytes": 4e9, "reshard/remote_bytes": remote,
            "reshard/buckets": 0.0, "reshard/direct_captured": captured, "perf/mfu/actor_forward_backward": mfu,
            "rollout_vs_actor/routing_agreement": agree, "rollout_vs_actor/logprob_abs_diff_mean": gap,
            "perf/throughput": 1000.0, "memory/train_peak_bytes": peak, "memory/rollout_used_bytes": 40 * GiB}


def _run(root, name, gpus, steps, d2d=2e12, plan_train=25 * GiB, plan_rollout=50 * GiB):
    folder = root / name
    (folder / "logs").mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"name": name, "shape": name, "gpus": gpus, "device": "fake GPU",
                                                 "d2d_bytes_per_s": d2d, "what": name}))
    (folder / "plan.json").write_text(json.dumps({"ok": True, "model": {"params": 8e9}, "overhead_bytes": 3 * GiB,
                                                  "phases": {"train_actor": {"total": plan_train},
                                                             "rollout": {"total": plan_rollout}}}))
    with open(folder / "logs" / "metrics.jsonl", "w") as f:
        for row in steps:
            f.write(json.dumps(row) + "\n")


def test_report_on_fake_runs(tmp_path):
    import moe_scale

    # step 1 (compilation, the first graph capture) never counts; medians over steps 2..N
    _run(tmp_path, "moe_1b_te_grpo", 1, [_step(1, 1.0, 0.01, 0.1, 1.0, captured=1.0), _step(2, 0.003, 0.2, 0.95, 0.01),
                                         _step(3, 0.005, 0.3, 0.97, 0.03), _step(4, 0.004, 0.25, 0.96, 0.02)])
    # 4 GPUs, vLLM expert parallel: nothing received, so the floor is the local copy at 2e12 B/s
    _run(tmp_path, "moe_8b_ep4", 4, [_step(1, 1.0, 0.01, 0.1, 1.0), _step(2, 0.004, 0.3, 0.9, 0.04),
                                     _step(3, 0.004, 0.3, 0.9, 0.04, peak=35 * GiB)], d2d=2e12)
    _run(tmp_path, "moe_8b_ep4_r3", 4, [_step(1, 1.0, 0.01, 0.1, 1.0), _step(2, 0.004, 0.3, 0.95, 0.01)], d2d=2e12,
         plan_train=20 * GiB)
    # tensor-parallel experts: 1e9 of the 4e9 bytes come over NCCL at 1e11 B/s (10 ms) against 3e9 copied (1.5 ms)
    _run(tmp_path, "moe_8b_ep4_rtp4", 4, [_step(1, 1.0, 0.01, 0.1, 1.0), _step(2, 0.02, 0.3, 0.9, 0.04, remote=1e9)],
         d2d=2e12)
    (tmp_path / "allgather_4.json").write_text(json.dumps({"busbw_bytes_per_s": 1e11, "d2d_bytes_per_s": 3e12}))
    (tmp_path / "moe_1b_te_train.json").write_text(json.dumps({
        "command": "train", "device": "fake GPU", "metrics": {"moe_mfu_active": 0.31, "tokens_per_update": 140000},
        "setup": {"experts": "32 experts, top-4, width 768: one grouped GEMM a layer (TE)"}}))
    out = tmp_path / "results" / "moe_scale.json"
    moe_scale.main(["report", "--in-dir", str(tmp_path), "--out", str(out), "--command", "cmd",
                    "--d2d-bytes-per-s", "1e12"])
    record = json.loads(out.read_text())
    m, runs = record["metrics"], record["runs"]
    assert m["moe_mfu_active"] == 0.31
    assert runs["moe_1b_te_grpo"]["sync_s"] == pytest.approx(0.004) and runs["moe_1b_te_grpo"]["sync_captures"] == 0
    assert m["moe_sync_over_floor"] == pytest.approx(0.004 / (4e9 / 2e12))  # the run's own d2d, not --d2d
    assert m["moe_routing_agreement"] == pytest.approx(0.96)
    assert m["moe_mfu_active_4gpu"] == pytest.approx(0.3) and m["moe_sync_over_floor_4gpu"] == pytest.approx(2.0)
    assert m["moe_sync_over_floor_4gpu_rtp4"] == pytest.approx(0.02 / (1e9 / 1e11))
    # peaks: ep4 train 35 GiB against 25 planned (1.4), rollout 40 against 50 (1/0.8 = 1.25); r3 train 30 against 20
    assert runs["moe_8b_ep4"]["plan_vs_measured_peak"] == pytest.approx(1.4)
    assert m["moe_plan_vs_measured_peak_4gpu"] == pytest.approx(1.5)
    assert m["moe_r3_gap_over_noreplay_4gpu"] == pytest.approx(0.25)
    md = (tmp_path / "results" / "moe_scale.md").read_text()
    assert "| `moe_mfu_active` | 0.310 | >= 0.25 | met |" in md
    assert "| `moe_sync_over_floor_4gpu` | 2.000 | <= 2.0 | met |" in md
    assert "| `moe_plan_vs_measured_peak_4gpu` | 1.500 | <= 1.15 | not met |" in md
    kept = sorted(os.listdir(tmp_path / "results" / "moe_scale"))
    assert "moe_8b_ep4_metrics.jsonl" in kept and "allgather_4.json" in kept and "moe_1b_te_train.json" in kept


def test_missing_runs_leave_their_metrics_null(tmp_path):
    import moe_scale

    out = tmp_path / "moe_scale.json"
    moe_scale.main(["report", "--in-dir", str(tmp_path), "--out", str(out), "--d2d-bytes-per-s", "1e12"])
    m = json.loads(out.read_text())["metrics"]
    assert all(m[k] is None for k in moe_scale.GOALS)
    assert "| `moe_mfu_active` | - | >= 0.25 | not run |" in (tmp_path / "moe_scale.md").read_text()
