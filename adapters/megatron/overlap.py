"""Offload's copies in flight: begun on the side stream (copier.py) now, finished where their memory is needed.

The optimizer state's two trips, each split in two so that other work runs between the halves:
  onload   begin_onload(state, kind, budget) at the update's start: refill as many offloaded storages as `budget`
           bytes allow and queue their host->device copies; the forward/backward runs meanwhile.
           finish_onload(state, kind) before the optimizer step: the rest comes back, and the compute stream waits
           for every copy (the step reads them). The host's wait there is the part of the trip the step waited for.
  offload  begin_offload(state, kind, tensors) after the step: queue the device->host copies into the host arena;
           the device storages stay allocated, so nothing else can be handed their memory yet.
           finish_offload(state, kind) where the memory is needed (the next push): wait for the copies, then release.
           An onload asked for while an offload is in flight cancels it: the storages never left.
A storage is in exactly one of: on the device, `leaving` (copies in flight, still allocated), `offloaded` (on the
host only, its device storage resized to 0), `arriving` (refilled, copies in flight, not yet waited for).
Storages are moved whole: a storage is the unit the budget counts in (split_by_budget), a few per parameter.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch

GiB = 1 << 30


@dataclass
class Transfer:
    """One batch of storages on its way, and the side stream's markers around its copies."""

    storages: dict[int, tuple[Any, int]]  # storage key -> (storage, bytes)
    start: Any = None
    end: Any = None

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.storages.values())


@dataclass
class Moved:
    """What one kind's finished trip cost: bytes, the copies' own time, and the time the caller waited for them."""

    nbytes: int = 0
    copy_seconds: float = 0.0  # from the first copy's start to the last one's end (device time on a GPU)
    exposed_seconds: float = 0.0  # the part of it the caller waited for (the rest ran beside other work)
    overlapped_bytes: int = 0  # onload: bytes already under way before the finish was asked for

    def __add__(self, other: "Moved") -> "Moved":
        return Moved(self.nbytes + other.nbytes, self.copy_seconds + other.copy_seconds,
                     self.exposed_seconds + other.exposed_seconds, self.overlapped_bytes + other.overlapped_bytes)


def free_device_bytes() -> int:
    """Bytes a new allocation could take now: the device's free memory plus what torch's caching allocator holds
    unused (0 without CUDA)."""
    if not torch.cuda.is_available():
        return 0
    free, _ = torch.cuda.mem_get_info()
    return int(free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated())


BACKOFF_MIN_BYTES = 2 * GiB  # the least a budget backs off by after a forward/backward that retried an allocation


