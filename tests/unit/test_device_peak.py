"""hybridrl.utils.device.train_peak_memory over a fake CUDA caching allocator (CPU): each window's peak counter is
reset at its start, so a phase never reports an earlier phase's peak; the peak is what was resident at the start
plus the window's own rise; memory the allocator holds in no live tensor (pinned segments) is reported apart."""
from __future__ import annotations

import types

import pytest

import hybridrl.utils.device as dev

GB = 10 ** 9


class FakeAllocator:
    """torch.cuda's counters for one process: live bytes, reserved segments, a peak that reset_peak_memory_stats
    sets back to the current value; `other` is device memory outside the allocator (context, other processes)."""

    def __init__(self, other: int) -> None:
        self.allocated = self.peak = 0
        self.held = 0  # reserved in no live tensor that empty_cache cannot return (pinned by live blocks)
        self.other = other

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n: int) -> None:
        self.allocated -= n

    def cuda(self) -> types.SimpleNamespace:
        def reset() -> None:
            self.peak = self.allocated

        return types.SimpleNamespace(is_available=lambda: True, memory_allocated=lambda: self.allocated,
                                     memory_reserved=lambda: self.allocated + self.held,
                                     max_memory_allocated=lambda: self.peak, reset_peak_memory_stats=reset)


@pytest.fixture
def fake(monkeypatch):
    a = FakeAllocator(other=2 * GB)
    monkeypatch.setattr(dev.torch, "cuda", a.cuda())
    monkeypatch.setattr(dev, "device_memory_used", lambda: a.other + a.allocated + a.held)  # after empty_cache
    return a


def test_each_window_resets_the_peak_and_reports_the_held_cache(fake):
    fake.alloc(10 * GB)  # training state, resident in every phase
    with dev.train_peak_memory() as update:  # the update: 30 GB of activations, freed at its end
        fake.alloc(30 * GB)
        fake.free(30 * GB)
    fake.held = 8 * GB  # what the update left pinned
    with dev.train_peak_memory() as reward:  # the next step's reward model: 1 GB params + 2 GB activations
        fake.alloc(3 * GB)
        fake.free(3 * GB)
    assert update == {"bytes": 2 * GB + 10 * GB + 30 * GB, "held": 0}
    # not the update's 40 GB peak (the counter was reset), but the 8 GB held are in it: resident at the start
    assert reward == {"bytes": 2 * GB + 10 * GB + 8 * GB + 3 * GB, "held": 8 * GB}
    assert dev.peak_metrics("reward", reward) == {"memory/reward_peak_bytes": float(23 * GB),
                                                  "memory/reward_cache_held_bytes": float(8 * GB)}


def test_no_metrics_on_cpu():
    assert dev.peak_metrics("ref", {}) == {}
