"""Page-locked host buffers of exactly the size asked for: where offload keeps params and optimizer state.

torch's own pinned allocator (`torch.empty(..., pin_memory=True)`) rounds every block up to a power of two
and pins it with cudaHostAlloc. On an H200 the first offload of a 1.5B model's optimizer state (18.5 GB) took
13.3 s that way, against 0.4 s for every later offload (benchmarks/results/pinned_bench.md). Here a host
mapping of the exact size, with transparent huge pages asked for, is faulted in (one byte per page) and then
registered with cudaHostRegister, which then only has to lock pages that already exist.

HostReserve allocates such buffers ahead of their first use, on a thread: the 7B one-GPU run's first offload spent
36 s pinning ~90 GB (benchmarks/results/four_gpu.md), inside its first training step; started at build time, the
pinning runs beside the rest of the start-up instead.

A registered buffer is unregistered before its memory can go back to the allocator (`release()`, or when the
PinnedBuffer is garbage collected): memory freed while registered could come back from malloc at the same
address and fail the next registration. Views of `tensor` that outlive the buffer stay valid, only unpinned.
Without CUDA the buffer is a plain host tensor.
"""
from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from typing import Optional

import torch

log = logging.getLogger(__name__)

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
HUGE_PAGES = True  # madvise(MADV_HUGEPAGE) on the buffers (the benchmark turns it off to compare)
_FALLBACK_WARNED = False


class PinnedBuffer:
    """`tensor`: a uint8 host tensor of exactly `nbytes`, page-locked when CUDA is in use.

    `seconds` says where the pinning time went: map (the mapping), fault (touching every page), register.
    """

    def __init__(self, nbytes: int, pin: bool = True) -> None:
        self.nbytes = nbytes
        self.registered = False
        self.seconds = {"map": 0.0, "fault": 0.0, "register": 0.0}
        if not (pin and nbytes > 0 and torch.cuda.is_available()):
            self.tensor = torch.empty(nbytes, dtype=torch.uint8)
            return
        t0 = time.perf_counter()
        self.tensor = host_memory(nbytes)
        t1 = time.perf_counter()
        prefault(self.tensor)
        t2 = time.perf_counter()
        err = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), nbytes, 0)
        self.seconds = {"map": t1 - t0, "fault": t2 - t1, "register": time.perf_counter() - t2}
        if int(err) == 0:
            self.registered = True
            return
        # e.g. a container whose RLIMIT_MEMLOCK forbids it: torch's allocator still pins (slower, rounded up).
        _warn_fallback(err, nbytes)
        self.tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def release(self) -> None:
        if self.registered:
            self.registered = False
            try:
                torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
            except Exception:  # interpreter shutdown: the CUDA runtime may already be gone
                pass

    def __del__(self) -> None:
        self.release()


def host_memory(nbytes: int) -> torch.Tensor:
    """A uint8 tensor over its own anonymous mapping, with transparent huge pages asked for where allowed.

    2 MiB pages mean 512x fewer page faults and pages to lock; the mapping goes back to the OS with the tensor.
    """
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if HUGE_PAGES and hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(m, dtype=torch.uint8)


def prefault(t: torch.Tensor) -> None:
    """Touch one byte per page of the uint8 host tensor `t` (8 threads measured no faster than one)."""
    t[::PAGE].fill_(0)


def _warn_fallback(err, nbytes: int) -> None:
    global _FALLBACK_WARNED
    if not _FALLBACK_WARNED:
        _FALLBACK_WARNED = True
        log.warning("cudaHostRegister of %.2f GB failed (%s); offload buffers fall back to torch's pinned allocator "
                    "(blocks rounded up to a power of two, slower first offload). Check `ulimit -l` on this node.",
                    nbytes / 1e9, err)


class HostReserve:
    """PinnedBuffers of the given sizes (bytes by kind), allocated on a background thread from construction on.

    `take(kind)` hands one over, waiting for the thread first; `seconds` is the thread's time and `waited` the
    time callers spent waiting for it (what the reservation did not hide). A thread that failed (e.g. the host
    is out of memory) leaves no buffers: callers fall back to pinning at first use, with a warning.
    """

    def __init__(self, sizes: dict[str, int], pin: bool = True, device: Optional[int] = None) -> None:
        self.sizes = dict(sizes)
        self.seconds = 0.0
        self.waited = 0.0
        self.buffers: dict[str, PinnedBuffer] = {}
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(pin, device), name="hybridrl-host-reserve",
                                        daemon=True)
        self._thread.start()

    def _run(self, pin: bool, device: Optional[int]) -> None:
        start = time.perf_counter()
        try:
            if pin and device is not None and torch.cuda.is_available():
                torch.cuda.set_device(device)  # register with the context of the device the copies run on
            for kind, nbytes in self.sizes.items():
                self.buffers[kind] = PinnedBuffer(nbytes, pin=pin)
        except BaseException as e:  # reported by wait(), on the caller's thread
            self.error = e
        self.seconds = time.perf_counter() - start

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        if self._thread.is_alive():
            start = time.perf_counter()
            self._thread.join()
            self.waited += time.perf_counter() - start
        if self.error is not None:
            log.warning("allocating %.2f GB of pinned host memory ahead of time failed (%s: %s); offload pins at "
                        "first use instead", sum(self.sizes.values()) / 1e9, type(self.error).__name__, self.error)
            self.error = None
            self.release()

    def take(self, kind: str) -> Optional[PinnedBuffer]:
        self.wait()
        return self.buffers.pop(kind, None)

    def release(self) -> None:
        """Unregister the buffers nobody took (they go back to the OS with their mappings)."""
        for buf in self.buffers.values():
            buf.release()
        self.buffers.clear()
