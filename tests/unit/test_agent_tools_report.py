"""benchmarks/agent_tools.py report: the issue's three numbers from the runs' validation rows."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import agent_tools  # noqa: E402


def _run(root, name, rows):
    os.makedirs(root / name / "logs")
    with open(root / name / "logs" / "metrics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def test_the_comparison_uses_each_runs_last_validation_after_training(tmp_path):
    _run(tmp_path, "grpo_tools", [{"step": 0, "val/score": 0.09}, {"step": 1, "critic/score/mean": 0.2},
                                  {"step": 18, "val/score": 0.25, "val/agent/tool_call_rate": 0.8,
                                   "val/agent/turns_per_sample": 2.5}])
    _run(tmp_path, "grpo_no_tools", [{"step": 0, "val/score": 0.10}, {"step": 18, "val/score": 0.125}])
    m = agent_tools.report(str(tmp_path), str(tmp_path / "r.json"), "cpu")["metrics"]
    assert m["val_score_tools_minus_no_tools"] == 0.25 - 0.125
    assert (m["tool_call_rate_after"], m["turns_per_sample"]) == (0.8, 2.5)
    assert (m["val_score_tools_before"], m["val_score_no_tools_before"]) == (0.09, 0.10)
    assert "val_score_tools_minus_no_tools > 0: yes" in open(tmp_path / "r.md").read()


def test_a_run_cut_before_its_last_validation_is_not_compared(tmp_path):
    # step 0's validation is before training: comparing it with a trained run would credit the tool with RL's gain
    _run(tmp_path, "grpo_tools", [{"step": 0, "val/score": 0.09}, {"step": 18, "val/score": 0.11,
                                                                   "val/agent/tool_call_rate": 0.96}])
    _run(tmp_path, "grpo_no_tools", [{"step": 0, "val/score": 0.10}, {"step": 1, "critic/score/mean": 0.1}])
    m = agent_tools.report(str(tmp_path), str(tmp_path / "r.json"), "cpu")["metrics"]
    assert m["val_score_tools_minus_no_tools"] is None and m["val_score_no_tools"] is None
    md = open(tmp_path / "r.md").read()
    assert "val_score_tools_minus_no_tools > 0: NO" in md and "not compared" in md
