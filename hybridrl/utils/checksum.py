"""Checksums of weights, computed the same way on both ends of a sync (the sender's export and the engine's copy):
every rollout engine reports them and hybridrl.hybrid.checks compares them, so they live below both."""
from __future__ import annotations

import torch


def tensor_checksum(t: torch.Tensor) -> torch.Tensor:
    """0-dim float64 sum (a tensor, so a GPU caller can batch the host syncs; `float()` it to read)."""
    # contiguous: the same values in the same memory order reduce in the same order on both sides.
    return torch.sum(t.detach().contiguous(), dtype=torch.float64)


def tensor_abs_sum(t: torch.Tensor) -> torch.Tensor:
    """0-dim float64 sum of magnitudes: the scale of the checksum's rounding error."""
    return torch.sum(t.detach().contiguous().abs(), dtype=torch.float64)
