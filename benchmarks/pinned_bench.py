"""The first offload's extra cost: page-locking host memory for a role's state, torch vs hybridrl's arena.

The first offload after the first update allocates host memory for the whole optimizer state (a 1.5B model
with Adam: fp32 main params + 2 moments, 18.5 GB per GPU in ~1,000 tensors); every later offload reuses it.
Ways, timed on the same sizes in one process:
    torch_pin_memory     one torch.empty(n, pin_memory=True) per storage: cudaHostAlloc, rounded up to 2**k
    pinned_per_storage   one pinned.PinnedBuffer per storage (exact size, prefault, cudaHostRegister)
    arena                offload.HostArena: one PinnedBuffer for all storages (what offload uses)
    arena_4k             the same without transparent huge pages (4 KiB pages to fault and lock)
    arena_register_only  the same without the prefault (cudaHostRegister faults the pages in itself)
For each: seconds, host bytes held, and device->host / host->device GB/s into the memory (a pageable buffer,
also measured, shows what an unpinned one would give). The ratio that matters is seconds(torch) / seconds(arena);
the floor is the steady-state offload copy of the same bytes.

    python benchmarks/pinned_bench.py --total-gb 18.5 --storages 1000 --out pinned_bench.json
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from hybridrl.adapters.megatron import offload, pinned  # noqa: E402


def allocate(way: str, sizes: list[int]) -> tuple[list[torch.Tensor], list[object], float]:
    """Page-locked host memory for `sizes` the given way: (one tensor per size, what owns it, seconds)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    owners: list[object] = []
    if way == "torch_pin_memory":
        tensors = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for n in sizes]
    elif way == "pinned_per_storage":
        owners = [pinned.PinnedBuffer(n) for n in sizes]
        tensors = [b.tensor for b in owners]
    else:
        saved = pinned.prefault, pinned.HUGE_PAGES
        if way == "arena_register_only":
            pinned.prefault = lambda t: None
        pinned.HUGE_PAGES = way != "arena_4k"
        try:
            arena = offload.HostArena.build(dict(enumerate(sizes)))
        finally:
            pinned.prefault, pinned.HUGE_PAGES = saved
        owners = [arena.buffer]
        tensors = [arena.view(i) for i in range(len(sizes))]
    return tensors, owners, time.perf_counter() - start


def split(total: int, pieces: int) -> list[int]:
    """`pieces` sizes summing to `total`, a few large (embedding-like) and many small, like a model's tensors."""
    weights = [8.0 if i % 97 == 0 else 1.0 + (i % 7) / 7 for i in range(pieces)]
    scale = total / sum(weights)
    return [max(1, int(w * scale)) for w in weights]


def bandwidth(host: torch.Tensor, device: torch.Tensor) -> tuple[float, float]:
    n = min(host.numel(), device.numel())
    for _ in range(2):
        host[:n].copy_(device[:n], non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    host[:n].copy_(device[:n], non_blocking=True)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    device[:n].copy_(host[:n], non_blocking=True)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return n / (t1 - t0) / 1e9, n / (t2 - t1) / 1e9


def free(tensors: list[torch.Tensor], keep: list[object]) -> None:
    for b in keep:
        b.release()
    tensors.clear()
    keep.clear()
    gc.collect()
    if hasattr(torch._C, "_host_emptyCache"):  # torch's pinned blocks back to the OS between ways
        torch._C._host_emptyCache()


def held_bytes(sizes: list[int], owners: list[object]) -> int:
    """What the PinnedBuffers hold; torch's allocator (no owners) rounds every block up to a power of two."""
    if owners:
        return sum(b.nbytes for b in owners)
    return sum(1 << (n - 1).bit_length() for n in sizes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-gb", type=float, default=18.5, help="Adam state of a 1.5B model on one GPU")
    p.add_argument("--storages", type=int, default=1000, help="how many tensors it is split into")
    p.add_argument("--ways", default="torch_pin_memory,pinned_per_storage,arena,arena_4k,arena_register_only,torch_pin_memory")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    sizes = split(int(a.total_gb * 1e9), a.storages)
    device = torch.empty(max(sizes), dtype=torch.uint8, device="cuda")
    device.fill_(7)
    page = torch.empty(max(sizes), dtype=torch.uint8)
    page.fill_(0)
    d2h_pageable, h2d_pageable = bandwidth(page, device)
    del page
    print(f"[pinned_bench] {len(sizes)} storages, {sum(sizes) / 1e9:.1f} GB; pageable copies: d2h {d2h_pageable:.1f} "
          f"GB/s, h2d {h2d_pageable:.1f} GB/s", flush=True)
    runs: dict[str, dict] = {}
    for way in a.ways.split(","):
        tensors, keep, seconds = allocate(way, sizes)
        d2h, h2d = bandwidth(max(tensors, key=torch.Tensor.numel), device)
        name = way if way not in runs else f"{way}_again"
        phases = {k: round(v, 3) for k, v in getattr(keep[0], "seconds", {}).items()} if len(keep) == 1 else {}
        runs[name] = dict(seconds=round(seconds, 3), phases=phases, gb_per_s=round(sum(sizes) / seconds / 1e9, 2),
                          held_gb=round(held_bytes(sizes, keep) / 1e9, 2), is_pinned=bool(tensors[0].is_pinned()),
                          d2h_gb_per_s=round(d2h, 1), h2d_gb_per_s=round(h2d, 1))
        print(f"[pinned_bench] {name}: {json.dumps(runs[name])}", flush=True)
        free(tensors, keep)
    torch_s = min(r["seconds"] for k, r in runs.items() if k.startswith("torch_pin_memory"))
    ours = runs["arena"]
    copy_s = sum(sizes) / 1e9 / ours["d2h_gb_per_s"]
    metrics = dict(first_pin_s_torch=torch_s, first_pin_s_arena=ours["seconds"],
                   first_pin_s_arena_4k=runs["arena_4k"]["seconds"],
                   first_pin_s_per_storage=runs["pinned_per_storage"]["seconds"],
                   first_pin_speedup=round(torch_s / ours["seconds"], 2),
                   steady_offload_copy_s=round(copy_s, 3), first_pin_over_copy=round(ours["seconds"] / copy_s, 2),
                   held_gb_torch=runs["torch_pin_memory"]["held_gb"], held_gb_arena=ours["held_gb"],
                   d2h_gb_per_s_pageable=round(d2h_pageable, 1), h2d_gb_per_s_pageable=round(h2d_pageable, 1))
    print("[pinned_bench] " + json.dumps(metrics), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"command": "python benchmarks/pinned_bench.py " + " ".join(sys.argv[1:]),
                       "device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                       "metrics": metrics, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
