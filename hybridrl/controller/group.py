"""WorkerGroup: the driver's handle on N workers of one role, independent of the backend.

Every `@register`-ed method of the role's Worker class becomes a method of the group:

    wg.compute_values(batch)   # dispatch (split per the mode) -> run on the workers -> collect

A call is planned by its dispatch mode (dispatch.py), submitted by the backend (Ray actors or the
local torchrun process), gathered with failure checks, then merged by the mode's collect step.
`blocking=False` methods return a `GroupFuture`; `wg.get(future)` (or `future.get()`) resolves it.
A future passed as an argument to another group call is resolved first.
"""
from __future__ import annotations

from typing import Any

from .decorator import Execute, RegisterSpec, registered_methods
from .dispatch import (
    DEFAULT_MESH,
    DispatchInfo,
    DispatchMode,
    DispatchPlan,
    GroupInfo,
    collect_outputs,
    get_dispatch_mode,
    plan_call,
)
from .errors import RemoteFailure, WorkerError

__all__ = ["GroupFuture", "WorkerGroup"]

_NOT_SET = object()


class GroupFuture:
    """A submitted group call; `get()` waits for the workers and returns the collected output."""

    def __init__(self, group: "WorkerGroup", method: str, mode: DispatchMode, info: GroupInfo,
                 plan: DispatchPlan, handle: Any) -> None:
        self._group, self.method, self._mode, self._info, self._plan = group, method, mode, info, plan
        self._handle = handle
        self._result: Any = _NOT_SET

    def get(self, timeout: float | None = None) -> Any:
        if self._result is _NOT_SET:
            outputs = self._group._gather(self._handle, self.method, timeout)
            _raise_failures(outputs)
            returning = {r: outputs[r] for r in self._plan.returning_ranks()}
            self._result = collect_outputs(self._mode, self._info, returning, self._plan)
        return self._result

    def __repr__(self) -> str:
        state = "done" if self._result is not _NOT_SET else "pending"
        return f"GroupFuture({self._group.role}.{self.method}, {state})"


def _raise_failures(outputs: dict[int, Any]) -> None:
    failures = [v for v in outputs.values() if isinstance(v, RemoteFailure)]
    if failures:
        first = min(failures, key=lambda f: f.rank)
        raise WorkerError.from_failure(first, others=len(failures) - 1)


class _GroupMethod:
    """The group-side stand-in of a registered worker method."""

    def __init__(self, group: "WorkerGroup", name: str, spec: RegisterSpec, doc: str | None) -> None:
        self._group, self.__name__, self.spec, self.__doc__ = group, name, spec, doc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._group._call(self.__name__, self.spec, args, kwargs)

    def __repr__(self) -> str:
        return f"<group method {self._group.role}.{self.__name__} ({self.spec.dispatch_mode})>"


class WorkerGroup:
    """Base of RayWorkerGroup and LocalWorkerGroup; subclasses implement `_submit`, `_gather`,
    `_fetch_dispatch_info` and `shutdown`."""

    def __init__(self, role: str, worker_cls: type, world_size: int, call_timeout_s: float | None) -> None:
        self._role = role
        self._worker_cls = worker_cls
        self._world_size = world_size
        self.call_timeout_s = call_timeout_s
        self._meshes: dict[str, tuple[DispatchInfo, ...]] = {}
        self._bind_methods()

    # ------------------------------------------------------------------ public
    @property
    def role(self) -> str:
        return self._role

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def worker_cls(self) -> type:
        return self._worker_cls

    def execute_all_async(self, method: str, *args: Any, **kwargs: Any) -> GroupFuture:
        """Run any worker method on every rank with the same arguments; a future of the rank-ordered list."""
        return self._start(method, get_dispatch_mode("ONE_TO_ALL"), Execute.ALL, args, kwargs)

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self.execute_all_async(method, *args, **kwargs).get()

    def execute_rank_zero(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._start(method, get_dispatch_mode("RANK_ZERO"), Execute.ALL, args, kwargs).get()

    def get(self, futures: "GroupFuture | list[GroupFuture]", timeout: float | None = None) -> Any:
        """Resolve one future or a list of futures (in order)."""
        if isinstance(futures, GroupFuture):
            return futures.get(timeout)
        return [f.get(timeout) for f in futures]

    def dispatch_info(self, mesh: str = DEFAULT_MESH) -> tuple[DispatchInfo | None, ...]:
        """Each rank's declared data-parallel position in `mesh` (None where nothing was declared)."""
        if mesh in self._meshes:
            return self._meshes[mesh]
        infos = tuple(self._fetch_dispatch_info(mesh))
        if all(i is not None for i in infos):
            self._meshes[mesh] = infos  # type: ignore[assignment]
        return infos

    def refresh_dispatch_info(self) -> None:
        """Forget the cached mesh layouts (call after workers re-declare them)."""
        self._meshes = {}

    def shutdown(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ call path
    def _bind_methods(self) -> None:
        for name, spec in registered_methods(self._worker_cls).items():
            try:
                get_dispatch_mode(spec.dispatch_mode)
            except ValueError as e:
                raise ValueError(f"{self._worker_cls.__name__}.{name}: {e}") from None
            if name.startswith("_") or hasattr(type(self), name) or name in vars(self):
                raise ValueError(f"{self._worker_cls.__name__}.{name}: this name is reserved by the worker group; "
                                 "rename the registered method")
            doc = getattr(getattr(self._worker_cls, name), "__doc__", None)
            setattr(self, name, _GroupMethod(self, name, spec, doc))

    def _call(self, method: str, spec: RegisterSpec, args: tuple, kwargs: dict) -> Any:
        future = self._start(method, get_dispatch_mode(spec.dispatch_mode), spec.execute_mode, args, kwargs)
        return future.get() if spec.blocking else future

    def _start(self, method: str, mode: DispatchMode, execute_mode: str, args: tuple, kwargs: dict) -> GroupFuture:
        args = tuple(a.get() if isinstance(a, GroupFuture) else a for a in args)
        kwargs = {k: v.get() if isinstance(v, GroupFuture) else v for k, v in kwargs.items()}
        mesh = mode.mesh_name
        info = GroupInfo(self._world_size, self._role, self.dispatch_info(mesh) if mesh else None)
        try:
            plan = plan_call(mode, info, args, kwargs)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{self._role}.{method} ({mode.name}): {e}") from e
        if execute_mode == Execute.RANK_ZERO:
            plan = DispatchPlan({0: plan.calls[0]} if 0 in plan.calls else {},
                                tuple(r for r in plan.returning_ranks() if r == 0), plan.state)
            if not plan.calls:
                raise ValueError(f"{self._role}.{method}: execute_mode RANK_ZERO but {mode.name} gives rank 0 nothing")
        handle = self._submit(method, plan)
        return GroupFuture(self, method, mode, info, plan, handle)

    # ------------------------------------------------------------------ backend hooks
    def _submit(self, method: str, plan: DispatchPlan) -> Any:
        """Start `method` on every rank of `plan.calls`; ranks outside `plan.returning_ranks()` send
        back None (or a RemoteFailure). Returns a backend handle for `_gather`."""
        raise NotImplementedError

    def _gather(self, handle: Any, method: str, timeout: float | None) -> dict[int, Any]:
        """Wait for the ranks of a submitted call: {rank: output or RemoteFailure}, or raise
        WorkerDiedError / WorkerTimeoutError naming the rank and role."""
        raise NotImplementedError

    def _fetch_dispatch_info(self, mesh: str) -> list[DispatchInfo | None]:
        raise NotImplementedError
