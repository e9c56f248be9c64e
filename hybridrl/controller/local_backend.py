"""Local backend: the same Worker classes under torchrun, one process per rank, no Ray.

Every torchrun rank runs the same driver program. A `LocalWorkerGroup` builds only this rank's
worker(s) in this process; a group call computes the same dispatch plan on every rank, runs this
rank's share locally, then all-gathers the outputs as objects (gloo), so the driver on every rank sees
the same collected result and the same errors. The driver's inputs must therefore be identical on
every rank (same data order, same seeds), as in any SPMD program.

    torchrun --nproc_per_node=2 my_driver.py     # inside: wg = make_worker_group("local", MyWorker)

A `blocking=False` method runs (and exchanges its outputs) when called, as every rank must reach
the exchange in the same order; its future is already resolved.

Failures: a worker that raises becomes a RemoteFailure that every rank raises as the same WorkerError.
A rank that dies makes the gather fail on the others (gloo connection error, or the timeout), raised
as WorkerDiedError; torchrun then stops the job.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .dispatch import DispatchInfo, DispatchPlan
from .errors import RemoteFailure, WorkerDiedError, WorkerError
from .group import WorkerGroup
from .host import RoleSpec, WorkerHost, as_role_specs
from .worker import DEFAULT_DIST_TIMEOUT_S, DistContext, init_process_group_once

__all__ = ["LocalWorkerGroup", "spawn_local_host"]


class _LocalHost:
    """This rank's WorkerHost plus the gloo group used to exchange outputs between driver copies."""

    def __init__(self, host: WorkerHost, ctx: DistContext, control: Any, timeout_s: float, owns_pg: bool) -> None:
        self.host, self.ctx, self.control, self.timeout_s = host, ctx, control, timeout_s
        self.owns_pg = owns_pg  # this host joined torch.distributed, so it also leaves it
        self.alive = True

    def close(self) -> None:
        """Wait for every rank to get here, then leave torch.distributed (exiting without this can abort
        a rank while a peer still talks to it)."""
        if not self.alive:
            return
        self.alive = False
        if self.owns_pg and dist.is_initialized():
            dist.barrier(group=self.control)
            dist.destroy_process_group()

    def all_gather(self, obj: Any, *, role: str, method: str) -> list[Any]:
        out: list[Any] = [None] * self.ctx.world_size
        try:
            dist.all_gather_object(out, obj, group=self.control)
        except Exception as e:  # a peer died or hung past the timeout
            raise WorkerDiedError(f"{role}.{method}(): rank {self.ctx.rank} lost its peers while collecting outputs "
                                  f"({type(e).__name__}: {str(e)[:300]})", rank=None, role=role, method=method) from None
        return out


def spawn_local_host(roles: dict[str, RoleSpec], *, use_gpu: bool | None = None,
                     dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S, call_timeout_s: float | None = None) -> _LocalHost:
    """Join torch.distributed from torchrun's env and build this rank's roles (all ranks must call this)."""
    roles = as_role_specs(roles)
    label = "+".join(roles)
    ctx = DistContext.from_env(role=label, use_gpu=use_gpu, dist_timeout_s=dist_timeout_s)
    owns_pg = init_process_group_once(ctx)
    timeout_s = call_timeout_s or dist_timeout_s
    # Outputs are exchanged as pickled objects on the CPU: a gloo group even when the default one is NCCL.
    control = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    local = _LocalHost(WorkerHost(), ctx, control, timeout_s, owns_pg)
    failure = local.host.setup(ctx, roles)
    failures = [f for f in local.all_gather(failure, role=label, method="__init__") if isinstance(f, RemoteFailure)]
    if failures:
        raise WorkerError.from_failure(failures[0], others=len(failures) - 1)
    return local


class LocalWorkerGroup(WorkerGroup):
    """`worker_cls` as `role` on every torchrun rank; this process holds this rank's instance."""

    def __init__(self, worker_cls: type, init_args: tuple = (), init_kwargs: dict | None = None, *,
                 role: str = "worker", use_gpu: bool | None = None, call_timeout_s: float | None = None,
                 dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S) -> None:
        spec = RoleSpec(worker_cls, tuple(init_args), dict(init_kwargs or {}))
        local = spawn_local_host({role: spec}, use_gpu=use_gpu, dist_timeout_s=dist_timeout_s,
                                 call_timeout_s=call_timeout_s)
        self._attach(local, role, worker_cls, call_timeout_s)

    @classmethod
    def view(cls, local: _LocalHost, role: str, worker_cls: type,
             call_timeout_s: float | None = None) -> "LocalWorkerGroup":
        group = cls.__new__(cls)
        group._attach(local, role, worker_cls, call_timeout_s)
        return group

    def _attach(self, local: _LocalHost, role: str, worker_cls: type, call_timeout_s: float | None) -> None:
        self._local = local
        WorkerGroup.__init__(self, role, worker_cls, local.ctx.world_size, call_timeout_s)

    @property
    def rank(self) -> int:
        """This process's rank (the driver runs on every rank)."""
        return self._local.ctx.rank

    @property
    def local_worker(self) -> Any:
        """This rank's instance of the role, for debugging."""
        return self._local.host._roles[self.role]

    def shutdown(self) -> None:
        """Collective: every rank calls it at the end of the driver (for colocated views, once is enough).
        Leaves torch.distributed if this group joined it; the group cannot be used afterwards."""
        self._local.close()

    # ------------------------------------------------------------------ backend hooks
    def _submit(self, method: str, plan: DispatchPlan) -> dict[int, Any]:
        if not self._local.alive:
            raise WorkerDiedError(f"{self.role}.{method}(): the group was shut down", rank=None, role=self.role,
                                  method=method)
        rank = self._local.ctx.rank
        out = None
        if rank in plan.calls:
            args, kwargs = plan.calls[rank]
            out = self._local.host.execute(self.role, method, args, kwargs, keep_output=rank in plan.returning_ranks())
        gathered = self._local.all_gather(out, role=self.role, method=method)
        return {r: gathered[r] for r in plan.calls}

    def _gather(self, handle: dict[int, Any], method: str, timeout: float | None) -> dict[int, Any]:
        return handle  # already exchanged in _submit, in lockstep on every rank

    def _fetch_dispatch_info(self, mesh: str) -> list[DispatchInfo | None]:
        mine = self._local.host.dispatch_info(self.role, mesh)
        return self._local.all_gather(mine, role=self.role, method="dispatch_info")
