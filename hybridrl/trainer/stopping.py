"""SIGTERM and SIGINT during a run end it in a bounded time, saying where it can be resumed.

While training, the first signal asks the loop to stop after the step in flight and save it (the loop checks
`requested` after each step); if that has not happened within trainer.stop_grace_s, or a second signal comes,
RunStopped is raised at once. A signal during start-up stops the run when start-up ends (nothing to save yet),
or at once on the grace period or a second signal. The entry points print RunStopped as one line naming the last good
checkpoint (the commit marker of trainer.default_local_dir), never a KeyboardInterrupt traceback.

Only the driver of the Ray backend installs this: under torchrun every rank is a driver and the ranks would not
agree on the step to stop at.
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


class RunStopped(BaseException):
    """The run was stopped by a signal before it could save (BaseException: no `except Exception` swallows it)."""

    def __init__(self, signum: int, why: str) -> None:
        super().__init__(f"{signal.Signals(signum).name} ({why})")
        self.signum = signum


class StopSignals:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.signum: Optional[int] = None
        self.training = False
        self._previous: dict[int, Any] = {}

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
        for sig in SIGNALS:
            previous = signal.signal(sig, self._on_signal)
            self._previous.setdefault(sig, previous)

    def __exit__(self, *exc: Any) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise RunStopped(signum, "a second signal")
        self.signum = signum
        what = "stopping after this step and saving it" if self.training else "stopping once start-up ends"
        print(f"hybridrl: {self.name} received: {what} (at most trainer.stop_grace_s={self.grace_s:g}s; send it again "
              "to stop at once)", flush=True)
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self.grace_s)

    def raise_if_requested(self) -> None:
        """At the end of start-up: a signal that came during it stops the run here, where nothing is half-done
        (raised from the handler, the exception would land inside Ray's start-up calls)."""
        if self.signum is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise RunStopped(self.signum, "before training started")

    def _on_alarm(self, signum: int, frame: Any) -> None:
        raise RunStopped(self.signum or signum, f"the step and its save took longer than trainer.stop_grace_s="
                         f"{self.grace_s:g}s")


def stopped_line(e: RunStopped, trainer_cfg: Any) -> str:
    """The one line an entry point prints for RunStopped: what stopped the run and where it can resume."""
    root = os.path.abspath(os.path.expanduser(trainer_cfg.default_local_dir))
    step = read_marker(root)
    where = (f"the last good checkpoint is {root}/global_step_{step} (trainer.resume_mode=auto resumes from it)"
             if step is not None else f"no checkpoint was saved in {root}")
    return f"hybridrl: stopped by {e}; {where}"


@contextlib.contextmanager
def exit_when_stopped(trainer_cfg: Any) -> Iterator[None]:
    """For entry points: RunStopped -> its one line on stderr, exit status 128 + the signal (as the shell's)."""
    try:
        yield
    except BaseException as e:
        stop = stop_in_chain(e)
        if stop is None:
            raise
        print(stopped_line(stop, trainer_cfg), file=sys.stderr, flush=True)
        raise SystemExit(128 + stop.signum) from None


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
