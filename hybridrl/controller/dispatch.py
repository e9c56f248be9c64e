"""Dispatch modes: how a group call's arguments are split over N workers and how outputs are merged.

A mode is a pair of functions, registered by name (an extension point with a contract test):

    dispatch_fn(info: GroupInfo, args: tuple, kwargs: dict) -> DispatchPlan
    collect_fn(info: GroupInfo, outputs: dict[int, Any], plan: DispatchPlan) -> Any

`DispatchPlan.calls` maps each rank that runs the method to its (args, kwargs); `collect_ranks` names
the ranks whose outputs come back (the others run but send nothing, e.g. tp ranks > 0); `state` is
anything the collect step needs (the padding added by the dispatch step). `collect_fn` receives the
outputs of `collect_ranks` only, keyed by rank in ascending order. Both functions run on the driver
(and, with the local backend, identically on every torchrun rank), so they must be deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from hybridrl.protocol import DataProto, DispatchInfo, pad_to_multiple
from hybridrl.utils.registry import Registry

__all__ = [
    "DispatchInfo", "GroupInfo", "DispatchPlan", "DispatchMode",
    "register_dispatch_mode", "register_mesh_dispatch_mode", "get_dispatch_mode", "list_dispatch_modes",
    "plan_call", "collect_outputs", "DEFAULT_MESH",
]


@dataclass(frozen=True)
class GroupInfo:
    """What a dispatch mode may know about the group. `mesh` is set for modes with uses_mesh=True."""

    world_size: int
    role: str = "worker"
    mesh: tuple[DispatchInfo, ...] | None = None


@dataclass
class DispatchPlan:
    calls: dict[int, tuple[tuple, dict]]
    collect_ranks: tuple[int, ...] | None = None  # None: every rank in `calls`
    state: Any = None

    def returning_ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.calls)) if self.collect_ranks is None else tuple(self.collect_ranks)


DispatchFn = Callable[[GroupInfo, tuple, dict], DispatchPlan]
CollectFn = Callable[[GroupInfo, "dict[int, Any]", DispatchPlan], Any]


DEFAULT_MESH = "default"


@dataclass(frozen=True)
class DispatchMode:
    name: str
    dispatch_fn: DispatchFn
    collect_fn: CollectFn
    uses_mesh: bool | str = False  # True: the "default" mesh; a str names the mesh (e.g. "rollout")

    @property
    def mesh_name(self) -> str | None:
        if not self.uses_mesh:
            return None
        return DEFAULT_MESH if self.uses_mesh is True else str(self.uses_mesh)


_MODES = Registry("dispatch mode", key="@register(dispatch_mode=...)")


def register_dispatch_mode(name: str, dispatch_fn: DispatchFn, collect_fn: CollectFn, *,
                           uses_mesh: bool | str = False, override: bool = False) -> DispatchMode:
    """Add a mode usable as `@register(dispatch_mode=name)`. `uses_mesh`: the plan needs `info.mesh`
    (True: the workers' "default" mesh; a string: the mesh of that name, see Worker.set_dispatch_info)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_dispatch_mode: name must be a non-empty str, got {name!r}")
    if not callable(dispatch_fn) or not callable(collect_fn):
        raise TypeError(f"register_dispatch_mode({name!r}): dispatch_fn and collect_fn must be callable")
    return _MODES.register(name, DispatchMode(name, dispatch_fn, collect_fn, uses_mesh), override=override)


def get_dispatch_mode(name: str) -> DispatchMode:
    """The registered mode; ValueError naming the known modes otherwise."""
    return _MODES.get(name)


def list_dispatch_modes() -> list[str]:
    return _MODES.names()


def plan_call(mode: DispatchMode, info: GroupInfo, args: tuple, kwargs: dict) -> DispatchPlan:
    """Run the mode's dispatch step and check that the plan keeps the contract."""
    plan = mode.dispatch_fn(info, tuple(args), dict(kwargs))
    if not isinstance(plan, DispatchPlan):
        raise TypeError(f"dispatch mode {mode.name!r}: dispatch_fn returned {type(plan).__name__}, not DispatchPlan")
    bad = [r for r in plan.calls if not (isinstance(r, int) and 0 <= r < info.world_size)]
    if bad or not plan.calls:
        raise ValueError(f"dispatch mode {mode.name!r}: plan ranks {sorted(plan.calls)} must be a non-empty "
                         f"subset of range({info.world_size})")
    for r, call in plan.calls.items():
        if not (isinstance(call, tuple) and len(call) == 2 and isinstance(call[0], tuple) and isinstance(call[1], dict)):
            raise TypeError(f"dispatch mode {mode.name!r}: calls[{r}] must be (args: tuple, kwargs: dict)")
    stray = set(plan.returning_ranks()) - set(plan.calls)
    if stray:
        raise ValueError(f"dispatch mode {mode.name!r}: collect_ranks {sorted(stray)} do not run the method")
    return plan


def collect_outputs(mode: DispatchMode, info: GroupInfo, outputs: dict[int, Any], plan: DispatchPlan) -> Any:
    ordered = {r: outputs[r] for r in sorted(outputs)}
    return mode.collect_fn(info, ordered, plan)


# ---------------------------------------------------------------------- helpers for row-wise modes
def split_proto_args(args: tuple, kwargs: dict, parts: int) -> tuple[list[tuple[tuple, dict]], int]:
    """Pad every DataProto argument to a multiple of `parts` and cut it into `parts` slices.

    Non-DataProto arguments go unchanged to every part. All DataProto arguments must have the same
    length. Returns the per-part (args, kwargs) and the number of padding rows added.
    """
    protos = [a for a in (*args, *kwargs.values()) if isinstance(a, DataProto)]
    if not protos:
        raise TypeError("a *_COMPUTE_PROTO method needs at least one DataProto argument")
    lengths = {len(p) for p in protos}
    if len(lengths) > 1:
        raise ValueError(f"DataProto arguments differ in length: {sorted(lengths)}")

    pad_size = 0

    def cut(value: Any) -> Any:
        nonlocal pad_size
        if not isinstance(value, DataProto):
            return [value] * parts
        padded, pad_size = pad_to_multiple(value, parts)
        return padded.chunk(parts)

    cut_args = [cut(a) for a in args]
    cut_kwargs = {k: cut(v) for k, v in kwargs.items()}
    calls = [(tuple(a[i] for a in cut_args), {k: v[i] for k, v in cut_kwargs.items()}) for i in range(parts)]
    return calls, pad_size


@dataclass(frozen=True)
class Padding:
    """Rows the dispatch step added (`pad_size`) to an input of `padded_rows` rows."""

    pad_size: int
    padded_rows: int


def concat_rows(parts: list[Any], padding: "Padding | int") -> Any:
    """Join per-slice outputs in order and drop the rows that came from padding.

    A method may return a fixed number of rows per input row (generation returns n samples per
    prompt): the padding to drop is scaled by that ratio. DataProto, tensors (first dim) and lists are
    joined row-wise; all-None gives None; any other output type (e.g. a metrics dict) comes back as
    the list of per-slice outputs.
    """
    if all(p is None for p in parts):
        return None
    first = parts[0]
    if isinstance(first, DataProto):
        joined = DataProto.concat(parts)
        return joined[: len(joined) - _scaled_pad(len(joined), padding)]
    if isinstance(first, torch.Tensor):
        joined = torch.cat(parts)
        return joined[: joined.shape[0] - _scaled_pad(joined.shape[0], padding)]
    if isinstance(first, list):
        joined = [x for p in parts for x in p]
        return joined[: len(joined) - _scaled_pad(len(joined), padding)]
    return parts


def _scaled_pad(out_rows: int, padding: "Padding | int") -> int:
    if isinstance(padding, int):
        return padding
    if padding.pad_size == 0 or out_rows == padding.padded_rows:
        return padding.pad_size
    if padding.padded_rows == 0 or out_rows % padding.padded_rows:
        raise ValueError(f"outputs have {out_rows} rows for {padding.padded_rows} padded input rows: a method "
                         "under a *_COMPUTE_PROTO mode must return the same number of rows per input row")
    return padding.pad_size * (out_rows // padding.padded_rows)


# ---------------------------------------------------------------------- built-in modes
def _one_to_all(info: GroupInfo, args: tuple, kwargs: dict) -> DispatchPlan:
    return DispatchPlan({r: (args, kwargs) for r in range(info.world_size)})


def _as_list(info: GroupInfo, outputs: dict[int, Any], plan: DispatchPlan) -> list[Any]:
    return list(outputs.values())


def _all_to_all(info: GroupInfo, args: tuple, kwargs: dict) -> DispatchPlan:
    n = info.world_size
    for where, v in [*((f"argument {i}", a) for i, a in enumerate(args)), *((f"argument {k!r}", v) for k, v in kwargs.items())]:
        if not isinstance(v, (list, tuple)) or len(v) != n:
            raise ValueError(f"ALL_TO_ALL: {where} must be a list with one entry per worker ({n}), got {type(v).__name__}"
                             + (f" of length {len(v)}" if isinstance(v, (list, tuple)) else ""))
    return DispatchPlan({r: (tuple(a[r] for a in args), {k: v[r] for k, v in kwargs.items()}) for r in range(n)})


def _rank_zero(info: GroupInfo, args: tuple, kwargs: dict) -> DispatchPlan:
    return DispatchPlan({0: (args, kwargs)})


def _rank_zero_collect(info: GroupInfo, outputs: dict[int, Any], plan: DispatchPlan) -> Any:
    return outputs[0]


def _dp_compute_proto(info: GroupInfo, args: tuple, kwargs: dict) -> DispatchPlan:
    calls, pad_size = split_proto_args(args, kwargs, info.world_size)
    return DispatchPlan(dict(enumerate(calls)), state=Padding(pad_size, _proto_rows(args, kwargs) + pad_size))


def _dp_compute_proto_collect(info: GroupInfo, outputs: dict[int, Any], plan: DispatchPlan) -> Any:
    return concat_rows(list(outputs.values()), plan.state)


def check_mesh(info: GroupInfo) -> int:
    """Validate the declared dp layout (one dp size, every dp rank fed, one collector each); dp size."""
    mesh = info.mesh
    if mesh is None or len(mesh) != info.world_size:
        raise ValueError(f"{info.role}: mesh dispatch needs the dispatch info of all {info.world_size} workers")
    missing = [r for r, d in enumerate(mesh) if d is None]
    if missing:
        raise ValueError(f"{info.role} rank(s) {missing} did not declare their data-parallel position: call "
                         "self.set_dispatch_info(dp_rank, dp_size, is_collect) after building the mesh")
    sizes = {d.dp_size for d in mesh}
    if len(sizes) != 1:
        raise ValueError(f"{info.role}: workers declared different dp sizes {sorted(sizes)}")
    dp_size = sizes.pop()
    collectors = [sorted(r for r, d in enumerate(mesh) if d.dp_rank == k and d.is_collect) for k in range(dp_size)]
    bad = [k for k in range(dp_size) if len(collectors[k]) != 1]
    if bad:
        raise ValueError(f"{info.role}: every dp rank needs exactly one collecting worker; dp ranks {bad} have "
                         f"collectors {[collectors[k] for k in bad]}")
    return dp_size


def _mesh_compute_proto(info: GroupInfo, args: tuple, kwargs: dict) -> DispatchPlan:
    dp_size = check_mesh(info)
    slices, pad_size = split_proto_args(args, kwargs, dp_size)
    mesh = info.mesh
    assert mesh is not None
    calls = {r: slices[d.dp_rank] for r, d in enumerate(mesh)}
    collect = tuple(sorted((r for r, d in enumerate(mesh) if d.is_collect), key=lambda r: mesh[r].dp_rank))
    return DispatchPlan(calls, collect_ranks=collect, state=Padding(pad_size, _proto_rows(args, kwargs) + pad_size))


def _proto_rows(args: tuple, kwargs: dict) -> int:
    return next(len(a) for a in (*args, *kwargs.values()) if isinstance(a, DataProto))


def _mesh_compute_proto_collect(info: GroupInfo, outputs: dict[int, Any], plan: DispatchPlan) -> Any:
    assert info.mesh is not None and plan.collect_ranks is not None
    parts = [outputs[r] for r in plan.collect_ranks]  # collect_ranks are in dp order
    joined = concat_rows(parts, plan.state)
    if isinstance(joined, DataProto) and len(parts) > 1:
        slowest = slowest_timings([p.meta_info.get("metrics") for p in parts if isinstance(p, DataProto)])
        if slowest:
            joined.meta_info["metrics"] = {**joined.meta_info.get("metrics", {}), **slowest}
    return joined


def slowest_timings(per_part: list[Any]) -> dict[str, float]:
    """`timing_s/X_slowest`: the slowest part's seconds of every timing the parts report. The joined output keeps
    the first part's metrics only, and the driver waits for the slowest part: without this a straggling replica
    or dp rank shows up nowhere but in the phase's total."""
    timings: dict[str, list[float]] = {}
    for metrics in per_part:
        for key, value in (metrics or {}).items():
            if key.startswith("timing_s/") and not key.endswith("_slowest") and isinstance(value, (int, float)):
                timings.setdefault(key, []).append(float(value))
    return {f"{key}_slowest": max(values) for key, values in timings.items() if len(values) > 1}


register_dispatch_mode("ONE_TO_ALL", _one_to_all, _as_list)
register_dispatch_mode("ALL_TO_ALL", _all_to_all, _as_list)
register_dispatch_mode("RANK_ZERO", _rank_zero, _rank_zero_collect)
register_dispatch_mode("DP_COMPUTE_PROTO", _dp_compute_proto, _dp_compute_proto_collect)
register_dispatch_mode("MESH_COMPUTE_PROTO", _mesh_compute_proto, _mesh_compute_proto_collect, uses_mesh=True)


def register_mesh_dispatch_mode(name: str, mesh: str, *, override: bool = False) -> DispatchMode:
    """MESH_COMPUTE_PROTO over another mesh the workers declare, e.g. the rollout layout (replicas of tp_g
    ranks) beside the training layout: `register_mesh_dispatch_mode("ROLLOUT_COMPUTE_PROTO", "rollout")`."""
    return register_dispatch_mode(name, _mesh_compute_proto, _mesh_compute_proto_collect, uses_mesh=mesh,
                                  override=override)
