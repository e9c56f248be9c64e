"""SIGTERM and SIGINT during a run end it in a bounded time, saying where it can be resumed.

While training, the first signal asks the loop to stop after the step in flight and save it (the loop checks
`requested` after each step); if that has not happened within trainer.stop_grace_s, or a second signal comes,
RunStopped is raised at once. A signal during start-up stops the run when start-up ends (nothing to save yet),
or at once on the grace period or a second signal. The entry points print RunStopped as one line naming the last good
checkpoint (the commit marker of trainer.default_local_dir), never a KeyboardInterrupt traceback.

Under torchrun (trainer.backend=local) every rank is a driver and installs this. torchrun forwards a signal to
every rank, but not at the same instant: the ranks agree at each step boundary (`agreed`: an all-reduce of the
signal number, MAX, over gloo), so all of them stop after the same step and save it together, even a rank the signal
never reached. torchrun kills the ranks its own shutdown timeout after forwarding (TORCH_ELASTIC_SHUTDOWN_TIMEOUT or
--shutdown-timeout, default 30 s), so there the grace period is at most that less SHUTDOWN_MARGIN_S. Rank 0 alone
prints. `python -m hybridrl.torchrun` is torchrun without its own SignalException traceback.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Iterator, Optional

from .checkpoint_manager import read_marker

SIGNALS = (signal.SIGINT, signal.SIGTERM)
SHUTDOWN_MARGIN_S = 5.0  # under torchrun: stop this long before it kills the ranks, to print the line and exit
_active: Optional["StopSignals"] = None  # the installed handlers of this process (exit_when_stopped reads it)


class RunStopped(BaseException):
    """The run was stopped by a signal before it could save (BaseException: no `except Exception` swallows it)."""

    def __init__(self, signum: int, why: str) -> None:
        super().__init__(f"{signal.Signals(signum).name} ({why})")
        self.signum = signum


class StopSignals:
    """`ranks`: this process is one of torchrun's ranks (trainer.backend=local); `agreed` then makes them agree."""

    def __init__(self, grace_s: float, ranks: bool = False) -> None:
        self.ranks = ranks
        self.rank0 = not ranks or int(os.environ.get("RANK", "0")) == 0
        limit = torchrun_shutdown_timeout_s() if ranks else None
        self.grace_s = grace_s if limit is None else max(min(grace_s, limit - SHUTDOWN_MARGIN_S), 1.0)
        self.signum: Optional[int] = None
        self.training = False
        self._previous: dict[int, Any] = {}
        self._group: Any = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def __enter__(self) -> "StopSignals":
        self.install()
        return self

    def install(self) -> None:
        """(Again) make these the handlers: ray.init installs its own SIGTERM handler (sys.exit) in the driver."""
        if threading.current_thread() is not threading.main_thread():  # Python delivers signals there only
            return
        global _active
        for sig in SIGNALS:
            previous = signal.signal(sig, self._on_signal)
            self._previous.setdefault(sig, previous)
        _active = self

    def __exit__(self, *exc: Any) -> None:
        global _active
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if _active is self and not any(exc):  # on an exception exit_when_stopped, outside, still needs it
            _active = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise RunStopped(signum, "a second signal")
        self._note(signum, "received")

    def _note(self, signum: int, how: str) -> None:
        self.signum = signum
        what = "stopping after this step and saving it" if self.training else "stopping once start-up ends"
        if self.rank0:
            print(f"hybridrl: {self.name} {how}: {what} (at most {self.grace_s:g}s, trainer.stop_grace_s; send it "
                  "again to stop at once)", flush=True)
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self.grace_s)

    def agreed(self) -> bool:
        """At a step boundary: does the run stop here? Under torchrun every rank calls this at the same boundary
        and they agree: a signal on any rank stops all of them (one 4-byte all-reduce over gloo per step)."""
        if not self.ranks:
            return self.requested
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            return self.requested
        if self._group is None:  # a CPU tensor: gloo, beside a default group that may be NCCL
            self._group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        flag = torch.tensor([self.signum or 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        agreed = int(flag.item())
        if agreed and self.signum is None:  # it reached another rank first (or only)
            self._note(agreed, "received by another rank")
        # the answer is the reduced flag alone: a signal handled after this rank gave its flag (the handler runs when
        # the all-reduce returns) is this rank's news only, and stopping on it would leave the others training
        # while this one waits in the save's collectives; it counts at the next boundary, on every rank
        return agreed != 0

    def stopped_after(self, step: int, saved_to: Optional[str]) -> None:
        """The step in flight is done (and saved to `saved_to`, or not saved at all): the grace timer ends, and rank 0
        says so in one line. The trainers call this, then end the loop."""
        signal.setitimer(signal.ITIMER_REAL, 0)  # the rest of the shut-down may take its time
        where = (f"saved it to {saved_to} (trainer.resume_mode=auto continues)" if saved_to
                 else "nothing saved (trainer.save_freq=-1)")
        if self.rank0:
            print(f"hybridrl: stopped by {self.name} after step {step}; {where}", flush=True)

    def raise_if_requested(self) -> None:
        """At the end of start-up: a signal that came during it stops the run here, where nothing is half-done
        (raised from the handler, the exception would land inside Ray's start-up calls). Under torchrun the ranks
        agree first, so that all of them stop."""
        if self.agreed():
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise RunStopped(self.signum, "before training started")

    def _on_alarm(self, signum: int, frame: Any) -> None:
        raise RunStopped(self.signum or signum, f"the step and its save took longer than trainer.stop_grace_s="
                         f"{self.grace_s:g}s")


def torchrun_shutdown_timeout_s() -> Optional[float]:
    """How long torchrun waits for its ranks after forwarding a signal before it kills them; None: not under
    torchrun. Its --shutdown-timeout flag (read from the launcher's command line), else the environment, else 30."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        args = []
    launcher = [i for i, a in enumerate(args) if a in ("torch.distributed.run", "hybridrl.torchrun")
                or os.path.basename(a) == "torchrun"]  # also `hybridrl torchrun`
    return shutdown_timeout_s(args[launcher[0] + 1:] if launcher else [])


def shutdown_timeout_s(torchrun_args: list[str]) -> float:
    """torchrun's shutdown timeout for these arguments: --shutdown-timeout, PET_SHUTDOWN_TIMEOUT,
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else its default 30 s."""
    for i, a in enumerate(torchrun_args):
        if a in ("-m", "--module") or not a.startswith("-") and i and not torchrun_args[i - 1].startswith("--"):
            break  # the script's own arguments begin
        for flag in ("--shutdown-timeout", "--shutdown_timeout"):
            value = (a[len(flag) + 1:] if a.startswith(flag + "=") else
                     torchrun_args[i + 1] if a == flag and i + 1 < len(torchrun_args) else None)
            if value is not None:
                with contextlib.suppress(ValueError):
                    return float(value)
    for name in ("PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        with contextlib.suppress(KeyError, ValueError):
            return float(os.environ[name])
    return 30.0


def stopped_line(e: RunStopped, trainer_cfg: Any) -> str:
    """The one line an entry point prints for RunStopped: what stopped the run and where it can resume."""
    root = os.path.abspath(os.path.expanduser(trainer_cfg.default_local_dir))
    step = read_marker(root)
    where = (f"the last good checkpoint is {root}/global_step_{step} (trainer.resume_mode=auto resumes from it)"
             if step is not None else f"no checkpoint was saved in {root}")
    return f"hybridrl: stopped by {e}; {where}"


@contextlib.contextmanager
def exit_when_stopped(trainer_cfg: Any) -> Iterator[None]:
    """For entry points: RunStopped -> its one line on stderr, exit status 128 + the signal (as the shell's).
    Under torchrun, rank 0 prints it, and once a signal has come an error that is not RunStopped (a rank that lost
    its peers when they stopped at once) ends the rank the same way: no traceback."""
    global _active
    try:
        yield
    except BaseException as e:
        stop, signals = stop_in_chain(e), _active
        if stop is None and signals is not None and signals.ranks and signals.requested and not isinstance(e, SystemExit):
            stop = RunStopped(signals.signum, f"then {type(e).__name__}: another rank stopped at once")
        if stop is None:
            raise
        if signals is None or signals.rank0:
            print(stopped_line(stop, trainer_cfg), file=sys.stderr, flush=True)
        raise SystemExit(128 + stop.signum) from None
    finally:
        _active = None  # this run's handlers are gone


def stop_in_chain(e: Optional[BaseException]) -> Optional[RunStopped]:
    """RunStopped, also where a library wrapped it: raised inside Ray's Cython calls it comes back as the cause of a
    SystemError, which a checkpoint save or a worker call wraps again."""
    todo, seen = [e], 0
    while todo and seen < 32:  # both links: a wrapper may set __cause__ while RunStopped is the __context__
        e, seen = todo.pop(0), seen + 1
        if isinstance(e, RunStopped):
            return e
        todo += [x for x in (e.__cause__, e.__context__) if x is not None]
    return None
