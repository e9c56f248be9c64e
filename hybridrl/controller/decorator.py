"""`@register`: mark a Worker method as a group method and say how its arguments travel.

    class ActorWorker(Worker):
        @register(dispatch_mode=Dispatch.MESH_COMPUTE_PROTO)
        def compute_log_prob(self, data: DataProto) -> DataProto: ...

The decorator only stores a `RegisterSpec` on the function; the worker group reads it when it binds
the method (`wg.compute_log_prob(batch)`), so the worker-side method stays a plain method.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Dispatch", "Execute", "RegisterSpec", "register", "registered_methods"]

SPEC_ATTR = "__hybridrl_register__"


class Dispatch:
    """Names of the built-in dispatch modes (see dispatch.py). Any registered name works too."""

    ONE_TO_ALL = "ONE_TO_ALL"  # same arguments to every worker; list of outputs in rank order
    ALL_TO_ALL = "ALL_TO_ALL"  # each argument is a list with one entry per worker; list of outputs
    RANK_ZERO = "RANK_ZERO"  # run on rank 0 only; its output
    DP_COMPUTE_PROTO = "DP_COMPUTE_PROTO"  # split DataProto args over all workers; concat outputs
    MESH_COMPUTE_PROTO = "MESH_COMPUTE_PROTO"  # split over declared dp ranks; collect from collectors
    DP_MESH = MESH_COMPUTE_PROTO  # alias


class Execute:
    """Which workers run the method after dispatch: all of them, or rank 0 only."""

    ALL = "ALL"
    RANK_ZERO = "RANK_ZERO"


@dataclass(frozen=True)
class RegisterSpec:
    dispatch_mode: str
    execute_mode: str
    blocking: bool


def register(dispatch_mode: str = Dispatch.ONE_TO_ALL, execute_mode: str = Execute.ALL,
             blocking: bool = True) -> Callable[[Callable], Callable]:
    """Make the decorated Worker method callable on the group; `blocking=False` returns a future."""
    if not isinstance(dispatch_mode, str):
        raise TypeError(f"register: dispatch_mode must be a mode name (str), got {dispatch_mode!r}")
    if execute_mode not in (Execute.ALL, Execute.RANK_ZERO):
        raise ValueError(f"register: execute_mode must be Execute.ALL or Execute.RANK_ZERO, got {execute_mode!r}")

    def mark(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"register: expected a method, got {fn!r}")
        setattr(fn, SPEC_ATTR, RegisterSpec(dispatch_mode, execute_mode, bool(blocking)))
        return fn

    return mark


def registered_methods(cls: type) -> dict[str, RegisterSpec]:
    """Every `@register`-ed method of `cls`, inherited ones included, by name."""
    out: dict[str, RegisterSpec] = {}
    for name in dir(cls):
        attr: Any = getattr(cls, name, None)
        spec = getattr(attr, SPEC_ATTR, None)
        if isinstance(spec, RegisterSpec):
            out[name] = spec
    return out
