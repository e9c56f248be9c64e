"""async_training.enable on CPU: the rollout in its own process generating continuously (torch engine, one token a
segment so that weight syncs land inside samples), the trainer on two gloo ranks taking batches from the queue.

1. the agent demo (multi-turn, calculator tool) in this mode for 3 steps: staleness within the bound, samples that
   span two versions, verl's rollout-correction metrics, the agent's counts;
2. the demo with the rollout worker killed after step 2: the trainer exits within a minute naming the worker, and
   the finished groups still queued are on disk, whole;
3. that run resumed from its last checkpoint: it trains the spilled groups first, each once, and counts those past
   the (tighter) staleness bound instead of training them; its checkpoint records every one of them as consumed.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from hybridrl.rollout.async_queue import load_spilled

pytestmark = [pytest.mark.dist, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASYNC = ["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=1",
         "actor_rollout_ref.rollout.calculate_log_probs=true", "async_training.enable=true",
         "async_training.compute_prox_log_prob=true", "async_training.segment_tokens=1",
         "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.plot=false"]
ENV = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1")


def train_rows(out) -> list[dict]:
    path = out / "checkpoints" / "logs" / "metrics.jsonl"
    return [r for r in map(json.loads, open(path)) if "critic/score/mean" in r] if path.exists() else []


@pytest.mark.timeout(600)
def test_agent_loop_runs_fully_async(tmp_path):
    out = tmp_path / "agent"
    proc = subprocess.run([sys.executable, "-m", "hybridrl.trainer.agent_demo", "--out", str(out), "--sft-steps", "30",
                           *ASYNC, "trainer.total_training_steps=3", "async_training.staleness_threshold=1",
                           "async_training.trigger_parameter_sync_step=1"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "fully async: 16 prompt groups a step" in proc.stdout
    train = train_rows(out)
    assert [r["step"] for r in train] == [1, 2, 3]
    assert train[0]["fully_async/version_lag/max"] == 0.0  # the first batch comes from the first weights
    for r in train:
        # at most ceil(staleness_threshold) = 1 sync old; one sync per step here, so at most 1 update
        assert r["fully_async/version_lag/max"] <= 1.0 and r["fully_async/staleness_hist/0_syncs"] >= 0.0
        assert r["agent/turns_per_sample"] >= 1 and "agent/tool_calls_per_sample" in r
        assert "fully_async/queue/depth" in r and 0.0 <= r["trainer/idle_ratio"] <= 1.0
        assert 0.0 <= r["rollouter/idle_ratio"] <= 1.0
        for key in ("rollout_is_seq_max", "rollout_is_seq_fraction_high", "training_log_ppl", "ppl_ratio"):
            assert f"rollout_corr/{key}" in r
    # the weight push between steps is part of the step after it: a step's time holds its parts, the push included
    parts = ("gen", "reward", "weight_push", "old_log_prob", "ref", "adv", "update_actor")
    for r in train[1:]:
        assert r["timing_s/weight_push"] > 0.0
        assert r["timing_s/step"] >= sum(r.get(f"timing_s/{p}", 0.0) for p in parts) - 1e-6, r
    # syncs landed inside samples (one token a segment): some samples hold tokens of two versions
    assert any(r["fully_async/partial/total_partial_num"] > 0 for r in train[1:])
    assert train[1]["fully_async/version_lag/max"] == 1.0 and 0 < train[1]["rollout_corr/rollout_is_max"] <= 2.0


def demo_args(demo_prepared, out) -> list[str]:
    """The demo's job (configs/demo.yaml) on the demo's data and warmed-up model (tests/e2e/conftest.py)."""
    return ["--config-name", "demo", f"data.train_files={demo_prepared['train']}",
            f"data.val_files={demo_prepared['test']}", f"actor_rollout_ref.model.path={demo_prepared['model']}",
            f"trainer.default_local_dir={out / 'checkpoints'}"]


@pytest.fixture(scope="module")
def killed_run(demo_prepared, tmp_path_factory) -> dict:
    """The demo in this mode (a checkpoint every 2 steps) with its rollout worker SIGKILLed after step 2."""
    tmp = tmp_path_factory.mktemp("killed")
    out, stdout = tmp / "demo", tmp / "stdout.txt"
    log = open(stdout, "w+")
    proc = subprocess.Popen([sys.executable, "-m", "hybridrl.trainer.main_ppo", *demo_args(demo_prepared, out),
                             *ASYNC, "trainer.total_training_steps=50", "async_training.staleness_threshold=2",
                             "async_training.trigger_parameter_sync_step=2", "trainer.save_freq=2"],
                            cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 200
        while len(train_rows(out)) < 2:
            assert proc.poll() is None and time.time() < deadline, open(stdout).read()[-4000:]
            time.sleep(0.5)
        pid = int(re.search(r"rollout rank 0 producer started \(pid (\d+)\)", open(stdout).read())[1])
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        code = proc.wait(timeout=90)
        exit_s = time.time() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return {"out": out, "text": open(stdout).read(), "code": code, "pid": pid, "exit_s": exit_s}


@pytest.mark.timeout(300)
def test_killed_rollout_worker_fails_fast_and_keeps_the_finished_samples(killed_run):
    text, code, pid = killed_run["text"], killed_run["code"], killed_run["pid"]
    assert killed_run["exit_s"] < 60
    assert code != 0, text[-3000:]
    assert re.search(rf"worker 'rollout' rank 0 \(pid {pid}", text), text[-4000:]
    spilled = re.search(r"finished sample groups were written to (\S+\.safetensors)", text)
    assert spilled, text[-4000:]
    groups = load_spilled(spilled[1])
    assert groups, "the queue held finished groups when the worker died (staleness_threshold=2)"
    for g in groups:  # whole groups: rollout.n rows of one prompt, every generated token tagged with its version
        b = g.batch
        assert b["responses"].shape[0] == 8 and len(set(g.non_tensor_batch["uid"])) == 1
        made = b["response_mask"].bool()
        assert made.any(-1).all() and (b["rollout_versions"][made] >= 0).all()
        assert (b["rollout_versions"][~made] == -1).all()


def oldest_versions(groups, resumed: int) -> list[int]:
    """Each group's oldest token version as the resumed run counts it: versions past the checkpoint's `resumed`
    were made by updates the resume discards, v -> 2 * resumed - v (hybridrl/trainer/spilled.py)."""
    out = []
    for g in groups:
        made = [v for v in g.batch["rollout_versions"].flatten().tolist() if v >= 0]
        out.append(min(v if v <= resumed else max(2 * resumed - v, 0) for v in made) if made else -1)
    return out


@pytest.mark.timeout(300)
def test_resumed_run_trains_the_spilled_groups_once(killed_run, demo_prepared, tmp_path):
    out = killed_run["out"]
    [spilled] = re.findall(r"finished sample groups were written to (\S+\.safetensors)", killed_run["text"])
    groups = load_spilled(spilled)
    uids = [str(g.non_tensor_batch["uid"][0]) for g in groups]
    resumed = max(int(p.name.split("_")[-1]) for p in (out / "checkpoints").glob("global_step_*"))
    oldest = oldest_versions(groups, resumed)
    # the resumed run's bound (staleness_threshold 0: trigger_parameter_sync_step - 1 updates) lets the oldest
    # spilled groups through at its first step only: some are trained, those left behind are stale at the next
    max_lag, per_step = resumed - min(v for v in oldest if v >= 0), 32
    # the reference: groups are taken first in first out, spilled ones before any new one; a group more than
    # max_lag updates older than the step's weights (version step - 1) is counted stale and not trained on
    want_trained, want_stale, i = [], [], 0
    while i < len(groups) or len(want_trained) < 2:
        step, trained, stale = resumed + 1 + len(want_trained), 0, 0
        while i < len(groups) and trained < per_step:
            trained, stale = (trained, stale + 1) if oldest[i] >= 0 and step - 1 - oldest[i] > max_lag else \
                (trained + 1, stale)
            i += 1
        want_trained.append(trained)
        want_stale.append(stale)
    steps = len(want_trained)
    proc = subprocess.run([sys.executable, "-m", "hybridrl.trainer.main_ppo", *demo_args(demo_prepared, out), *ASYNC,
                           f"trainer.total_training_steps={resumed + steps}", "async_training.staleness_threshold=0",
                           f"async_training.trigger_parameter_sync_step={max_lag + 1}", "trainer.save_freq=100"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert f"resumed from {out / 'checkpoints'}/global_step_{resumed}" in proc.stdout
    assert f"{len(groups)} finished sample group(s) from 1 spill file(s)" in proc.stdout, proc.stdout[-3000:]
    rows = {r["step"]: r for r in train_rows(out) if r["step"] > resumed}
    assert sorted(rows) == list(range(resumed + 1, resumed + 1 + steps))
    got = [[rows[s][f"fully_async/resume/spilled_{k}"] for s in sorted(rows)] for k in ("trained", "stale")]
    assert got == [want_trained, want_stale], (got, want_trained, want_stale)
    assert want_trained[0] > 0 and sum(want_trained) + sum(want_stale) == len(groups)
    assert all(r["fully_async/version_lag/max"] <= max_lag for r in rows.values())
    # the last checkpoint records every spilled group as consumed: a later resume takes none of them again
    state = json.load(open(out / "checkpoints" / f"global_step_{resumed + steps}" / "trainer_state.json"))
    assert set(state["dataloader"]["fully_async_spill"]["consumed"]) == set(uids)
    assert len(load_spilled(spilled)) == len(groups)  # the file is left as it was
