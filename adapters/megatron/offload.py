"""Moving a role's params / grads / optimizer state to pinned CPU memory and back (GPU only).
The host memory is one pinned.PinnedBuffer per kind (HostArena): registered once, reused every step.

Works at the level of tensor STORAGES: a storage is copied to a pinned host buffer and resized to 0
bytes, then resized back and refilled on onload. Every tensor, view and buffer that megatron holds
(DDP's contiguous param/grad buffers, the distributed optimizer's shards, Float16Module params)
stays the same Python object, so nothing has to be re-wired after onload.
Gradients are not copied: they are zeroed at the start of every update, so their memory is only
released on offload and re-zeroed on onload (reported as bytes released).
On CPU the state already lives in host memory: both calls are no-ops reporting 0 bytes.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from hybridrl.adapters.base import OffloadReport

from . import compat
from .pinned import PinnedBuffer

log = logging.getLogger(__name__)

ALIGN = 512  # bytes; each storage's slot in a host arena starts on this boundary
SLOW_PIN_BYTES_PER_S = 4e9  # pinning slower than this is logged as a warning, with its phases (pinned_bench: 11e9)


@dataclass
class HostArena:
    """One pinned host buffer holding a kind's storages back to back.

    One registration per kind instead of one per storage: the ~1,000 optimizer tensors of a 1.5B model took
    3.6 s to pin one by one and 0.7 s as one buffer (benchmarks/results/pinned_bench.md).
    """

    buffer: PinnedBuffer
    slots: dict[int, tuple[int, int]]  # storage key -> (offset, nbytes)

    @classmethod
    def build(cls, sizes: dict[int, int]) -> "HostArena":
        slots, offset = {}, 0
        for key, nbytes in sizes.items():
            slots[key] = (offset, nbytes)
            offset += -(-nbytes // ALIGN) * ALIGN
        return cls(PinnedBuffer(offset, pin=compat.cuda_in_use()), slots)

    def holds(self, sizes: dict[int, int]) -> bool:
        return {key: n for key, (_, n) in self.slots.items()} == sizes

    def view(self, key: int) -> torch.Tensor:
        offset, nbytes = self.slots[key]
        return self.buffer.tensor[offset:offset + nbytes]


@dataclass
class State:
    """Offloaded storages of one role, by kind, and the host arenas kept for reuse.

    Both are keyed by the storage's identity (`_storage_key`), not its address: onload re-allocates a
    storage, so its data_ptr changes every round, and buffers keyed by address were never found again
    (a fresh pinned allocation per storage per step, and the old ones kept alive).
    """

    offloaded: dict[str, dict[int, tuple[Any, int]]] = field(default_factory=lambda: {"params": {}, "grads": {}, "optimizer": {}})
    pinned: dict[str, HostArena] = field(default_factory=dict)
    fresh: list[HostArena] = field(default_factory=list)  # built (pinned) since the last OffloadReport

    def pinned_bytes(self) -> int:
        return sum(a.buffer.nbytes for a in self.pinned.values())

    def arena(self, kind: str, sizes: dict[int, int]) -> HostArena:
        """The kind's arena, rebuilt only when its storages changed (e.g. a rebuilt optimizer)."""
        old = self.pinned.get(kind)
        if old is not None and old.holds(sizes):
            return old
        if old is not None:  # its data is on the device (nothing of this kind is offloaded): free it first
            old.buffer.release()
            del self.pinned[kind], old
        self.pinned[kind] = HostArena.build(sizes)
        self.fresh.append(self.pinned[kind])
        return self.pinned[kind]


def offload(engine: Any, state: State, params: bool, grads: bool, optimizer: bool) -> OffloadReport:
    return _move(engine, state, params, grads, optimizer, to_host=True)


def onload(engine: Any, state: State, params: bool, grads: bool, optimizer: bool) -> OffloadReport:
    return _move(engine, state, params, grads, optimizer, to_host=False)


