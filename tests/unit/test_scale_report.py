"""benchmarks/scale_report.py on hand-made run folders: medians and spread over steps 2..N, the step's remainder,
peaks against the plan (with and without its overhead), a step logged twice, a shape without a reference
model, a run that logged nothing, and the order by parameter count."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks"))

import scale_report  # noqa: E402

GiB = 2 ** 30


def _step(step, total, gen, old, ref, update, reshard, tps, train_gib, rollout_gib, **extra):
    row = {"step": step, "timing_s/step": total, "timing_s/gen": gen, "timing_s/reward": 0.1,
           "timing_s/old_log_prob": old, "timing_s/adv": 0.1, "timing_s/update_actor": update,
           "timing_s/reshard": reshard, "timing_s/generate": gen - reshard - 0.5, "perf/throughput": tps,
           "memory/train_peak_bytes": train_gib * GiB, "memory/rollout_used_bytes": rollout_gib * GiB, **extra}
    if ref is not None:
        row["timing_s/ref"] = ref
    return row


def _folder(root, shape, params, train_gib, rollout_gib, rows, overrides):
    run = root / f"scale_{shape}"
    (run / "logs").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({
        "shape": shape, "model_shape": shape, "device": "NVIDIA H200", "gpu_memory_gib": 139.8,
        "model_dir": f"/tmp/m_{shape}", "shape_overrides": overrides, "extra_overrides": [], "command": "python3 -m x"}))
    (run / "plan.json").write_text(json.dumps({
        "format": "hybridrl.plan/1", "ok": True, "overhead_bytes": 3 * GiB, "gpu_memory_bytes": int(139.8 * GiB),
        "model": {"params": params}, "layout": {"recompute": False}, "problems": [],
        "phases": {"train_actor": {"total": train_gib * GiB}, "train_critic": None,
                   "rollout": {"total": rollout_gib * GiB}}}))
    if rows is not None:
        with open(run / "logs" / "metrics.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


@pytest.fixture
def report(tmp_path):
    small = [
        _step(1, 100.0, 80.0, 9.0, 5.0, 6.0, 3.0, 100.0, 44, 50, **{"timing_s/startup": 150.0}),
        {"step": 1, "val/score": 0.0},  # a validation record: not a training step
        _step(2, 10.0, 4.0, 1.0, 1.0, 3.0, 0.5, 1000.0, 40, 51),
        _step(3, 99.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 99, 99),  # logged again below: the later record counts
        _step(3, 12.0, 5.0, 2.0, 1.0, 3.5, 0.7, 1200.0, 42, 66),
        _step(4, 11.0, 6.0, 3.0, 1.0, 1.0, 0.6, 1100.0, 41, 52),
    ]
    big = [_step(1, 90.0, 30.0, 5.0, None, 20.0, 2.0, 50.0, 100, 60, **{"timing_s/startup": 250.0}),
           _step(2, 30.0, 10.0, 5.0, None, 12.0, 1.0, 400.0, 110, 61),
           _step(3, 34.0, 12.0, 5.0, None, 14.0, 1.5, 300.0, 105, 62)]
    _folder(tmp_path, "1.5b", 1_543_714_304, 40, 60, small, ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192"])
    _folder(tmp_path, "7b", 7_615_616_512, 100, 55, big, ["actor_rollout_ref.actor.use_kl_loss=false"])
    _folder(tmp_path, "14b", 14_770_033_664, 200, 70, None, [])  # the trainer died before its first step
    out = tmp_path / "results" / "megatron_scale.json"
    record = scale_report.report(str(tmp_path), str(out), "bash benchmarks/gpu_run.sh scale SHAPE")
    return record, out


def test_step_time_and_phases_over_steps_two_to_n(report):
    record, _ = report
    r = record["runs"]["1.5b"]
    assert (r["steps"], r["steps_timed"]) == (4, 3)
    assert (r["step_s_median"], r["step_s_min"], r["step_s_max"]) == (11.0, 10.0, 12.0)
    assert r["gen_s"] == 5.0 and r["old_log_prob_s"] == 2.0 and r["ref_s"] == 1.0 and r["update_actor_s"] == 3.0
    assert r["gen_reshard_s"] == 0.6 and r["tokens_per_s_per_gpu"] == 1100.0 and r["startup_s"] == 150.0
    # per step: 10 - 9.2, 12 - 11.7, 11 - 11.2 -> median 0.3
    assert r["other_s"] == pytest.approx(0.3)


def test_peaks_against_the_plan(report):
    record, _ = report
    r = record["runs"]["1.5b"]
    assert r["train_peak_bytes"] == 44 * GiB and r["rollout_peak_bytes"] == 66 * GiB  # step 3's stale 99 ignored
    assert r["train_measured_over_plan"] == pytest.approx(44 / 40)
    assert r["train_measured_over_plan_no_overhead"] == pytest.approx(44 / 37)
    assert r["rollout_measured_over_plan"] == pytest.approx(66 / 60)
    assert r["rollout_measured_over_plan_no_overhead"] == pytest.approx(66 / 57)
    assert record["metrics"]["1.5b_train_measured_over_plan"] == pytest.approx(1.1)
    assert r["rollout_used_bytes_by_step"] == [50 * GiB, 51 * GiB, 66 * GiB, 52 * GiB]
    assert r["rollout_torch_allocated_bytes_by_step"] == [None] * 4  # not logged by these steps
    assert "1.5b_rollout_used_bytes_by_step" not in record["metrics"]  # lists stay in runs


def test_shape_without_reference_and_with_two_steps_timed(report):
    record, _ = report
    r = record["runs"]["7b"]
    assert r["steps_timed"] == 2 and r["step_s_median"] == 32.0 and r["ref_s"] is None
    assert r["update_actor_s"] == 13.0 and r["train_peak_bytes"] == 110 * GiB
    assert r["train_measured_over_plan"] == pytest.approx(1.1)


def test_failed_run_order_and_files(report):
    record, out = report
    assert list(record["runs"]) == ["1.5b", "7b", "14b"]  # by parameters, not by folder name
    assert "no training steps" in record["runs"]["14b"]["error"]
    assert record["device"] == "NVIDIA H200" and set(record) >= {"command", "device", "date", "metrics"}
    md = open(str(out).replace(".json", ".md")).read()
    assert "| 1.5b | 1.54B | 4 | 11.00 (10.00-12.00) |" in md and "| 14b | 14.77B | 0 | failed:" in md
    assert "- 7b: `actor_rollout_ref.actor.use_kl_loss=false`" in md
    copied = sorted(os.listdir(str(out).replace(".json", "")))
    assert copied == ["1.5b_metrics.jsonl", "1.5b_plan.json", "1.5b_run.json", "14b_plan.json", "14b_run.json",
                      "7b_metrics.jsonl", "7b_plan.json", "7b_run.json"]


def test_one_step_is_not_a_timing():
    out = scale_report.summarize([_step(1, 5.0, 2.0, 1.0, 1.0, 1.0, 0.2, 10.0, 1, 1)], {})
    assert "step_s_median" not in out and "steps 2..N" in out["error"]
