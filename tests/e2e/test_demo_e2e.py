"""The CPU demo through the real stack (Ray, megatron-core over gloo, torch engine) for 2 steps, then
main_generation + main_eval on its checkpoint, cross-checked against the trainer's own validation.

The run is the DAPO demo (configs/dapo_demo.yaml: dynamic sampling, overlong buffer, clip-higher) with one of
verl 0.9's newer estimators and losses on top: optimal_token_baseline (which makes the actor's log-prob pass
return sum_pi_squared), cispo, token-level rollout IS weights and the straight-through k3+ KL loss."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args[:3]} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    proc = run(["-m", "hybridrl.trainer.demo", "--out", str(out), "--sft-steps", "20", "--config-name", "dapo_demo",
                "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.save_freq=2",
                "algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
                "algorithm.rollout_correction.rollout_is=token", "actor_rollout_ref.rollout.calculate_log_probs=true",
                "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=k3+",
                f"trainer.validation_data_dir={out / 'val_gens'}", f"trainer.rollout_data_dir={out / 'rollout_gens'}"])
    rows = [json.loads(line) for line in open(out / "checkpoints" / "logs" / "metrics.jsonl")]
    return {"out": out, "stdout": proc.stdout, "stderr": proc.stderr, "rows": rows}


@pytest.mark.timeout(900)
def test_two_steps_log_verl_metrics_and_end_with_the_demo_line(demo):
    train = [r for r in demo["rows"] if "critic/score/mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/lr", "response_length/mean",
                "timing_s/gen", "timing_s/update_actor", "perf/throughput", "actor/kl_loss", "actor/pg_clipfrac",
                "rollout_corr/rollout_is_mean", "rollout_corr/k3_kl"):
        assert key in train[0], key
    # the worker's share of gen (sync, generate, release) is inside the driver's gen, and holds generate itself
    assert all(r["timing_s/generate"] <= r["timing_s/rollout_worker"] <= r["timing_s/gen"] for r in train)
    # dynamic sampling reports how many generation batches each step took; fp32 rollout == actor: IS weights 1
    assert all(r["train/num_gen_batches"] >= 1 and 0 < r["train/kept_groups_fraction"] <= 1 for r in train)
    assert abs(train[0]["rollout_corr/rollout_is_mean"] - 1) < 1e-5
    assert "algorithm: adv_estimator=optimal_token_baseline loss_mode=cispo" in demo["stdout"]
    # one optimizer step per batch from the rollout policy itself: the first update's ratio is exactly 1
    assert abs(train[0]["actor/ppo_kl"]) < 1e-6
    # fp32 on CPU: the torch engine's log-probs equal the Megatron actor's recomputation
    assert train[0]["rollout_vs_actor/logprob_abs_diff_mean"] < 1e-5
    assert demo["stdout"].rstrip().splitlines()[-1].startswith("demo: val/score ")
    # the console shows hybridrl's lines: other packages' warnings (driver and workers) went to warnings.log
    console = demo["stdout"] + demo["stderr"]
    foreign = [ln for ln in console.splitlines() if re.search(r"\.py:\d+: \w*Warning: ", ln)
               and not re.search(r"/(hybridrl|adapters)/[^:]*\.py:\d+: ", ln)]
    assert not foreign and "Triggered internally at" not in console and "[transformers]" not in console, console[-4000:]
    assert (demo["out"] / "checkpoints" / "logs" / "warnings.log").stat().st_size > 0
    # ... and Ray's own lines (its "ray" logger: "<date>\tINFO worker.py:N -- ...") went to ray.log beside it
    rays = [ln for ln in console.splitlines() if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\t(INFO|WARNING) ", ln)]
    assert not rays and "Started a local Ray instance" not in console and "across cluster" not in console, rays
    ray_log = (demo["out"] / "checkpoints" / "logs" / "ray.log").read_text()
    assert "Started a local Ray instance." in ray_log
    assert "RAY_AUTH_MODE" in os.environ or "WARNING authentication_token_setup.py" in ray_log  # its warning, when on
    # every worker's line is shown as printed: no line of one rank stands for the other's ("[repeated 2x]")
    replica0 = {m.group(1) for m in re.finditer(r"\(_RayHost pid=(\d+)\)\S* +replica 0: ranks \[0\]", console)}
    assert len(replica0) == 2, console[-4000:]  # the reshard plan's first line, from both ranks
    ckpt = demo["out"] / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (ckpt / "global_step_2" / ".complete").exists()
    assert (ckpt / "logs" / "training.png").stat().st_size > 1000


@pytest.mark.timeout(900)
def test_generation_dumps_in_verls_format_match_the_logged_scores(demo):
    def read(kind, step):
        return [json.loads(line) for line in open(demo["out"] / kind / f"{step}.jsonl")]
    val_rows = {r["step"]: r for r in demo["rows"] if "val/score" in r}
    assert sorted(val_rows) == sorted(int(p.stem) for p in (demo["out"] / "val_gens").glob("*.jsonl"))
    for step, logged in val_rows.items():
        recs = read("val_gens", step)
        assert len(recs) == 128 and {"input", "output", "gts", "score", "step", "acc"} <= set(recs[0])
        assert all(r["step"] == step and r["gts"] is not None and r["input"] for r in recs)
        # the dumped per-sample scores average to the logged validation score (computed on another path)
        assert abs(sum(r["score"] for r in recs) / len(recs) - logged["val/score"]) < 1e-6
    for logged in (r for r in demo["rows"] if "critic/score/mean" in r):
        recs = read("rollout_gens", logged["step"])
        assert abs(sum(r["score"] for r in recs) / len(recs) - logged["critic/score/mean"]) < 1e-6


@pytest.mark.timeout(900)
def test_generation_and_eval_on_the_demo_checkpoint(demo, tmp_path, capsys):
    # main_eval only reads a parquet and scores it: called in this process (as tests/unit/test_eval_main.py does),
    # main_generation (megatron checkpoint, process group) in its own
    from hybridrl.trainer.main_eval import main as main_eval

    out = demo["out"]
    test_file = str(out / "data" / "test.parquet")
    actor = str(out / "checkpoints" / "global_step_2" / "actor")
    greedy = str(tmp_path / "greedy.parquet")
    run(["-m", "hybridrl.trainer.main_generation", f"data.path={test_file}", "data.n_samples=1",
         f"data.output_path={greedy}", f"model.path={actor}", "rollout.temperature=0", "rollout.do_sample=false",
         "rollout.prompt_length=16", "rollout.response_length=4", "trainer.device=cpu"])
    rows = pq.read_table(greedy).to_pylist()
    assert len(rows) == 128 and all(len(r["responses"]) == 1 for r in rows)
    assert main_eval([f"data.path={greedy}"]) == 0
    printed = capsys.readouterr().out
    result = json.load(open(greedy.replace(".parquet", ".eval.json")))["metrics"]
    # the same weights decoded greedily on the same prompts: the trainer's last validation score, whose rewards
    # also carry the overlong buffer's penalty (main_eval scores without it)
    last = [r for r in demo["rows"] if "val/score" in r][-1]
    val = last["val/score"] - last["val-aux/arithmetic/overlong_reward/mean@1"]
    assert abs(result["test_score/arithmetic"] - val) <= 2 / 128, (result, val, printed)

    sampled = str(tmp_path / "sampled.parquet")
    run(["-m", "hybridrl.trainer.main_generation", f"data.path={test_file}", "data.n_samples=4",
         f"data.output_path={sampled}", f"model.path={actor}", "rollout.temperature=1.0", "rollout.top_p=1.0",
         "rollout.top_k=-1", "rollout.prompt_length=16", "rollout.response_length=4", "trainer.device=cpu"])
    assert main_eval([f"data.path={sampled}"]) == 0
    result = json.load(open(sampled.replace(".parquet", ".eval.json")))["metrics"]
    from hybridrl.reward.arithmetic import compute_score

    table = pq.read_table(sampled).to_pylist()
    mean = sum(compute_score(resp, r["reward_model"]["ground_truth"]) for r in table for resp in r["responses"]) / (4 * 128)
    assert result["test_score/arithmetic"] == pytest.approx(mean, abs=1e-9)
    assert result["pass@1/arithmetic"] == pytest.approx(mean, abs=1e-9)
    assert result["pass@1/arithmetic"] <= result["pass@2/arithmetic"] <= result["pass@4/arithmetic"]


@pytest.mark.timeout(900)
def test_the_start_up_table_has_every_phase_and_adds_up_to_the_measured_total(demo):
    """The trainer's start-up metrics (logged with step 1) fold into issue 39's table: every row there, none
    negative, and the rows before the first step add up to timing_s/startup, the process's age when step 1 began."""
    from hybridrl.trainer.startup import phase_table

    first = next(r for r in demo["rows"] if "timing_s/startup" in r)
    assert first["step"] == 1
    step1 = next(r for r in demo["rows"] if r["step"] == 1 and "timing_s/step" in r)
    table = phase_table(first, first_step=step1["timing_s/step"])
    for row in ("ray", "workers", "model_build", "weight_load", "vllm_engine", "compile_and_capture",
                "first_validation", "other", "to_first_step", "first_step"):
        assert row in table and table[row] >= 0, row
    for part in ("launch", "data", "data_background", "ray_init", "workers", "process_group", "worker_init",
                 "actor_build", "actor_model_build", "actor_weight_load", "engine_init", "first_sync",
                 "val_before_train"):
        assert f"timing_s/startup/{part}" in first, part
    rows = sum(v for k, v in table.items() if k not in ("to_first_step", "first_step"))
    assert abs(rows - first["timing_s/startup"]) < 0.01 * first["timing_s/startup"]
    # the actor's build is its two parts (the rest of the constructor is milliseconds here)
    build = first["timing_s/startup/actor_model_build"] + first["timing_s/startup/actor_weight_load"]
    assert build <= first["timing_s/startup/actor_build"] < build + 0.5
    assert table["ray"] > 0 and table["model_build"] > 0 and table["first_validation"] > 0
    # the clock began at the process's start: the total is at most the wall time the test saw, well above zero
    assert 1.0 < first["timing_s/startup"]
    assert "hybridrl: start-up" in demo["stdout"]
