"""Faults in a real run (demo config: Ray, 2 worker processes, megatron-core over gloo, torch engine).

Every run trains the same prepared model on the same data; the uninterrupted 4-step run is the
reference. A run that is killed (the trainer with kill -9, SIGTERM in the middle of a checkpoint save,
kill -9 of one Ray worker) must fail fast and loudly, and a `resume_mode=auto` restart must reproduce
the reference's steps 3 and 4: the same metrics and byte-identical model + optimizer shards of the
step-4 checkpoint. A hung rank must fail the run within the configured timeouts, naming rank and role;
NaN/Inf updates must stop the run (on_nonfinite=error) or leave the weights untouched (skip). A secret
passed to the run must not land in any file of the run or in its output.

Deterministic, not timing luck: fault points come from tests/e2e/fault_helpers/launch.py, which runs the
normal entry point with driver-side pauses (it touches a flag file and waits) at a named worker call or
inside the checkpoint write. Every trainer starts in its own session; whatever the test does, all
processes of that session (driver, Ray's services, workers) are killed in a `finally`.
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from typing import Optional

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from procs import cmdline, kill_session, session_pids  # noqa: E402  (benchmarks/procs.py: one home, shared with two_nodes_kill.py)

LAUNCH = os.path.join(ROOT, "tests", "e2e", "fault_helpers", "launch.py")
TOKEN_REWARD = os.path.join(ROOT, "tests", "e2e", "fault_helpers", "token_reward.py")
SECRET = "hrl-SECRET123-token"  # its sha256 is in token_reward.py
ENV_SECRET = "hrl-SECRET456-wandb"
RUN_TIMEOUT_S = 240  # one trainer process, start to exit
# Metrics that must be present and equal between a resumed run and the reference (all others are
# compared too, except wall-clock ones).
KEY_METRICS = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss",
               "actor/ppo_kl", "actor/lr", "response_length/mean", "rollout_vs_actor/logprob_abs_diff_mean",
               "critic/advantages/mean", "actor/update_applied")
CLOCK = re.compile(r"^(timing_s/|timing_per_token_ms/|perf/throughput|perf/time_per_step|perf/mfu)")
# How the weights reached the engine, not what they are: the first sync after a (re)start streams every
# weight and proves the direct copy, later ones copy directly, so these differ after a resume by design.
SYNC_PATH = re.compile(r"^(reshard/(buckets|tensors|max_bucket_bytes|direct_bytes|direct_graph|direct_captured)"
                       r"|sync_check/(tensors_checked|direct_checked))$")


# ------------------------------------------------------------------------------------------ processes
class Trainer:
    """A trainer subprocess in its own session, output in files; `with` kills the whole session."""

    def __init__(self, name: str, folder, args: list[str], helper: Optional[list[str]] = None,
                 env: Optional[dict] = None) -> None:
        self.name, self.folder = name, str(folder)
        self.victim: Optional[int] = None  # a worker signalled by signal_at_pause
        self.stdout_path = os.path.join(self.folder, f"{name}.stdout")
        self.stderr_path = os.path.join(self.folder, f"{name}.stderr")
        cmd = [sys.executable, LAUNCH, *(helper or []), "--", *args] if helper is not None else \
            [sys.executable, "-m", "hybridrl.trainer.main_ppo", *args]
        full_env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        full_env.update(PYTHONPATH=ROOT, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **(env or {}))
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=out, stderr=err, start_new_session=True)

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        kill_session(self.proc.pid)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    @property
    def output(self) -> str:
        with open(self.stdout_path, errors="replace") as out, open(self.stderr_path, errors="replace") as err:
            return out.read() + "\n" + err.read()

    def tail(self, n: int = 6000) -> str:
        return f"--- {self.name} output (tail) ---\n{self.output[-n:]}"

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout} s\n{self.tail()}") from None

    def wait_for_output(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {text!r} in its output after {timeout} s\n{self.tail()}")
            time.sleep(0.2)

    def wait_for_file(self, path: str, timeout: float = RUN_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before {path} appeared\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {path} after {timeout} s\n{self.tail()}")
            time.sleep(0.05)

    def signal_at_pause(self, flag: str, go: str, pids_file: str, role: str, rank: int, sig: int,
                        wait_s: float) -> tuple[int, int, float]:
        """At the launch helper's pause: send `sig` to worker `role` rank `rank`, let the trainer go on and wait
        for it to exit. Returns (the worker's pid, the trainer's exit code, seconds from the signal to the exit);
        `self.victim` holds the pid from the moment it is signalled."""
        self.wait_for_file(flag)
        victim = json.load(open(pids_file))[role][rank]
        assert victim in session_pids(self.proc.pid) and "ray::" in cmdline(victim)
        self.victim = victim
        os.kill(victim, sig)
        start = time.monotonic()
        open(go, "w").close()
        rc = self.wait(wait_s)
        return victim, rc, time.monotonic() - start

    def assert_session_gone(self, within_s: float) -> None:
        """After the trainer exited: nothing it started (Ray services, workers) may stay alive."""
        deadline = time.monotonic() + within_s
        while session_pids(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {p: cmdline(p)[:120] for p in session_pids(self.proc.pid) if os.path.exists(f"/proc/{p}")}
        assert not left, f"{self.name}: processes left {within_s} s after the trainer exited: {left}"


def run_to_end(name: str, folder, args: list[str], env: Optional[dict] = None) -> Trainer:
    with Trainer(name, folder, args, env=env) as t:
        rc = t.wait()
        assert rc == 0, f"{name} failed with {rc}\n{t.tail()}"
    return t


# ------------------------------------------------------------------------------------------ runs
@pytest.fixture(scope="module")
def prepared(demo_prepared):
    """The demo's data and warmed-up tiny model (tests/e2e/conftest.py: once for the session)."""
    return demo_prepared


