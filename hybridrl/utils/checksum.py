"""Checksums of weights, computed the same way on both ends of a sync (the sender's export and the engine's copy):
every rollout engine reports them and hybridrl.hybrid.checks compares them, so they live below both.

bf16/fp16 tensors are summed in float32 blocks of BLOCK values and the blocks' sums in float64. On a GPU a float64
sum of a bf16 tensor first writes the whole tensor out as float64 (torch reduces half types into float32 without a
copy, into float64 only after one): 4x the weight's bytes of temporaries per checksum, which made the check of a
synced 14B model cost more than the copy itself (four_gpu.md, lease 3). A block's float32 sum of 256 values with
8-bit mantissas loses at most the low bits of its smallest members, far below the 1e-6 rtol of engines that sum
in another order, and a one-ulp change of any member still moves it.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

BLOCK = 256
CHUNK = 1 << 26  # elements whose magnitudes are taken at once (tensor_abs_sum's temporary, 128 MiB of bf16)
_HALF = (torch.bfloat16, torch.float16)
ALIGN = 16  # bytes: the widest vector load of the reduction kernels


def tensor_checksum(t: torch.Tensor) -> torch.Tensor:
    """0-dim float64 sum (a tensor, so a GPU caller can batch the host syncs; `float()` it to read)."""
    # contiguous: the same values in the same memory order reduce in the same order on both sides.
    t = t.detach().contiguous()
    if t.dtype not in _HALF:
        return torch.sum(t, dtype=torch.float64)
    return _blocked_sum(_aligned(t).view(-1))


def tensor_abs_sum(t: torch.Tensor) -> torch.Tensor:
    """0-dim float64 sum of magnitudes: the scale of the checksum's rounding error."""
    t = t.detach().contiguous()
    if t.dtype not in _HALF:
        return torch.sum(t.abs(), dtype=torch.float64)
    flat = t.view(-1)
    total = torch.zeros((), dtype=torch.float64, device=t.device)
    for chunk in flat.split(CHUNK):
        total = total + _blocked_sum(chunk.abs())
    return total


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t, or a copy of it in a fresh allocation: a GPU reduction's vectorized order follows the first element's
    alignment, and the float32 blocks round, so two equal tensors sum bitwise alike only from equally aligned
    starts (a narrowed source and the engine's view of it need not be)."""
    return t if t.data_ptr() % ALIGN == 0 else t.clone()


def _blocked_sum(flat: torch.Tensor) -> torch.Tensor:
    whole = flat.numel() - flat.numel() % BLOCK
    total = torch.sum(torch.sum(flat[:whole].view(-1, BLOCK), dim=1, dtype=torch.float32), dtype=torch.float64)
    if whole < flat.numel():
        total = total + torch.sum(flat[whole:], dtype=torch.float64)
    return total


@torch.no_grad()
def checksums(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """[n] float64 sums and [n] float64 sums of magnitudes of `tensors` (one device), in a few kernels however many
    there are: tensors of one dtype and shape are stacked (CHUNK elements at a time) and each row reduced as
    tensor_checksum / tensor_abs_sum reduce one tensor (float32 blocks of BLOCK values for half types). The same
    values up to the order of the float64 additions, so for sides that compare within a tolerance (an engine with
    checksum_rtol > 0), not with tensor_checksum bitwise. One sync's 392 adapter tensors of a 7B model cost 392
    launches of each op per tensor (about 7 each) the other way."""
    if not tensors:
        empty = torch.zeros(0, dtype=torch.float64)
        return empty, empty
    groups: dict[tuple[torch.dtype, torch.Size], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.shape), []).append(i)
    order: list[int] = []
    sums: list[torch.Tensor] = []
    abss: list[torch.Tensor] = []
    for (_, shape), index in groups.items():
        per = max(1, CHUNK // max(math.prod(shape), 1))
        for lo in range(0, len(index), per):
            part = index[lo:lo + per]
            rows = torch.stack([tensors[i] for i in part]).view(len(part), math.prod(shape))  # [G, numel] (no_grad)
            sums.append(_row_sums(rows))
            abss.append(_row_sums(rows.abs()))
            order += part
    where = torch.tensor(order, device=tensors[0].device)
    out_sums = torch.empty(len(order), dtype=torch.float64, device=where.device)
    out_abs = torch.empty_like(out_sums)
    out_sums[where] = torch.cat(sums)
    out_abs[where] = torch.cat(abss)
    return out_sums, out_abs


def _row_sums(rows: torch.Tensor) -> torch.Tensor:
    """[G] float64 sums of the rows of `rows` [G, N]: tensor_checksum's reduction, a row at a time."""
    if rows.dtype not in _HALF:
        return torch.sum(rows, dim=1, dtype=torch.float64)
    n = rows.shape[1]
    whole = n - n % BLOCK
    total = torch.sum(torch.sum(rows[:, :whole].reshape(rows.shape[0], -1, BLOCK), dim=2, dtype=torch.float32),
                      dim=1, dtype=torch.float64)
    if whole < n:
        total = total + torch.sum(rows[:, whole:], dim=1, dtype=torch.float64)
    return total
