"""Device memory readings shared by the workers' logs and the benchmarks."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


def device_memory_used() -> int:
    """Bytes in use on this process's CUDA device (every allocator, every process), after returning the
    caching allocator's unused blocks; 0 on CPU."""
    if not torch.cuda.is_available():
        return 0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def torch_memory_counts() -> dict[str, int]:
    """torch's own view of this process's device memory (allocated in live tensors; reserved by its caching
    allocator, which includes pools such as vLLM's sleep-mode pool); {} on CPU. Beside device_memory_used it tells
    a leak (allocated grows) from fragmentation (reserved grows past allocated) from memory outside torch."""
    if not torch.cuda.is_available():
        return {}
    return {"allocated": int(torch.cuda.memory_allocated()), "reserved": int(torch.cuda.memory_reserved())}


def synchronize() -> None:
    """Wait for this process's queued device work (timings end here); no-op on CPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


@contextmanager
def train_peak_memory() -> Iterator[dict[str, int]]:
    """Peak bytes in use on this device during the block, filled in on exit ({} on CPU): "bytes" the peak,
    "held" the caching allocator's memory in no live tensor at the block's start that empty_cache could not return
    (segments a live block pins: fragmentation, part of "bytes" and of no `hybridrl plan` component).

    torch's own peak counters also count a slept vLLM pool (unmapped, not resident), so the peak is the
    memory resident when the block starts plus the block's own rise in allocated bytes above that."""
    out: dict[str, int] = {}
    if not torch.cuda.is_available():
        yield out
        return
    resident = device_memory_used()
    base = torch.cuda.memory_allocated()
    held = torch.cuda.memory_reserved() - base
    torch.cuda.reset_peak_memory_stats()
    yield out
    out["bytes"] = resident + torch.cuda.max_memory_allocated() - base
    out["held"] = held


def peak_metrics(phase: str, peak: dict[str, int]) -> dict[str, float]:
    """memory/{phase}_peak_bytes (what `hybridrl plan`'s phase is compared with) and memory/{phase}_cache_held_bytes
    of a train_peak_memory block ({} on CPU)."""
    out = {f"memory/{phase}_peak_bytes": float(peak["bytes"])} if peak else {}
    if "held" in peak:
        out[f"memory/{phase}_cache_held_bytes"] = float(peak["held"])
    return out
