"""`python -m hybridrl.torchrun ARGS` (also `hybridrl torchrun ARGS`): torchrun (torch.distributed.run) with the
same arguments, which ends on SIGTERM/SIGINT with the shell's status (128 + the signal) instead of its own
SignalException traceback.

torchrun forwards the signal to every rank and waits for them (its --shutdown-timeout, default 30 s): hybridrl's
ranks finish the step in flight, save it and print one line (trainer/stopping.py). What torchrun itself then did was
to raise SignalException out of its main, a traceback under the ranks' clean line.
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
