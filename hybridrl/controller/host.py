"""WorkerHost: the object that lives in each worker process and holds that process's role instances.

Both backends use it: the Ray backend wraps it in one Ray actor per slot, the local backend builds one
per torchrun rank in the driver's own process. Holding several roles in one host is what colocation
is: the roles share the process, its CUDA context and its torch.distributed process group.
"""
from __future__ import annotations

import os
import socket
import traceback
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from hybridrl.protocol import DataProto
from hybridrl.utils import logs

from .dispatch import DispatchInfo
from .errors import RemoteFailure
from .worker import DistContext, Worker, attach_peers, build_worker, with_role

__all__ = ["RoleSpec", "WorkerHost", "as_role_specs", "to_cpu"]


def to_cpu(out: Any) -> Any:
    """Outputs reach the driver on the CPU (the driver may have no GPU); tensors already there stay put."""
    if isinstance(out, torch.Tensor):
        return out.cpu()
    if isinstance(out, DataProto) and any(t.device.type != "cpu" for t in out.batch.values()):
        return out.to("cpu")
    return out


@dataclass(frozen=True)
class RoleSpec:
    """A role's Worker class and the arguments every rank constructs it with."""

    cls: type
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def as_role_specs(roles: Mapping[str, "type | RoleSpec"]) -> dict[str, RoleSpec]:
    """Accept `{"actor": ActorWorker}` or `{"actor": RoleSpec(ActorWorker, args, kwargs)}`; check classes."""
    if not roles:
        raise ValueError("no roles given")
    specs = {}
    for name, value in roles.items():
        spec = value if isinstance(value, RoleSpec) else RoleSpec(value)
        if not (isinstance(spec.cls, type) and issubclass(spec.cls, Worker)):
            raise TypeError(f"role {name!r}: {spec.cls!r} is not a subclass of hybridrl.controller.Worker")
        specs[str(name)] = spec
    return specs


class WorkerHost:
    """The role instances of one process, and the entry point through which group calls run."""

    def __init__(self) -> None:
        self._roles: dict[str, Any] = {}
        self._ctx: DistContext | None = None

    def setup(self, ctx: DistContext, roles: dict[str, RoleSpec]) -> RemoteFailure | None:
        """Publish the process identity, then build each role; a failure record if a constructor raised."""
        self._ctx = ctx
        ctx.export_env()
        logs.setup()
        instances: dict[str, Any] = {}
        for name, spec in roles.items():
            try:
                instances[name] = build_worker(spec.cls, with_role(ctx, name), spec.args, spec.kwargs)
            except Exception as e:
                return self._failure(name, f"{spec.cls.__name__}.__init__", e)
        attach_peers(instances)
        self._roles = instances
        return None

    def execute(self, role: str, method: str, args: tuple, kwargs: dict, keep_output: bool = True) -> Any:
        """Run `role.method(*args, **kwargs)`; the output (None if not kept) or a RemoteFailure."""
        try:
            out = getattr(self._roles[role], method)(*args, **kwargs)
        except Exception as e:
            return self._failure(role, method, e)
        return to_cpu(out) if keep_output else None

    def dispatch_info(self, role: str, mesh: str = "default") -> DispatchInfo | None:
        return self._roles[role].get_dispatch_info(mesh)

    def pid(self) -> int:
        return os.getpid()

    def _failure(self, role: str, method: str, e: BaseException) -> RemoteFailure:
        rank = self._ctx.rank if self._ctx else -1
        return RemoteFailure(rank=rank, role=role, method=method, exc_type=type(e).__name__, message=str(e),
                             traceback=traceback.format_exc(), pid=os.getpid(), host=socket.gethostname())
