"""Where one update's time goes, phase by phase, and how often torch's caching allocator called the driver meanwhile.

Why: on an H200 the 7B train_bench update took ~4.3 s more than its forward/backward, optimizer step and exposed
onload together (benchmarks/results/startup.md), and overlapping the optimizer state's onload slowed the
forward/backward by about as much as it hid. A phase clock that the update's result carries shows where such time
goes on the next GPU run without a profiler.

Cheap by construction: a phase ends at a host clock reading taken where the update already waits for the device
(the engine's stream synchronizations) or does host work only, so it adds no synchronization; the allocator counters
are host-side statistics (torch.cuda.memory_stats). The counters matter because the allocator's driver calls are
where a side-stream copy can stall the compute: cudaFree (an allocation retry frees the cache) synchronizes the whole
device, so it waits for every copy in flight on the side stream (copier.py).
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from . import compat

# our name -> torch.cuda.memory_stats() key
COUNTERS = {"alloc_retries": "num_alloc_retries", "cuda_mallocs": "num_device_alloc", "cuda_frees": "num_device_free"}
# an update's phases in their order (MegatronRole._update and Engine.train_step mark them), and the parts of the update
# the allocator counters are reported for (memory/{role}_{counter}_{part}), by the phases that make them up
UPDATE_PHASES = ("micro_batches", "onload_begin", "stream_wait", "forward_backward", "onload_wait", "optimizer_step",
                 "metrics")
UPDATE_PARTS = {"before_forward": ("micro_batches", "onload_begin", "stream_wait"),
                "forward_backward": ("forward_backward",),
                "after_backward": ("onload_wait", "optimizer_step", "metrics")}


def allocator_counts() -> dict[str, int]:
    """The caching allocator's running counts of COUNTERS ({} without CUDA)."""
    if not compat.cuda_in_use():
        return {}
    stats = torch.cuda.memory_stats()
    return {name: int(stats.get(key, 0)) for name, key in COUNTERS.items()}


class Phases:
    """Consecutive phases from construction on: `mark(name)` ends the phase running since the previous mark (or the
    start) and adds its seconds and counter increments to `name` (a name may recur: one per mini-batch)."""

    def __init__(self, counts: Callable[[], dict[str, int]] = allocator_counts,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._counts, self._clock = counts, clock
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self._start = self._t = clock()
        self._c = counts()

    def mark(self, name: str) -> float:
        """End the running phase as `name`; returns its seconds."""
        t, c = self._clock(), self._counts()
        s = t - self._t
        self.seconds[name] = self.seconds.get(name, 0.0) + s
        mine = self.counts.setdefault(name, {})
        for k, v in c.items():
            mine[k] = mine.get(k, 0) + v - self._c.get(k, 0)
        self._t, self._c = t, c
        return s

    def elapsed(self) -> float:
        """Seconds from construction to the last mark: the sum of the phases."""
        return self._t - self._start

    def count(self, counter: str, names: tuple[str, ...]) -> int:
        """`counter`'s increments over the phases `names` (0 for phases not run)."""
        return sum(self.counts.get(n, {}).get(counter, 0) for n in names)
