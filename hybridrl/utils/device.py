"""Device memory readings shared by the workers' logs and the benchmarks."""
from __future__ import annotations

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


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
