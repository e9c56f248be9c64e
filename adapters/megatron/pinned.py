"""Page-locked host buffers of exactly the size asked for: where offload keeps params and optimizer state.

torch's own pinned allocator (`torch.empty(..., pin_memory=True)`) rounds every block up to a power of two
and pins it with cudaHostAlloc. On an H200 the first offload of a 1.5B model's optimizer state (18.5 GB) took
13.3 s that way, against 0.4 s for every later offload (benchmarks/results/pinned_bench.md). Here a host
mapping of the exact size, with transparent huge pages asked for, is faulted in (one byte per page) and then
registered with cudaHostRegister, which then only has to lock pages that already exist.

A registered buffer is unregistered before its memory can go back to the allocator (`release()`, or when the
PinnedBuffer is garbage collected): memory freed while registered could come back from malloc at the same
address and fail the next registration. Views of `tensor` that outlive the buffer stay valid, only unpinned.
Without CUDA the buffer is a plain host tensor.
"""
from __future__ import annotations

import logging
import mmap
import os
import time

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
