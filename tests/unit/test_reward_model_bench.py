"""benchmarks/reward_model_bench.py's report over a synthetic run folder: the issue's metrics, step 1 left out of
the timings, measured peaks against the plan."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks"))

import reward_model_bench as bench  # noqa: E402


def test_report_metrics(tmp_path):
    (tmp_path / "logs").mkdir()
    rows = [{"step": 1, "timing_s/step": 10.0, "timing_s/reward_model": 5.0, "memory/reward_peak_bytes": 50.0},
            {"step": 2, "timing_s/step": 4.0, "timing_s/reward_model": 1.0, "memory/train_peak_bytes": 90.0,
             "memory/reward_peak_bytes": 60.0},
            {"step": 3, "timing_s/step": 6.0, "timing_s/reward_model": 3.0, "memory/rollout_used_bytes": 70.0,
             "memory/rollout_torch_reserved_bytes": 40.0, "memory/rollout_torch_allocated_bytes": 31.0,
             "memory/ref_peak_bytes": 33.0, "memory/reward_cache_held_bytes": 8.0}]
    (tmp_path / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    phases = {"reward": {"total": 50}, "train_actor": {"total": 100}, "actor_step": {"total": 20},
              "rollout": {"total": 56}, "ref_log_prob": {"total": 30}}
    (tmp_path / "plan.json").write_text(json.dumps({"phases": phases, "peak": {"bytes": 100}}))
    (tmp_path / "run.json").write_text(json.dumps({"command": "python -m hybridrl.trainer.main_ppo x", "cpu": True}))
    record = bench.report(str(tmp_path), str(tmp_path / "out" / "reward_model.json"), "")
    m = record["metrics"]
    assert m["rm_seconds_per_step"] == 2.0  # median of steps 2..3
    assert m["rm_share_of_step"] == pytest.approx((0.25 + 0.5) / 2)
    assert m["reward_peak_bytes"] == 60.0 and m["reward_measured_over_plan"] == pytest.approx(1.2)
    assert m["peak_measured_over_plan"] == pytest.approx(0.9)
    # each phase against its own plan phase: the rollout's 1.25 does not hide behind the overall 0.9
    assert (m["train_measured_over_plan"], m["rollout_measured_over_plan"], m["ref_measured_over_plan"]) == \
        pytest.approx((0.9, 1.25, 1.1))
    assert m["cache_held_bytes"] == 9.0  # the rollout's reserved - allocated, above the reward window's 8
    assert (tmp_path / "out" / "reward_model.md").read_text().count("| rm_") >= 2
    assert record["device"] == "cpu" and record["command"].startswith("python -m hybridrl.trainer.main_ppo")