def _move(engine: Any, state: State, params: bool, grads: bool, optimizer: bool, to_host: bool) -> OffloadReport:
    if not compat.cuda_in_use():
        return OffloadReport()
    start = time.perf_counter()
    compat.synchronize()
    waited = time.perf_counter() - start
    moved = {}
    for kind, wanted, tensors in (("params", params, lambda: _param_tensors(engine)),
                                  ("grads", grads, lambda: _grad_tensors(engine)),
                                  ("optimizer", optimizer, lambda: _optimizer_tensors(engine))):
        if not wanted:
            moved[kind] = 0
        elif to_host:
            moved[kind] = _offload_storages(tensors(), state, kind, keep=kind != "grads")
        else:
            moved[kind] = _onload_storages(state, kind, keep=kind != "grads")
    compat.synchronize()
    if to_host:
        compat.empty_cache()
    fresh, state.fresh = state.fresh, []
    alloc = sum(sum(a.buffer.seconds.values()) for a in fresh)
    if fresh:
        _log_pinning(fresh)
    return OffloadReport(params_bytes=moved["params"], grads_bytes=moved["grads"],
                         optimizer_bytes=moved["optimizer"], seconds=time.perf_counter() - start,
                         wait_seconds=waited, host_alloc_seconds=alloc)


def _log_pinning(arenas: list[HostArena]) -> None:
    """Once per run (per new set of storages); a warning, with the phases, when it ran slower than expected."""
    nbytes = sum(a.buffer.nbytes for a in arenas)
    phases = {k: sum(a.buffer.seconds[k] for a in arenas) for k in arenas[0].buffer.seconds}
    seconds = sum(phases.values())
    say = log.warning if nbytes < SLOW_PIN_BYTES_PER_S * seconds else log.info
    say("offload: pinning %.2f GB of host memory took %.2f s (%s); it is reused from now on",
        nbytes / 1e9, seconds, ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))


def _storage_key(storage: Any) -> int:
    """What stays the same for a storage across resize_ (its StorageImpl), unlike data_ptr()."""
    return storage._cdata


def _unique_storages(tensors: Iterable[torch.Tensor], skip: set[int], device_type: str = "cuda") -> dict[int, Any]:
    out = {}
    for t in tensors:
        if t is None or t.device.type != device_type:
            continue
        s = t.untyped_storage()
        key = _storage_key(s)
        if s.nbytes() > 0 and key not in skip:
            out[key] = s
    return out


def _offload_storages(tensors: Iterable[torch.Tensor], state: State, kind: str, keep: bool,
                      device_type: str = "cuda") -> int:
    if state.offloaded[kind]:  # already on the host: a second offload must not rebuild (and lose) the arena
        return 0
    taken = {k for d in state.offloaded.values() for k in d}
    storages = _unique_storages(tensors, taken, device_type)
    if keep:
        arena = state.arena(kind, {key: s.nbytes() for key, s in storages.items()})
        for key, storage in storages.items():
            arena.view(key).copy_(_bytes_view(storage), non_blocking=True)
    compat.synchronize()  # every copy has landed before any device storage is released
    total = 0
    for key, storage in storages.items():
        total += storage.nbytes()
        state.offloaded[kind][key] = (storage, storage.nbytes())
        storage.resize_(0)
    return total


def _onload_storages(state: State, kind: str, keep: bool) -> int:
    total = 0
    for key, (storage, nbytes) in list(state.offloaded[kind].items()):
        storage.resize_(nbytes)
        view = _bytes_view(storage)
        if keep:
            view.copy_(state.pinned[kind].view(key), non_blocking=True)
        else:
            view.zero_()
        del state.offloaded[kind][key]
        total += nbytes
    return total


def _bytes_view(storage: Any) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _param_tensors(engine: Any) -> list[torch.Tensor]:
    return [p.data for c in engine.chunks for p in c.parameters()]


def _grad_tensors(engine: Any) -> list[torch.Tensor]:
    out = []
    for c in engine.chunks:
        for buf in getattr(c, "buffers", []) + getattr(c, "expert_parallel_buffers", []):
            if buf.grad_data is not None:
                out.append(buf.grad_data)
    return out


def _optimizer_tensors(engine: Any) -> list[torch.Tensor]:
    """Optimizer state and fp32 main params (model params themselves are excluded by storage)."""
    if engine.optimizer is None:
        return []
    model = {_storage_key(p.data.untyped_storage()) for p in _param_tensors(engine)}
    out = []
    for opt in getattr(engine.optimizer, "chained_optimizers", [engine.optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None:
            continue
        for group in inner.param_groups:
            out += [p.data for p in group["params"] if _storage_key(p.data.untyped_storage()) not in model]
        for st in inner.state.values():
            out += [v for v in st.values() if isinstance(v, torch.Tensor)]
    return out
