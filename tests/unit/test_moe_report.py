"""benchmarks/moe_report.py on fake trainer metrics: which steps count, the ratios, the written files."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


def _jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _step(step, gap, agree, sync, mfu):
    return {"step": step, "critic/score/mean": 0.1, "rollout_vs_actor/logprob_abs_diff_mean": gap,
            "rollout_vs_actor/routing_agreement": agree, "rollout_vs_actor/routing_agreement_min": agree / 2,
            "timing_s/reshard_stream": sync, "timing_s/reshard": 2 * sync, "reshard/bytes": 2.0e9,
            "reshard/direct_bytes": 2.0e9, "perf/mfu/actor": mfu, "timing_s/step": 10.0}


def test_report_on_fake_runs(tmp_path):
    import moe_report
    from multi_gpu_bench import make_model

    model = str(tmp_path / "moe")
    make_model(model, "moe_tiny")
    # step 1 (warm-ups) is left out of every mean; the validation row (no critic/score) is not a step
    noreplay = _jsonl(tmp_path / "a.jsonl", [{"step": 0, "val/score": 0.0}, _step(1, 9.0, 0.1, 9.0, 0.9),
                                             _step(2, 0.02, 0.9, 0.010, 0.10), _step(3, 0.04, 0.8, 0.012, 0.20)])
    r3 = _jsonl(tmp_path / "b.jsonl", [_step(1, 9.0, 0.1, 9.0, 0.9), _step(2, 0.015, 0.85, 0.01, 0.1)])
    gap = tmp_path / "gap.json"
    gap.write_text(json.dumps({"metrics": {"hf_bf16_vs_vllm_abs_diff_mean": 0.025, "logprob_abs_diff_mean": 0.026,
                                           "routing_agreement": 0.95}}))
    out = tmp_path / "moe_grpo.json"
    moe_report.main(["--noreplay", noreplay, "--r3", r3, "--gap", str(gap), "--model-dir", model, "--command", "cmd",
                     "--out", str(out), "--device", "fake", "--d2d-bytes-per-s", "1e12"])
    record = json.loads(out.read_text())
    assert set(record) == {"command", "device", "date", "metrics"} and record["device"] == "fake"
    m = record["metrics"]
    assert (m["steps"], m["steps_replay"]) == (3, 2)
    assert m["logprob_abs_diff_mean"] == pytest.approx(0.03)
    assert m["logprob_abs_diff_over_bf16_floor"] == pytest.approx(0.03 / 0.025)
    assert m["routing_agreement"] == pytest.approx(0.85) and m["routing_agreement_replay"] == pytest.approx(0.85)
    assert m["logprob_abs_diff_mean_replay"] == pytest.approx(0.015)
    assert m["logprob_abs_diff_replay_over_noreplay"] == pytest.approx(0.5)
    assert m["sync_floor_seconds"] == pytest.approx(2e-3) and m["sync_time_over_floor"] == pytest.approx(5.5)
    assert m["mfu_active"] == pytest.approx(0.15) and m["gap_bench_over_bf16_floor"] == pytest.approx(0.026 / 0.025)
    # moe_tiny: 16 experts, top-4; active = total - 2 layers x 12 skipped experts x 3 x 64 x 32
    assert m["num_experts"] == 16 and m["experts_per_token"] == 4
    assert m["total_params"] - m["active_params"] == 2 * 12 * 3 * 64 * 32
    md = (tmp_path / "moe_grpo.md").read_text()
    assert "| logprob_abs_diff_over_bf16_floor | 1.2 |" in md and "cmd" in md


def test_report_without_runs_writes_what_it_has(tmp_path):
    import moe_report
    from multi_gpu_bench import make_model

    model = str(tmp_path / "moe")
    make_model(model, "moe_tiny")
    out = tmp_path / "r.json"
    moe_report.main(["--noreplay", str(tmp_path / "none.jsonl"), "--r3", str(tmp_path / "none2.jsonl"),
                     "--gap", str(tmp_path / "none.json"), "--model-dir", model, "--command", "c", "--out", str(out),
                     "--device", "fake", "--d2d-bytes-per-s", "1e12"])
    m = json.loads(out.read_text())["metrics"]
    assert m["steps"] == 0 and m["logprob_abs_diff_mean"] is None and m["sync_time_over_floor"] is None