def trainer_args(prepared, out, *extra: str) -> list[str]:
    return ["--config-name", "demo", f"data.train_files={prepared['train']}", f"data.val_files={prepared['test']}",
            f"actor_rollout_ref.model.path={prepared['model']}", f"trainer.default_local_dir={out}",
            "trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.test_freq=-1",
            "trainer.val_before_train=false", "trainer.logger=[jsonl]", "trainer.plot=false",
            "trainer.resume_mode=auto", "+ray_kwargs.ray_init.address=local", *extra]


def metrics_by_step(out) -> dict[int, dict]:
    """{step: row} of metrics.jsonl (a resumed run appends; the last row of a step wins)."""
    rows = {}
    with open(os.path.join(str(out), "logs", "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            rows[row["step"]] = row
    return rows


def marker(out) -> Optional[str]:
    path = os.path.join(str(out), "latest_checkpointed_iteration.txt")
    return open(path).read().strip() if os.path.exists(path) else None


def shard_bytes(step_dir: str) -> dict[str, bytes]:
    """The model + optimizer shards of a role checkpoint (megatron dist_checkpointing files)."""
    files = sorted(glob.glob(os.path.join(step_dir, "actor", "dist", "*.distcp")))
    assert files, f"no shards under {step_dir}/actor/dist"
    return {os.path.basename(p): open(p, "rb").read() for p in files}


def assert_rows_match(reference: dict, rows: dict[int, dict], steps=(3, 4)) -> None:
    for step in steps:
        ref, got = reference["rows"][step], rows[step]
        for key in KEY_METRICS:
            assert key in got, f"step {step}: {key} missing"
        compared = sorted(k for k in ref if not CLOCK.match(k))
        assert sorted(k for k in got if not CLOCK.match(k)) == compared, f"step {step}: other metrics"
        diff = {k: (got[k], ref[k]) for k in compared
                if not SYNC_PATH.match(k) and got[k] != pytest.approx(ref[k], rel=1e-6, abs=1e-9)}
        assert not diff, f"step {step}: resumed (got, reference) differ: {diff}"


def assert_matches_reference(reference: dict, out) -> None:
    """Steps 3 and 4 of a resumed run equal the reference's, and so does its step-4 checkpoint."""
    assert_rows_match(reference, metrics_by_step(out), steps=(3, 4))
    # after step 4: the same weights and Adam moments, bit for bit
    assert shard_bytes(os.path.join(str(out), "global_step_4")) == reference["shards"]
    assert marker(out) == "4"
    assert os.path.exists(os.path.join(str(out), "global_step_4", ".complete"))


@pytest.fixture(scope="module")
def reference(one_node_reference):
    """The uninterrupted run: trainer_args(prepared, ...) to the end (tests/e2e/conftest.py runs it once for the
    session; test_two_nodes.py compares its layouts against the same run)."""
    return one_node_reference


# ------------------------------------------------------------------------------------------ tests
@pytest.mark.timeout(300)
def test_reference_run_trains_four_steps_and_commits_two_checkpoints(reference):
    rows, out = reference["rows"], reference["out"]
    assert sorted(rows) == [1, 2, 3, 4]
    for step, row in rows.items():
        assert row["actor/update_applied"] == 1.0
        for key in KEY_METRICS:
            assert math.isfinite(float(row[key])), (step, key, row[key])
    # the run learns something step to step: a resumed run that silently restarted from the initial
    # weights or the first batch would not reproduce these
    assert len({rows[s]["actor/pg_loss"] for s in rows}) == 4
    assert marker(out) == "4"
    for step in (2, 4):
        assert os.path.exists(os.path.join(str(out), f"global_step_{step}", ".complete"))


@pytest.mark.timeout(600)
def test_trainer_kill9_worker_kill9_sigterm_mid_save_then_resume_matches_reference(prepared, reference, tmp_path):
    """Three faults on one checkpoint folder, each run restarting from what the one before left (two restarts
    fewer than a folder per fault):
    1. kill -9 of the trainer's whole session right after step 3's actor update went to the workers: nothing of
       it may stay alive, and only steps 1 and 2 are logged and committed;
    2. the auto-resumed restart (from step 2) loses Ray worker rank 1 just before its first actor update
       (step 3): the trainer must exit non-zero within 60 s naming the dead rank and role, and leave no process
       behind;
    3. the next restart gets SIGTERM twice while it writes step 4's checkpoint (actor part saved, trainer state not
       yet; the first signal asks for the step to finish and be saved, the second stops at once, as the first
       one's message says): it must exit non-zero quickly, the marker must still say 2 and step 4 must not look
       complete;
    4. a last restart, carrying a secret, resumes from step 2 again and reproduces the reference's steps 3
       and 4; the secret is nowhere in the run's files or output."""
    out = tmp_path / "ckpt"
    flag, go, pids_file = str(tmp_path / "paused"), str(tmp_path / "go"), str(tmp_path / "pids.json")
    resumed_line = f"hybridrl: resumed from {out}/global_step_2 (step 2)"
    # pause right after step 3's actor update went to the workers: marker 2, step 3 half done
    with Trainer("killed", tmp_path, trainer_args(prepared, out),
                 helper=["--flag", flag, "--go", go, "--pause", "update_actor:3:after"]) as t:
        t.wait_for_file(flag)
        assert marker(out) == "2"
        os.killpg(t.proc.pid, signal.SIGKILL)
        assert t.wait(30) == -signal.SIGKILL
        # Ray's workers sit in their own process groups: they must go away with their raylet
        t.assert_session_gone(within_s=30)
    assert sorted(metrics_by_step(out)) == [1, 2]
    assert not os.path.exists(out / "global_step_4")

    os.remove(flag)
    # the restart's first actor update is step 3's
    helper = ["--flag", flag, "--go", go, "--pids", pids_file, "--pause", "update_actor:1:before"]
    with Trainer("worker_killed", tmp_path, trainer_args(prepared, out), helper=helper) as t:
        # rank 1 dies; rank 0 will meet it in the update's all-reduce
        victim, rc, took = t.signal_at_pause(flag, go, pids_file, "actor_rollout_ref", 1, signal.SIGKILL, 120)
        assert rc != 0, t.tail()
        assert took < 60, f"the trainer took {took:.1f} s to fail\n{t.tail()}"
        assert resumed_line in t.output
        assert re.search(rf"WorkerDiedError: worker 'actor_rollout_ref' rank 1 \(pid {victim}\) died during "
                         r"update_actor\(\)", t.output), t.tail()
        t.assert_session_gone(within_s=30)
    assert marker(out) == "2" and not (out / "global_step_4").exists()
    assert sorted(metrics_by_step(out)) == [1, 2]

    saving = str(tmp_path / "saving")
    with Trainer("terminated", tmp_path, trainer_args(prepared, out), helper=["--flag", saving, "--slow-save", "4"]) as t:
        t.wait_for_file(saving)  # step 4's actor part is on disk; trainer_state.json is being written
        assert marker(out) == "2"
        start = time.monotonic()
        os.killpg(t.proc.pid, signal.SIGTERM)
        # the group's signal also reaches Ray's own processes, so the save cannot finish: a second one stops at once
        # (a single one would wait for trainer.stop_grace_s)
        t.wait_for_output("SIGTERM received", 20)
        os.killpg(t.proc.pid, signal.SIGTERM)
        rc = t.wait(60)
        took = time.monotonic() - start
        assert rc != 0, t.tail()
        assert took < 30, f"SIGTERM took {took:.1f} s to end the trainer\n{t.tail()}"
        assert resumed_line in t.output
        t.assert_session_gone(within_s=30)
    step4 = out / "global_step_4"
    assert marker(out) == "2"
    assert (step4 / "actor" / "meta.json").is_file() and not (step4 / ".complete").exists()
    assert not (step4 / "trainer_state.json").exists()
    # the restart after the two kills trained step 3 again, as the reference did
    assert sorted(metrics_by_step(out)) == [1, 2, 3]
    assert_rows_match(reference, metrics_by_step(out), steps=(3,))

    # the last restart carries a secret (a reward-function token and a W&B key in the environment)
    args = trainer_args(prepared, out, f"custom_reward_function.path={TOKEN_REWARD}",
                        f"+custom_reward_function.reward_kwargs.api_token={SECRET}")
    resumed = run_to_end("resumed", tmp_path, args, env={"WANDB_API_KEY": ENV_SECRET})
    assert resumed_line in resumed.output
    assert_matches_reference(reference, out)
    assert_no_secret_in(tmp_path, resumed, (SECRET, ENV_SECRET))


def assert_no_secret_in(folder, trainer: Trainer, secrets: tuple[str, ...]) -> None:
    """No file under the run folder (checkpoints, config.yaml, metrics, captured output) holds a secret,
    while the saved config shows the key was there (redacted), so the check is not vacuous."""
    config = open(os.path.join(str(folder), "ckpt", "global_step_4", "config.yaml")).read()
    assert re.search(r"api_token: .?\*\*\*REDACTED\*\*\*", config), config[-2000:]
    scanned = 0
    for path in glob.glob(os.path.join(str(folder), "**", "*"), recursive=True) + \
            glob.glob(os.path.join(str(folder), "**", ".*"), recursive=True):
        if os.path.isfile(path):
            data = open(path, "rb").read()
            scanned += 1
            for s in secrets:
                assert s.encode() not in data, f"secret found in {path}"
    assert scanned > 10
    for s in secrets:
        assert s not in trainer.output


@pytest.mark.timeout(300)
def test_hung_rank_fails_the_collective_within_dist_timeout_naming_rank_and_role(prepared, tmp_path):
    """Rank 1 frozen (SIGSTOP) just before the first actor update: rank 0 waits for it in the gradient
    all-reduce (megatron's data-parallel group) and must fail after trainer.dist_timeout_s, and the
    error must name the rank that never finished. worker_timeout_s is a long backstop here."""
    out = tmp_path / "ckpt"
    flag, go, pids_file = str(tmp_path / "paused"), str(tmp_path / "go"), str(tmp_path / "pids.json")
    dist_timeout = 15
    helper = ["--flag", flag, "--go", go, "--pids", pids_file, "--pause", "update_actor:1:before"]
    args = trainer_args(prepared, out, "trainer.total_training_steps=1", "trainer.save_freq=-1",
                        f"trainer.dist_timeout_s={dist_timeout}", "trainer.worker_timeout_s=200")
    t = Trainer("hung", tmp_path, args, helper=helper)
    try:
        with t:
            _, rc, took = t.signal_at_pause(flag, go, pids_file, "actor_rollout_ref", 1, signal.SIGSTOP, 180)
            assert rc != 0, t.tail()
            assert took < dist_timeout + 45, f"the trainer took {took:.1f} s to fail\n{t.tail()}"
            text = t.output
            assert re.search(r"worker 'actor_rollout_ref' rank 0 \(pid \d+ on [^)]*\) raised \w+ in update_actor\(\)",
                             text), t.tail()
            assert "rank(s) [1] had not finished update_actor()" in text, t.tail()
            t.assert_session_gone(within_s=30)  # the frozen worker too: Ray's kill is a SIGKILL
    finally:
        if t.victim is not None:
            try:
                os.kill(t.victim, signal.SIGCONT)
            except ProcessLookupError:
                pass


@pytest.mark.timeout(300)
def test_rollout_worker_kill9_mid_broadcast_names_the_rollout_rank(prepared, tmp_path):
    """Split placement, one step off: the rollout worker is killed just before its second weight receive (the
    push of update 1 at step 2), while actor rank 0 already waits in the broadcast. The trainer must fail fast
    naming the dead rollout rank, not actor rank 0's collective error that follows from it."""
    out = tmp_path / "ckpt"
    flag, go, pids_file = str(tmp_path / "paused"), str(tmp_path / "go"), str(tmp_path / "pids.json")
    helper = ["--flag", flag, "--go", go, "--pids", pids_file, "--pause", "receive_weights:2:before"]
    args = trainer_args(prepared, out, "trainer.save_freq=-1", "trainer.dist_timeout_s=120",
                        "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=1",
                        "actor_rollout_ref.rollout.calculate_log_probs=true", "trainer.one_step_off_policy=true")
    with Trainer("rollout_killed", tmp_path, args, helper=helper) as t:
        victim, rc, took = t.signal_at_pause(flag, go, pids_file, "rollout", 0, signal.SIGKILL, 120)
        assert rc != 0, t.tail()
        assert took < 60, f"the trainer took {took:.1f} s to fail\n{t.tail()}"
        assert re.search(rf"WorkerDiedError: worker 'rollout' rank 0 \(pid {victim}\) died during receive_weights\(\)",
                         t.output), t.tail()
        t.assert_session_gone(within_s=30)


@pytest.mark.timeout(300)
def test_nonfinite_loss_errors_before_the_checkpoint(prepared, tmp_path):
    # entropy_coeff=1e39 overflows float32 in the loss: an inf loss, NaN gradients
    out = tmp_path / "ckpt"
    args = trainer_args(prepared, out, "actor_rollout_ref.actor.entropy_coeff=1e39", "trainer.save_freq=1",
                        "trainer.total_training_steps=2", "trainer.on_nonfinite=error")
    with Trainer("nonfinite_error", tmp_path, args) as t:
        rc = t.wait()
        assert rc != 0
        assert re.search(r"NonFiniteError: step 1: actor/grad_norm=(nan|inf|-inf); the update is not checkpointed",
                         t.output), t.tail()
        t.assert_session_gone(within_s=30)
    assert marker(out) is None
    assert not glob.glob(str(out / "global_step_*"))


@pytest.mark.timeout(300)
def test_nonfinite_loss_skip_leaves_the_weights_untouched(prepared, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "ckpt"
    args = trainer_args(prepared, out, "actor_rollout_ref.actor.entropy_coeff=1e39", "trainer.total_training_steps=2",
                        "trainer.on_nonfinite=skip")
    run_to_end("nonfinite_skip", tmp_path, args)
    rows = metrics_by_step(out)
    assert sorted(rows) == [1, 2]
    for row in rows.values():
        assert row["training/nonfinite_skipped"] == 1.0 and row["actor/update_applied"] == 0.0
        assert not math.isfinite(float(row["actor/grad_norm"]))
    merged = tmp_path / "merged"
    proc = subprocess.run([sys.executable, "-m", "hybridrl.model_merger", "merge", "--backend", "megatron",
                           "--local_dir", str(out / "global_step_2" / "actor"), "--target_dir", str(merged)],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import torch

    initial = load_file(os.path.join(prepared["model"], "model.safetensors"))
    saved = {}
    for path in glob.glob(str(merged / "*.safetensors")):
        saved.update(load_file(path))
    assert sorted(saved) == sorted(initial)
    changed = [k for k in initial if not torch.equal(saved[k], initial[k])]
    assert not changed, f"skipped updates changed {changed}"