@dataclass
class OverlapBudget:
    """How much offloaded optimizer state may come back while the forward/backward runs: what the device has free
    at the update's start, less `reserve` (what the forward/backward will add: the plan's activations and a margin,
    hybridrl.plan.memory.onload_reserve) and less `backoff`. Nothing overlaps when that leaves nothing (the serial
    path).

    `backoff` is learned (observe): the plan's margin does not know the caching allocator's fragmentation, and a
    forward/backward that finds no cached block and no free device memory has the allocator free its cache and retry;
    that cudaFree synchronizes the device, so the compute waits for the side stream's copies and the overlap is lost
    (phases.py). After such an update the budget keeps more free; it never shrinks the backoff again."""

    reserve: int
    free: Callable[[], int] = free_device_bytes
    backoff: int = 0

    def allowed(self) -> int:
        return max(0, self.free() - self.reserve - self.backoff)

    def observe(self, sent: int, retries: int) -> int:
        """After an update that sent `sent` bytes for at its start and whose forward/backward retried `retries`
        allocations: back off by a quarter of `sent` (at least BACKOFF_MIN_BYTES) when both are positive, since a
        retry costs about the whole copy time while each GiB held back costs ~20 ms of exposed copy (50 GB/s).
        Returns the bytes added."""
        if sent <= 0 or retries <= 0:
            return 0
        step = max(BACKOFF_MIN_BYTES, sent // 4)
        self.backoff += step
        return step


def split_by_budget(sizes: list[tuple[int, int]], budget: Optional[int]) -> tuple[list[int], list[int]]:
    """(keys that fit in `budget` bytes, the rest), in `sizes` order: each (key, bytes) is taken while it fits, a
    storage too big for what is left is skipped for smaller ones after it. budget None: everything fits."""
    if budget is None:
        return [k for k, _ in sizes], []
    now, later, left = [], [], budget
    for key, nbytes in sizes:
        if nbytes <= left:
            now.append(key)
            left -= nbytes
        else:
            later.append(key)
    return now, later


def storage_key(storage: Any) -> int:
    """What stays the same for a storage across resize_ (its StorageImpl), unlike data_ptr()."""
    return storage._cdata


def unique_storages(tensors: Iterable[torch.Tensor], skip: set[int], device_type: str) -> dict[int, Any]:
    """The distinct non-empty storages of `tensors` on `device_type`, by key, leaving out the keys in `skip`."""
    out = {}
    for t in tensors:
        if t is None or t.device.type != device_type:
            continue
        s = t.untyped_storage()
        key = storage_key(s)
        if s.nbytes() > 0 and key not in skip:
            out[key] = s
    return out


def bytes_view(storage: Any) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def away_keys(state: Any) -> set[int]:
    """Storages of every kind that are not plainly on the device (on the host or on their way there)."""
    keys = {k for d in state.offloaded.values() for k in d}
    return keys | {k for t in state.leaving.values() for k in t.storages}


# ------------------------------------------------------------------------------------------------ offload
def begin_offload(state: Any, kind: str, tensors: Iterable[torch.Tensor]) -> int:
    """Queue the device->host copies of `kind`'s storages that are still on the device; returns their bytes.
    They stay allocated until finish_offload."""
    if kind in state.leaving:
        return 0
    if state.arriving.get(kind):  # an update that raised between the halves of an onload: settle it first
        finish_onload(state, kind)
    storages = unique_storages(tensors, away_keys(state), state.device_type)
    if not storages:
        return 0
    held = {key: n for key, (_, n) in state.offloaded[kind].items()}
    sizes = {**held, **{key: s.nbytes() for key, s in storages.items()}}
    arena = state.arena(kind, sizes)
    copier = state.copier
    copier.side_waits_main()  # the copies read what the compute stream wrote last (the optimizer step)
    start = copier.mark()
    copier.copy_all((arena.view(key), bytes_view(s)) for key, s in storages.items())
    transfer = Transfer({key: (s, s.nbytes()) for key, s in storages.items()}, start, copier.mark())
    state.leaving[kind] = transfer
    return transfer.nbytes


def finish_offload(state: Any, kind: str) -> Moved:
    """Wait for `kind`'s device->host copies, then release their device storages (resized to 0 bytes)."""
    transfer = state.leaving.pop(kind, None)
    if transfer is None:
        return Moved()
    start = time.perf_counter()
    state.copier.host_waits(transfer.end)  # a storage the copies still read must not go back to the allocator
    exposed = time.perf_counter() - start
    for key, (storage, nbytes) in transfer.storages.items():
        state.offloaded[kind][key] = (storage, nbytes)
        storage.resize_(0)
    return Moved(transfer.nbytes, state.copier.seconds(transfer.start, transfer.end), exposed)


def cancel_offload(state: Any, kind: str) -> None:
    """An offload in flight stops where it is: its storages never left the device. The compute stream's next
    writes into them (the optimizer step) wait for the copies still reading them."""
    transfer = state.leaving.pop(kind, None)
    if transfer is not None:
        state.copier.main_waits(transfer.end)


# ------------------------------------------------------------------------------------------------ onload
def begin_onload(state: Any, kind: str, budget: Optional[int] = None) -> int:
    """Refill the offloaded storages of `kind` that fit in `budget` bytes (None: all) and queue their host->device
    copies; returns their bytes. The compute stream must not read them before finish_onload."""
    cancel_offload(state, kind)
    waiting = state.offloaded[kind]
    keys, _ = split_by_budget([(key, n) for key, (_, n) in waiting.items()], budget)
    if not keys:
        return 0
    arena, storages, pairs = state.pinned[kind], {}, []
    for key in keys:
        storage, nbytes = waiting.pop(key)
        storage.resize_(nbytes)  # allocated on the compute stream, in its order
        storages[key] = (storage, nbytes)
        pairs.append((bytes_view(storage), arena.view(key)))
    copier = state.copier
    copier.side_waits_main()  # the block may be one the compute stream's queued kernels still use
    start = copier.mark()
    copier.copy_all(pairs)
    transfer = Transfer(storages, start, copier.mark())
    state.arriving.setdefault(kind, []).append(transfer)
    return transfer.nbytes


def finish_onload(state: Any, kind: str) -> Moved:
    """Bring back what is still on the host, and make the compute stream wait for every copy of `kind`; the host
    waits too, so that the time the caller waited is measured here."""
    start = time.perf_counter()
    overlapped = sum(t.nbytes for t in state.arriving.get(kind, []))
    begin_onload(state, kind)
    transfers = state.arriving.pop(kind, [])
    if not transfers:
        return Moved()
    copier = state.copier
    for t in transfers:
        copier.main_waits(t.end)
    copier.host_waits(transfers[-1].end)  # one stream: the last marker comes after every earlier copy
    return Moved(sum(t.nbytes for t in transfers), sum(copier.seconds(t.start, t.end) for t in transfers),
                 time.perf_counter() - start, overlapped)
