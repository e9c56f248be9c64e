"""Moving a role's params / grads / optimizer state to pinned CPU memory and back (GPU only).
The host memory is one pinned.PinnedBuffer per kind (HostArena): registered once, reused every step, and allocated
ahead of time in the background where the role knows it will offload (`reserve_host`).

Works at the level of tensor STORAGES: a storage is copied to a pinned host buffer and resized to 0
bytes, then resized back and refilled on onload. Every tensor, view and buffer that megatron holds
(DDP's contiguous param/grad buffers, the distributed optimizer's shards, Float16Module params)
stays the same Python object, so nothing has to be re-wired after onload.
Params and optimizer state are copied on a side stream (overlap.py: copier.py's ordering rules); `offload()` and
`onload()` here finish what they start, while MegatronRole also splits the optimizer state's trips in halves that
overlap other work (overlap.begin_* / finish_*).
Gradients are not copied: they are zeroed at the start of every update, so their memory is only
released on offload and re-zeroed on onload (reported as bytes released).
On CPU the state already lives in host memory: both calls are no-ops reporting 0 bytes. (Tests run the same moves
on host memory with `State(device_type="cpu")`.)
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import torch

from hybridrl.adapters.base import OffloadReport

from . import compat, overlap
from .copier import Copier, CudaCopier
from .overlap import Moved, Transfer, bytes_view, storage_key, unique_storages
from .pinned import HostReserve, PinnedBuffer

log = logging.getLogger(__name__)

ALIGN = 512  # bytes; each storage's slot in a host arena starts on this boundary
SLOW_PIN_BYTES_PER_S = 4e9  # pinning slower than this is logged as a warning, with its phases (pinned_bench: 11e9)
KEPT = ("params", "optimizer")  # kinds whose bytes are copied (grads are released and zeroed again)


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


@dataclass
class HostArena:
    """One pinned host buffer holding a kind's storages back to back.

    One registration per kind instead of one per storage: the ~1,000 optimizer tensors of a 1.5B model took
    3.6 s to pin one by one and 0.7 s as one buffer (benchmarks/results/pinned_bench.md).
    """

    buffer: PinnedBuffer
    slots: dict[int, tuple[int, int]]  # storage key -> (offset, nbytes)

    @staticmethod
    def layout(sizes: dict[int, int]) -> tuple[dict[int, tuple[int, int]], int]:
        """(slots, bytes the buffer needs) for storages of `sizes` (key -> bytes)."""
        slots, offset = {}, 0
        for key, nbytes in sizes.items():
            slots[key] = (offset, nbytes)
            offset += aligned(nbytes)
        return slots, offset

    @classmethod
    def build(cls, sizes: dict[int, int]) -> "HostArena":
        slots, nbytes = cls.layout(sizes)
        return cls(PinnedBuffer(nbytes, pin=compat.cuda_in_use()), slots)

    def holds(self, sizes: dict[int, int]) -> bool:
        return {key: n for key, (_, n) in self.slots.items()} == sizes

    def view(self, key: int) -> torch.Tensor:
        offset, nbytes = self.slots[key]
        return self.buffer.tensor[offset:offset + nbytes]


@dataclass
class State:
    """Offloaded storages of one role, by kind, the host arenas kept for reuse, and the copies in flight.

    Keyed by the storage's identity (`storage_key`), not its address: onload re-allocates a storage, so its
    data_ptr changes every round, and buffers keyed by address were never found again (a fresh pinned allocation
    per storage per step, and the old ones kept alive). `device_type` is where the moved storages live ("cuda";
    tests move host storages with "cpu").
    """

    offloaded: dict[str, dict[int, tuple[Any, int]]] = field(default_factory=lambda: {"params": {}, "grads": {}, "optimizer": {}})
    pinned: dict[str, HostArena] = field(default_factory=dict)
    fresh: list[PinnedBuffer] = field(default_factory=list)  # pinned since the last OffloadReport
    leaving: dict[str, Transfer] = field(default_factory=dict)  # overlap.py: offloads in flight
    arriving: dict[str, list[Transfer]] = field(default_factory=dict)  # overlap.py: onloads in flight
    device_type: str = "cuda"
    reserve: Optional[HostReserve] = None  # buffers being allocated ahead of their first use
    reserve_waited: float = 0.0  # of reserve.waited, already reported
    _copier: Optional[Copier] = None

    @property
    def copier(self) -> Copier:
        if self._copier is None:
            self._copier = CudaCopier() if self.device_type == "cuda" and torch.cuda.is_available() else Copier()
        return self._copier

    def active(self) -> bool:
        """Whether anything moves: on a GPU, or host storages standing in for one."""
        return self.device_type != "cuda" or compat.cuda_in_use()

    def pinned_bytes(self) -> int:
        return sum(a.buffer.nbytes for a in self.pinned.values())

    def arena(self, kind: str, sizes: dict[int, int]) -> HostArena:
        """The kind's arena for storages of `sizes`: the same one while they stay the same; new slots in the same
        buffer when they changed and fill at least half of it (the optimizer's Adam moments appear at its first
        step: its reserved buffer was sized for them); a new buffer (the reserved one where it is large enough)
        otherwise, so that a much smaller state (e.g. a rebuilt optimizer) does not keep the old one pinned."""
        old = self.pinned.get(kind)
        if old is not None and old.holds(sizes):
            return old
        if self.offloaded[kind]:  # re-slotting would overwrite storages that live only in this arena
            raise RuntimeError(f"offload: the {kind} storages changed while some were on the host")
        slots, need = HostArena.layout(sizes)
        buffer = old.buffer if old is not None and need <= old.buffer.nbytes <= 2 * need else None
        if buffer is None:
            if old is not None:  # its data is on the device (nothing of this kind is offloaded): free it first
                old.buffer.release()
                del self.pinned[kind], old
            buffer = self._reserved(kind, need)
        if buffer is None:
            buffer = PinnedBuffer(need, pin=compat.cuda_in_use())
            self.fresh.append(buffer)
        self.pinned[kind] = HostArena(buffer, slots)
        return self.pinned[kind]

    def _reserved(self, kind: str, need: int) -> Optional[PinnedBuffer]:
        buffer = self.reserve.take(kind) if self.reserve is not None else None
        if buffer is not None and buffer.nbytes < need:
            log.info("offload: the %.2f GB reserved for the %s state is short of %.2f GB; pinning anew",
                     buffer.nbytes / 1e9, kind, need / 1e9)
            buffer.release()
            return None
        if buffer is not None:
            _log_pinning([buffer], background=True)
        return buffer

    def waited_for_reserve(self) -> float:
        """Seconds callers waited for the background allocation since the last call."""
        if self.reserve is None:
            return 0.0
        new, self.reserve_waited = self.reserve.waited - self.reserve_waited, self.reserve.waited
        return new


# ------------------------------------------------------------------------------------------------ whole moves
def offload(engine: Any, state: State, params: bool, grads: bool, optimizer: bool) -> OffloadReport:
    """Move the kinds to the host and release their device memory (finishing an offload begun earlier)."""
    return _move(engine, state, {"params": params, "grads": grads, "optimizer": optimizer}, to_host=True)


def onload(engine: Any, state: State, params: bool, grads: bool, optimizer: bool) -> OffloadReport:
    """Bring the kinds back, the compute stream ordered after their copies."""
    return _move(engine, state, {"params": params, "grads": grads, "optimizer": optimizer}, to_host=False)


def begin_offload(engine: Any, state: State, params: bool, optimizer: bool) -> int:
    """Queue the copies of the kinds to the host and return; the next offload() of them finishes (waits, releases).
    Returns the bytes under way."""
    if not state.active():
        return 0
    return sum(overlap.begin_offload(state, kind, TENSORS[kind](engine, state.device_type))
               for kind, wanted in (("params", params), ("optimizer", optimizer)) if wanted)


def _move(engine: Any, state: State, wanted: dict[str, bool], to_host: bool) -> OffloadReport:
    if not state.active():
        return OffloadReport()
    start = time.perf_counter()
    compat.synchronize_stream()  # the compute stream's queued work is not offload's time (copies in flight are)
    waited = time.perf_counter() - start
    moved = {kind: Moved() for kind in wanted}
    for kind in ("params", "grads", "optimizer"):
        if not wanted[kind]:
            continue
        if kind not in KEPT:
            moved[kind] = Moved(_release(TENSORS[kind](engine, state.device_type), state, kind) if to_host
                                else _restore_zeroed(state, kind))
        elif to_host:
            overlap.begin_offload(state, kind, TENSORS[kind](engine, state.device_type))
            moved[kind] = overlap.finish_offload(state, kind)
        else:
            moved[kind] = overlap.finish_onload(state, kind)
    compat.synchronize_stream()
    if to_host:
        compat.empty_cache()
    fresh, state.fresh = state.fresh, []
    alloc = sum(sum(b.seconds.values()) for b in fresh) + state.waited_for_reserve()
    if fresh:
        _log_pinning(fresh)
    opt = moved["optimizer"]
    return OffloadReport(params_bytes=moved["params"].nbytes, grads_bytes=moved["grads"].nbytes,
                         optimizer_bytes=opt.nbytes, seconds=time.perf_counter() - start, wait_seconds=waited,
                         host_alloc_seconds=alloc, optimizer_seconds=opt.copy_seconds,
                         optimizer_exposed_seconds=opt.exposed_seconds)


def _release(tensors: Iterable[torch.Tensor], state: State, kind: str) -> int:
    """Resize the kind's device storages to 0 bytes without copying them (grads: zeroed at every update's start)."""
    storages = unique_storages(tensors, overlap.away_keys(state), state.device_type)
    total = 0
    for key, storage in storages.items():
        total += storage.nbytes()
        state.offloaded[kind][key] = (storage, storage.nbytes())
        storage.resize_(0)
    return total


def _restore_zeroed(state: State, kind: str) -> int:
    total = 0
    for key, (storage, nbytes) in list(state.offloaded[kind].items()):
        storage.resize_(nbytes)
        bytes_view(storage).zero_()
        del state.offloaded[kind][key]
        total += nbytes
    return total


def _offload_storages(tensors: Iterable[torch.Tensor], state: State, kind: str, keep: bool,
                      device_type: Optional[str] = None) -> int:
    """One kind to the host (keep: copied, else released), whole: the storage-level core of offload()."""
    if device_type is not None:
        state.device_type = device_type
    if not keep:
        return _release(tensors, state, kind)
    overlap.begin_offload(state, kind, tensors)
    return overlap.finish_offload(state, kind).nbytes


def _onload_storages(state: State, kind: str, keep: bool) -> int:
    return overlap.finish_onload(state, kind).nbytes if keep else _restore_zeroed(state, kind)


def _log_pinning(buffers: list[PinnedBuffer], background: bool = False) -> None:
    """Once per run (per new set of storages); a warning, with the phases, when it ran slower than expected."""
    nbytes = sum(b.nbytes for b in buffers)
    phases = {k: sum(b.seconds[k] for b in buffers) for k in buffers[0].seconds}
    seconds = sum(phases.values())
    say = log.warning if nbytes < SLOW_PIN_BYTES_PER_S * seconds else log.info
    say("offload: pinning %.2f GB of host memory took %.2f s%s (%s); it is reused from now on", nbytes / 1e9, seconds,
        " in the background" if background else "", ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))


# ------------------------------------------------------------------------------------------------ host memory ahead
def reserve_host(engine: Any, state: State, kinds: Iterable[str]) -> Optional[HostReserve]:
    """Start allocating the host arenas of `kinds` (params, optimizer) in the background, sized for the state as it
    will be after the first optimizer step (host_bytes); the first offload takes them over."""
    if not state.active() or state.reserve is not None:
        return state.reserve
    sizes = {kind: n for kind in kinds if kind in KEPT and (n := host_bytes(engine, kind, state.device_type))}
    if sizes:
        device = torch.cuda.current_device() if compat.cuda_in_use() else None
        state.reserve = HostReserve(sizes, pin=compat.cuda_in_use(), device=device)
    return state.reserve


def host_bytes(engine: Any, kind: str, device_type: str = "cuda") -> int:
    """Bytes the kind's host arena needs: its storages now, plus (optimizer) the state the optimizer creates at
    its first step for params that have none yet."""
    storages = unique_storages(TENSORS[kind](engine, device_type), set(), device_type)
    now = sum(aligned(s.nbytes()) for s in storages.values())
    return now + (sum(aligned(n) for n in _state_to_come(engine, device_type)) if kind == "optimizer" else 0)


def _state_to_come(engine: Any, device_type: str) -> list[int]:
    """Bytes of each device tensor the optimizer will create at its first step (as torch's Adam/AdamW, SGD and
    TE/apex FusedAdam do: moments shaped like the param; torch's fused or capturable Adam keeps `step` on the
    device too). An optimizer of another kind is counted as Adam; a short count only costs a second pinning."""
    out = []
    for inner in _inner_optimizers(engine):
        for group in inner.param_groups:
            if isinstance(inner, torch.optim.SGD):
                per_param, step = (1 if group.get("momentum") else 0), False
            else:
                per_param = 3 if group.get("amsgrad") else 2
                # torch keeps `step` beside the param when fused or capturable, else on the host (which is the
                # device only for the host stand-in)
                step = isinstance(inner, torch.optim.Adam | torch.optim.AdamW) and bool(
                    group.get("fused") or group.get("capturable") or device_type == "cpu")
            for p in group["params"]:
                if inner.state.get(p) or p.device.type != device_type:
                    continue
                out += [p.numel() * p.element_size()] * per_param + ([4] if step else [])
    return out


# ------------------------------------------------------------------------------------------------ what moves
def _param_tensors(engine: Any, device_type: str = "cuda") -> list[torch.Tensor]:
    return [p.data for c in engine.chunks for p in c.parameters()]


def _grad_tensors(engine: Any, device_type: str = "cuda") -> list[torch.Tensor]:
    out = []
    for c in engine.chunks:
        for buf in getattr(c, "buffers", []) + getattr(c, "expert_parallel_buffers", []):
            if buf.grad_data is not None:
                out.append(buf.grad_data)
    return out


def _inner_optimizers(engine: Any) -> list[Any]:
    if engine.optimizer is None:
        return []
    chained = getattr(engine.optimizer, "chained_optimizers", [engine.optimizer])
    return [inner for opt in chained if (inner := getattr(opt, "optimizer", None)) is not None]


def _optimizer_tensors(engine: Any, device_type: str = "cuda") -> list[torch.Tensor]:
    """Optimizer state and fp32 main params (model params themselves are excluded by storage)."""
    model = {storage_key(p.untyped_storage()) for p in _param_tensors(engine)}
    out = []
    for inner in _inner_optimizers(engine):
        for group in inner.param_groups:
            out += [p.data for p in group["params"] if storage_key(p.data.untyped_storage()) not in model]
        for st in inner.state.values():
            out += [v for v in st.values() if isinstance(v, torch.Tensor)]
    return out


TENSORS = {"params": _param_tensors, "grads": _grad_tensors, "optimizer": _optimizer_tensors}
