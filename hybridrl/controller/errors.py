"""Errors a worker group raises at the driver, each naming the rank and role that failed.

A worker never lets an exception escape into the transport (Ray or the local all-gather): it returns a
`RemoteFailure` record instead, so the driver can raise one `WorkerError` that carries the remote
traceback, and so every torchrun rank of the local backend raises the same error instead of some ranks
waiting in a collective for a peer that already failed.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RemoteFailure:
    """What a worker sends back instead of a result when its method raised."""

    rank: int
    role: str
    method: str
    exc_type: str
    message: str
    traceback: str
    pid: int
    host: str


class WorkerError(RuntimeError):
    """A worker raised (or could not run) a group method. `rank`/`role` say which one."""

    def __init__(self, message: str, *, rank: int | None, role: str, method: str, remote_traceback: str = ""):
        self.rank = rank
        self.role = role
        self.method = method
        self.message = message
        self.remote_traceback = remote_traceback
        text = message
        if remote_traceback:
            text += f"\n--- remote traceback ({role} rank {rank}) ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def with_note(self, note: str) -> "WorkerError":
        """The same error (same class, rank, role, traceback) with `note` added to its message."""
        return type(self)(f"{self.message}{note}", rank=self.rank, role=self.role, method=self.method,
                          remote_traceback=self.remote_traceback)

    @classmethod
    def from_failure(cls, f: RemoteFailure, others: int = 0) -> "WorkerError":
        also = f" ({others} other rank(s) failed too)" if others else ""
        msg = (f"worker {f.role!r} rank {f.rank} (pid {f.pid} on {f.host}) raised {f.exc_type} in "
               f"{f.method}(): {f.message}{also}")
        return cls(msg, rank=f.rank, role=f.role, method=f.method, remote_traceback=f.traceback)


class WorkerDiedError(WorkerError):
    """A worker process is gone (killed, crashed, node lost). The group cannot be used any more."""


class WorkerTimeoutError(WorkerError):
    """A call did not finish within the group's call timeout."""
