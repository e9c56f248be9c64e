"""benchmarks/async_rl.py (issue 37) without a GPU: the 2-GPU layouts validate with the job's batch sizes, the report
over fake run folders gives each machine size its own metric names and files, and the wall-clock cap stops a run."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import async_rl  # noqa: E402

from hybridrl.config.cli import normalize_argv, parse_command_line  # noqa: E402
from hybridrl.config.loader import load_config  # noqa: E402
from hybridrl.config.validate import validate  # noqa: E402

TWO_GPU = ("colocated_2", "one_step_off_1_1", "fully_async_1_1")


def validated(name: str):
    cmd = async_rl.command(async_rl.RUNS[name], 3, "/tmp/async_rl_unit", "/tmp/smol", cpu=False, max_time_s=120,
                           val_samples=64)
    cl = parse_command_line(normalize_argv(cmd[3:]))
    return validate(load_config(cl.overrides, cl.config_name, cl.config_path), cuda_available=lambda: True,
                    te_available=lambda: True, gpu_count=lambda: 2)


@pytest.mark.parametrize("name", TWO_GPU)
def test_two_gpu_layouts_validate_on_a_two_gpu_machine(name):
    run = async_rl.RUNS[name]
    d = validated(name).derived
    assert run.gpus == 2 and d.world_size == run.train_gpus and d.actor.dp == run.train_gpus
    assert d.placement.split == bool(run.rollout_gpus) and d.placement.rollout_world == run.rollout_gpus
    assert d.placement.one_step_off == (run.mode == "one_step_off")
    assert (d.placement.fully_async is not None) == (run.mode == "fully_async")
    # 64 prompts x 8 samples; mini-batches of 32 prompts split over the trainer's dp ranks
    assert d.actor_batch.samples_per_step == 512 and d.actor_batch.mini_batch_per_dp == 256 // run.train_gpus
    if run.mode == "fully_async":
        assert d.placement.fully_async.groups_per_step == 64


def write_run(in_dir, name: str, steps: list[dict], vals: tuple[float, float], samples_per_step: int = 512) -> None:
    logs = in_dir / name / "logs"
    logs.mkdir(parents=True)
    rows = [{"step": 0, "val/score": vals[0]}, *({"step": i + 1, **s} for i, s in enumerate(steps))]
    rows[-1] = {**rows[-1], "val/score": vals[1]}
    (logs / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (in_dir / f"{name}.json").write_text(json.dumps({"returncode": 0, "capped": False,
                                                     "samples_per_step": samples_per_step}))


def step(seconds: float, tokens: float, **more: float) -> dict:
    return {"perf/total_num_tokens": tokens, "timing_s/step": seconds, "response_length/mean": 500.0, **more}


ASYNC_STEP = {"fully_async/version_lag/mean": 0.5, "fully_async/version_lag/max": 1.0, "fully_async/queue/depth": 3.0,
              "fully_async/queue/in_flight": 20.0, "timing_s/trainer_idle": 1.0, "trainer/idle_ratio": 0.1,
              "rollouter/idle_ratio": 0.05, "timing_s/rollouter_sync_pause": 0.2, "fully_async/dropped_stale_groups": 0.0,
              "fully_async/partial/partial_ratio": 0.3, "async/staleness": 0.5, "timing_s/weight_push": 1.0,
              "fully_async/staleness_hist/0_syncs": 0.5, "fully_async/staleness_hist/1_syncs": 0.5,
              "rollout_corr/rollout_is_mean": 1.0, "rollout_corr/rollout_is_eff_sample_size": 0.9,
              "rollout_corr/kl": 0.01, "rollout_corr/ppl_ratio": 1.0, "rollout_corr/log_ppl_abs_diff": 0.02}


def test_the_two_gpu_report_has_its_own_names_and_files(tmp_path):
    write_run(tmp_path, "colocated_2", [step(20.0, 100_000.0)] * 3, (0.01, 0.03))
    oso = {"async/staleness": 1.0, "async/overlapped_gen_s": 5.0, "timing_s/trainer_idle": 2.0,
           "trainer/idle_ratio": 0.08}
    # its last step has no next launch, so no rollouter/idle_ratio: the key is still logged by the others
    write_run(tmp_path, "one_step_off_1_1", [step(25.0, 100_000.0, **oso, **{"rollouter/idle_ratio": 0.3})] * 2
              + [step(25.0, 100_000.0, **oso)], (0.01, 0.02))
    # its last step all fresh: no 1_syncs bucket, which counts as 0 in the histogram's means
    last = {**{k: v for k, v in ASYNC_STEP.items() if k != "fully_async/staleness_hist/1_syncs"},
            "fully_async/staleness_hist/0_syncs": 1.0}
    # fully async's timing_s/step holds its 1 s weight push (fully_async.py counts it in the step after the push)
    write_run(tmp_path, "fully_async_1_1", [step(10.0, 100_000.0, **ASYNC_STEP)] * 2 + [step(10.0, 100_000.0, **last)],
              (0.01, 0.04))
    out = tmp_path / "results" / "async_rl_2gpu.json"
    result = async_rl.write_report(str(tmp_path), 2, str(out))
    m = result["metrics"]
    assert all(k.endswith("_2gpu") for k in m)
    # 300k tokens over 60 s against 300k over 3 x 10 s
    assert m["async_vs_colocated_throughput_2gpu"] == pytest.approx(2.0)
    assert m["one_step_off_vs_colocated_throughput_2gpu"] == pytest.approx(0.8)
    assert m["async_val_gain_over_sync_2gpu"] == pytest.approx(1.5)
    assert m["async_version_lag_mean_2gpu"] == 0.5 and m["async_val_samples_2gpu"] == m["sync_val_samples_2gpu"] == 1536
    fa = result["runs"]["fully_async_1_1"]
    assert fa["missing"] == [] and result["notes"] == []
    hist = {k.rsplit("/", 1)[1]: v for k, v in fa["means"].items() if k.startswith(async_rl.HIST)}
    assert hist == {"0_syncs": pytest.approx(2 / 3), "1_syncs": pytest.approx(1 / 3)}
    assert json.loads(out.read_text())["metrics"] == m
    md = (tmp_path / "results" / "async_rl_2gpu.md").read_text()
    for text in ("`async_vs_colocated_throughput_2gpu` | 2", "fully_async/staleness_hist/1_syncs",
                 "rollouter/idle_ratio", "rollout_corr/rollout_is_mean", "| samples | 1536 | 1536 | 1536 |",
                 "Metrics the trainer did not log: one_step_off_1_1: rollout_corr/rollout_is_mean"):
        assert text in md, text


def test_missing_runs_and_uneven_samples_are_named(tmp_path):
    write_run(tmp_path, "colocated_2", [step(20.0, 100_000.0)] * 3, (0.01, 0.015))
    write_run(tmp_path, "fully_async_1_1", [step(9.0, 100_000.0)] * 2, (0.01, 0.02))  # stopped early, logs nothing async
    with open(tmp_path / "fully_async_1_1" / "logs" / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "perf/total_num_')  # a line cut short by the SIGKILL at the cap
    result = async_rl.report(str(tmp_path), 2)
    m = result["metrics"]
    assert m["one_step_off_vs_colocated_throughput_2gpu"] is None  # not run
    assert "different sample counts (fully async 1024, colocated 1536)" in result["notes"][0]
    assert "is noise" in result["notes"][1]
    assert "fully_async/version_lag/mean" in result["runs"]["fully_async_1_1"]["missing"]
    # the 4-GPU report over the same folder: the names, none of the 2-GPU runs
    four = async_rl.report(str(tmp_path), 4)
    assert "async_vs_colocated_throughput" in four["metrics"] and four["runs"].keys() == {
        "colocated_4", "one_step_off_2_2", "fully_async_2_2"}


def test_a_run_past_its_cap_is_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(async_rl, "STOP_GRACE_S", 5)
    cmd = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    start = time.monotonic()
    with open(tmp_path / "log", "w") as log:
        code, capped = async_rl.run_capped(cmd, log, cap_s=1.0)
    assert capped and code != 0 and time.monotonic() - start < 10
    assert (tmp_path / "log").read_text() == "started\n"
