"""Where offload's host<->device copies run: a side CUDA stream, ordered against the compute stream by events.

Why a side stream: a copy queued on the compute (current) stream starts only after every kernel queued before it and
holds back every kernel queued after it. On a stream of its own the optimizer state comes back from the host while
the forward/backward computes (the copy engines and the SMs work at once), and goes back while the next phase starts.

The rules the callers keep (overlap.py), each for a hazard of running two streams over one caching allocator:
  - a device block allocated on the compute stream is written by the side stream only after `side_waits_main()`:
    the block may be one the compute stream's queued kernels still use (the allocator reuses blocks in stream order);
  - the compute stream reads what the side stream wrote only after `main_waits(marker)`;
  - a device block the side stream reads is freed only after `host_waits(marker)`: the allocator does not know
    about the side stream's use and would hand the block to the compute stream at once.

`Copier` is the interface and the CPU stand-in (each copy runs at once on the calling thread, markers are host
clock readings); `CudaCopier` is the GPU's. Tests drive the same bookkeeping with stand-ins that hold copies back.
"""
from __future__ import annotations

import time
from typing import Any, Iterable

import torch


class Copier:
    """Copies that run at once (nothing to order): the host-memory stand-in for a device."""

    def side_waits_main(self) -> None:
        """The copies queued from now on start after the compute stream's work queued so far."""

    def copy_all(self, pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """dst.copy_(src) for each (dst, src), queued on the side stream."""
        for dst, src in pairs:
            dst.copy_(src)

    def mark(self) -> Any:
        """A marker after the copies queued so far (a CUDA event on the side stream)."""
        return time.perf_counter()

    def main_waits(self, marker: Any) -> None:
        """The compute stream's work queued from now on starts after `marker` (the host does not block)."""

    def host_waits(self, marker: Any) -> None:
        """Block the calling thread until `marker`'s copies are done."""

    def seconds(self, start: Any, end: Any) -> float:
        """Time between two markers, both waited for (device time on a GPU)."""
        return max(0.0, end - start)


class CudaCopier(Copier):
    """The copies on one side CUDA stream of the current device; markers are timing CUDA events."""

    def __init__(self) -> None:
        self.stream = torch.cuda.Stream()

    def side_waits_main(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream())

    def copy_all(self, pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
        with torch.cuda.stream(self.stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)  # pinned host memory: asynchronous in both directions

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    def main_waits(self, marker: Any) -> None:
        torch.cuda.current_stream().wait_event(marker)

    def host_waits(self, marker: Any) -> None:
        marker.synchronize()

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3  # milliseconds between the two events
