"""`python -m hybridrl.torchrun ARGS` (also `hybridrl torchrun ARGS`): torchrun (torch.distributed.run) with the
same arguments, which ends on SIGTERM/SIGINT with the shell's status (128 + the signal) instead of its own
SignalException traceback.

torchrun forwards a signal to every rank and waits for them (its --shutdown-timeout, default 30 s, then SIGKILL):
hybridrl's ranks finish the step in flight, save it and print one line (trainer/stopping.py). A second signal while
it waits reaches the ranks as SIGTERM (torchrun's shutdown runs again): they stop at once, rank 0 naming the last
good checkpoint. Either way torchrun then raised SignalException out of its main: a traceback under the ranks' line.
"""
from __future__ import annotations

import sys
from typing import Optional


def main(argv: Optional[list[str]] = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun(sys.argv[1:] if argv is None else argv)
    except SignalException as e:  # the ranks were given the signal and have ended (or were killed at the timeout)
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
