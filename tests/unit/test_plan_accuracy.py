"""Issue 43's `plan_step_time_error_max`: the plan's step-time model (hybridrl/plan/step_time.py, Costs() as
committed) against every measured GRPO step of benchmarks/results/plan_calibration.json, recomputed here, and the
committed results file (plan_accuracy.json, written by benchmarks/plan_calibration.py accuracy) against it."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import plan_calibration as pc  # noqa: E402

ACCURACY = json.load(open(os.path.join(ROOT, "benchmarks", "results", "plan_accuracy.json")))


@pytest.fixture(scope="module")
def prepared():
    return pc.prepare(pc.load_rows())


def test_every_row_within_20_percent(prepared):
    errors = {row["name"]: e for (row, *_), e in zip(prepared, pc.errors(prepared))}
    assert len(errors) >= 20
    worst = max(errors, key=lambda n: abs(errors[n]))
    print(f"plan_step_time_error_max={abs(errors[worst]):.3f} ({worst})")
    assert {n: round(e, 3) for n, e in errors.items() if abs(e) > 0.2} == {}


def test_committed_results_match_the_model_and_the_data(prepared):
    """plan_accuracy.json is the model's output over these rows: a change to either without re-running the script
    fails here."""
    rows = {t["name"]: t for t in ACCURACY["rows"]}
    assert set(rows) == {row["name"] for row, *_ in prepared}
    for (row, *_), p in zip(prepared, pc.predict(prepared)):
        assert rows[row["name"]]["measured_s"] == row["step_s"]
        assert rows[row["name"]]["predicted_s"] == pytest.approx(p["step"], abs=2e-3), row["name"]
    assert ACCURACY["metrics"]["plan_step_time_error_max"] == pytest.approx(
        max(abs(t["error"]) for t in ACCURACY["rows"]), abs=1e-4)
    assert ACCURACY["metrics"]["plan_step_time_error_max"] <= 0.2


def test_the_check_can_fail(prepared):
    """Without the uncaptured-decode term (CUDA graphs only up to 512 sequences, or eager) the eager row falls out of
    20% (-0.61), and with train MFU a quarter higher the 2 x H200 dp2 row does (-0.21): the bound does not hold whatever the
    model says."""
    from hybridrl.plan.step_time import Costs

    errors = {row["name"]: e for (row, *_), e in zip(prepared, pc.errors(prepared, replace(Costs(), uncaptured_layer_s=0.0)))}
    assert "h200x4_7b_tp4_eager" in {n for n, e in errors.items() if abs(e) > 0.2}
    faster = replace(Costs(), train_mfu=tuple((h, m * 1.25) for h, m in Costs().train_mfu))
    errors = {row["name"]: e for (row, *_), e in zip(prepared, pc.errors(prepared, faster))}
    assert {n for n, e in errors.items() if abs(e) > 0.2}


def test_left_out_runs_each_give_a_reason():
    left = json.load(open(pc.CALIBRATION))["left_out"]
    assert left and all(x["why"] and x["name"] for x in left)
    assert any("free_cache_engine=false" in x["why"] for x in left)
