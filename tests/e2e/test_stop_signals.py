"""SIGTERM and SIGINT end a real run (demo config: Ray, 2 workers, megatron-core over gloo) cleanly: the first
SIGTERM lets the step in flight finish and saves it, a resumed run stopped by two SIGINTs names that checkpoint in
one line, no traceback; and neither run leaves Ray's session folder or the workers' temp folders behind."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def prepared(demo_prepared):
    """The demo's data and tiny model (tests/e2e/conftest.py: once for the session; what it learned plays no part)."""
    return demo_prepared


class Run:
    """main_ppo in its own process, its output read line by line as it comes."""

    def __init__(self, prepared, out, tmpdir, *extra):
        args = ["--config-name", "demo", f"data.train_files={prepared['train']}", f"data.val_files={prepared['test']}",
                f"actor_rollout_ref.model.path={prepared['model']}", f"trainer.default_local_dir={out}",
                "trainer.total_training_steps=200", "trainer.save_freq=1000", "trainer.test_freq=-1",
                "trainer.val_before_train=false", "trainer.logger=[console]", "trainer.plot=false",
                "trainer.progress_bar=false", "+ray_kwargs.ray_init.address=local", *extra]
        env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1", TMPDIR=tmpdir, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "hybridrl.trainer.main_ppo", *args], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lines: list[str] = []

    def wait_for(self, prefix: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if select.select([self.proc.stdout], [], [], 1.0)[0]:
                line = self.proc.stdout.readline()
                self.lines.append(line)
                if line.startswith(prefix):
                    return
        raise AssertionError(f"no line starting with {prefix!r} in {timeout}s:\n{''.join(self.lines[-40:])}")

    def finish(self, timeout: float) -> tuple[int, str, float]:
        start = time.monotonic()
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, "".join(self.lines) + out, time.monotonic() - start


@pytest.mark.timeout(600)
def test_sigterm_saves_the_step_and_two_sigints_name_it_without_residue(prepared, tmp_path):
    out = tmp_path / "ckpt"
    tmpdir = tempfile.mkdtemp(prefix="t", dir="/tmp")  # the runs' system temp folder: must be empty after each
    try:
        run = Run(prepared, out, tmpdir)
        run.wait_for("step 1 |", 300)
        run.proc.send_signal(signal.SIGTERM)
        code, text, seconds = run.finish(120)
        assert code == 128 + signal.SIGTERM, text[-3000:]
        step = int(next(ln for ln in text.splitlines() if ln.startswith("hybridrl: stopped by SIGTERM after step "))
                   .split("after step ")[1].split(";")[0])
        assert f"saved it to {out}/global_step_{step} (trainer.resume_mode=auto continues)" in text
        assert (out / f"global_step_{step}" / ".complete").exists() and seconds < 90
        assert "Traceback" not in text
        assert os.listdir(tmpdir) == [], os.listdir(tmpdir)  # no Ray session_*, no tmp*wandb-* of the workers

        again = Run(prepared, out, tmpdir)
        again.wait_for(f"hybridrl: resumed from {out}/global_step_{step}", 300)
        again.wait_for(f"step {step + 1} |", 300)
        again.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        again.proc.send_signal(signal.SIGINT)
        code, text, seconds = again.finish(120)
        assert code == 128 + signal.SIGINT, text[-3000:]
        last = [ln for ln in text.splitlines() if ln.startswith("hybridrl: stopped by SIGINT")]
        assert last and last[-1].endswith("(trainer.resume_mode=auto resumes from it)"), text[-3000:]
        assert f"the last good checkpoint is {out}/global_step_" in last[-1]
        assert "KeyboardInterrupt" not in text and "Traceback" not in text, text[-3000:]
        assert os.listdir(tmpdir) == [], os.listdir(tmpdir)
    finally:
        import shutil

        shutil.rmtree(tmpdir, ignore_errors=True)


@pytest.mark.timeout(300)
def test_sigterm_during_start_up_stops_at_once_in_one_line(prepared, tmp_path):
    tmpdir = tempfile.mkdtemp(prefix="t", dir="/tmp")
    try:
        run = Run(prepared, tmp_path / "ckpt", tmpdir)
        run.wait_for("hybridrl INFO [hybridrl.controller.runtime_env] starting Ray", 120)
        time.sleep(3)  # inside ray.init or the workers' start
        run.proc.send_signal(signal.SIGTERM)
        code, text, seconds = run.finish(60)
        assert code == 128 + signal.SIGTERM and seconds < 30, text[-3000:]
        assert "hybridrl: stopped by SIGTERM (before training started); no checkpoint was saved in" in text
        assert "Traceback" not in text, text[-3000:]
        time.sleep(2)  # Ray's own processes end after the driver
        assert os.listdir(tmpdir) == [], os.listdir(tmpdir)
    finally:
        import shutil

        shutil.rmtree(tmpdir, ignore_errors=True)
