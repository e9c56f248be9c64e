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


def test_under_torchrun_the_grace_ends_before_torchrun_kills_the_ranks(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert StopSignals(grace_s=60, ranks=True).grace_s == 60  # not under torchrun: as configured
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.delenv("PET_SHUTDOWN_TIMEOUT", raising=False)
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    assert StopSignals(grace_s=60, ranks=True).grace_s == 25  # torchrun's default 30 s less the margin
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "120")
    assert StopSignals(grace_s=60, ranks=True).grace_s == 60
    assert StopSignals(grace_s=60, ranks=False).grace_s == 60  # Ray's driver: no torchrun to kill it


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_that_loses_its_peers_after_a_signal_ends_as_stopped(rank, tmp_path, capsys, monkeypatch):
    """Under torchrun: once a signal came, a peer that stopped at once makes this rank's next collective fail; that
    ends it as the stop does (exit 143, rank 0's one line, nothing from the others), not as a traceback."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3\n")
    with pytest.raises(SystemExit) as err, exit_when_stopped(TrainerConfig(default_local_dir=str(tmp_path))):
        with StopSignals(grace_s=30, ranks=True) as s:
            s.training = True
            os.kill(os.getpid(), signal.SIGTERM)
            assert s.requested
            raise RuntimeError("[gloo] Connection closed by peer")
    assert err.value.code == 128 + signal.SIGTERM
    captured = capsys.readouterr()
    expected = (f"hybridrl: stopped by SIGTERM (then RuntimeError: another rank stopped at once); the last good "
                f"checkpoint is {tmp_path}/global_step_3 (trainer.resume_mode=auto resumes from it)")
    assert captured.err.strip() == (expected if rank == 0 else "")
    assert (captured.out.startswith("hybridrl: SIGTERM received") if rank == 0 else captured.out == "")
    with pytest.raises(ValueError), exit_when_stopped(TrainerConfig(default_local_dir=str(tmp_path))):
        raise ValueError("no signal came: an error stays an error")


def test_torchruns_shutdown_timeout_from_its_arguments(monkeypatch):
    from hybridrl.trainer.stopping import shutdown_timeout_s

    monkeypatch.delenv("PET_SHUTDOWN_TIMEOUT", raising=False)
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "40")
    assert shutdown_timeout_s(["--standalone", "--shutdown-timeout", "12", "-m", "x"]) == 12
    assert shutdown_timeout_s(["--shutdown_timeout=7", "x.py"]) == 7
    assert shutdown_timeout_s(["--nproc_per_node", "2", "x.py", "--shutdown-timeout", "9"]) == 40  # the script's
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    assert shutdown_timeout_s(["-m", "hybridrl.trainer.main_sft"]) == 30


def test_ranks_agree_on_the_reduced_flag_not_on_a_signal_that_came_during_the_all_reduce(monkeypatch):
    """torchrun forwards SIGTERM to the ranks at different instants. A signal whose handler runs when this rank's
    all-reduce returns (its flag, 0, already given) must not stop this rank alone: the peer got 0 and trains on,
    and this rank would wait for it in the save's collectives until torchrun kills both (seen: a 90 s hang)."""
    import torch
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a, **k: "gloo")
    peers = {"flag": 0}

    with StopSignals(grace_s=30, ranks=True) as s:
        s.training = True

        def all_reduce(flag, op=None, group=None):  # the peer's flag, then the signal lands as the call returns
            flag.copy_(torch.maximum(flag, torch.tensor([peers["flag"]], dtype=flag.dtype)))
            os.kill(os.getpid(), signal.SIGTERM)

        monkeypatch.setattr(dist, "all_reduce", all_reduce)
        assert not s.agreed()  # both ranks gave 0: neither stops at this boundary
        assert s.requested  # the signal is kept for the next boundary
        monkeypatch.setattr(dist, "all_reduce", lambda flag, op=None, group=None: None)
        assert s.agreed()  # where this rank's flag carries it to every rank
        peers["flag"] = signal.SIGTERM
    s2 = StopSignals(grace_s=30, ranks=True)
    with s2:
        monkeypatch.setattr(dist, "all_reduce",
                            lambda flag, op=None, group=None: flag.copy_(torch.tensor([peers["flag"]])))
        assert s2.agreed() and s2.signum == signal.SIGTERM  # the peer's signal stops this rank too
