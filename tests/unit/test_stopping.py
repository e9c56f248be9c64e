"""stopping.py in-process, with real signals sent to this process: the first asks, a second or the grace period
stops at once, start-up defers to its end, and a RunStopped wrapped by a library is still found."""
import os
import signal
import time

import pytest

from hybridrl.config.schema import TrainerConfig
from hybridrl.trainer.stopping import RunStopped, StopSignals, exit_when_stopped, stop_in_chain


def test_first_signal_asks_second_stops_at_once():
    with StopSignals(grace_s=30) as s:
        s.training = True
        os.kill(os.getpid(), signal.SIGTERM)
        assert s.requested and s.name == "SIGTERM"
        with pytest.raises(RunStopped, match="SIGINT \\(a second signal\\)"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs between bytecodes; never reached
    assert signal.getsignal(signal.SIGTERM) is not s._on_signal  # the previous handlers are back


def test_the_grace_period_bounds_the_wait():
    with StopSignals(grace_s=0.2) as s:
        s.training = True
        os.kill(os.getpid(), signal.SIGTERM)
        start = time.monotonic()
        with pytest.raises(RunStopped, match="longer than trainer.stop_grace_s=0.2s"):
            time.sleep(5)
        assert time.monotonic() - start < 2


def test_a_signal_during_start_up_stops_when_it_ends():
    with StopSignals(grace_s=30) as s:
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: start-up goes on
        with pytest.raises(RunStopped, match="before training started"):
            s.raise_if_requested()


def test_a_wrapped_stop_becomes_one_line_naming_the_last_checkpoint(tmp_path, capsys):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2\n")
    try:
        raise RunStopped(signal.SIGINT, "a second signal")
    except RunStopped as stop:  # as Ray's Cython calls wrap it ...
        wrapped = SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set")
        wrapped.__cause__ = stop
    with pytest.raises(SystemExit) as err, exit_when_stopped(TrainerConfig(default_local_dir=str(tmp_path))):
        raise RuntimeError("checkpoint step 4: saving actor failed") from wrapped  # ... and then the save
    assert err.value.code == 130
    assert capsys.readouterr().err.strip() == (f"hybridrl: stopped by SIGINT (a second signal); the last good checkpoint "
                                               f"is {tmp_path}/global_step_2 (trainer.resume_mode=auto resumes from it)")
    assert stop_in_chain(ValueError("unrelated")) is None
