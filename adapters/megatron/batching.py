"""Splitting a rank's DataProto into mini-batches and micro-batches (fixed size or token-packed), each
in the padded layout or packed into one THD sequence (forward.pack / forward.pack_thd).

Why counts may be rounded: megatron's interleaved (virtual pipeline) schedule needs at least pp
micro-batches and a multiple of pp, so `multiple` pads the number of micro-batches (rows are spread
evenly; no micro-batch is empty); to train it needs at least 2*pp (`min_count`: with exactly pp it deadlocks,
engine.check_interleaved_count). The update stays exact because the loss of each micro-batch is
weighted by its share of the whole mini-batch (actor.py), not by 1/number-of-micro-batches.
"""
from __future__ import annotations

from typing import Optional

import torch

from hybridrl.protocol import DataProto

from .forward import MicroBatch, pack, pack_thd, split_for_cp


def row_lengths(data: DataProto) -> torch.Tensor:
    return data.batch["attention_mask"].sum(1)


def split_rows(n: int, max_rows: int, multiple: int = 1, min_count: int = 1) -> list[torch.Tensor]:
    """Row indices of ceil(n / max_rows) micro-batches (at least `min_count`, rounded up to `multiple`), sizes
    within one."""
    count = max(-(-n // max(max_rows, 1)), min_count)
    count = -(-count // multiple) * multiple
    _check_fill(n, count, multiple)
    return [part for part in torch.arange(n).tensor_split(count) if len(part)]


def _check_fill(n: int, count: int, multiple: int) -> None:
    if count > n:
        raise ValueError(f"{n} samples cannot fill {count} micro-batches: the virtual pipeline schedule needs a "
                         f"multiple of pipeline_model_parallel_size={multiple} micro-batches (to train, at least "
                         f"{2 * multiple}); give each rank more samples or unset virtual_pipeline_model_parallel_size")


def split_tokens(lengths: torch.Tensor, max_tokens: int, multiple: int = 1, min_count: int = 1) -> list[torch.Tensor]:
    """Rows packed into micro-batches of at most `max_tokens` tokens (sum of lengths), balanced.

    Greedy longest-first into the lightest bin, starting from the fewest bins the budget allows (at least
    `min_count`: the dp ranks agree on one count) and adding bins until every bin fits. A single row
    longer than the budget gets a bin of its own.
    """
    n = len(lengths)
    total = int(lengths.sum())
    count = max(1, min_count, -(-total // max(max_tokens, 1)))
    most = n - n % multiple  # at most one row per bin, and a multiple of `multiple` bins
    if multiple > 1 or min_count > 1:
        _check_fill(n, -(-min_count // multiple) * multiple, multiple)
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    while True:
        count = min(-(-count // multiple) * multiple, most)
        bins: list[list[int]] = [[] for _ in range(count)]
        load = [0] * count
        for i in order:
            b = min(range(count), key=lambda k: (load[k], k))
            bins[b].append(i)
            load[b] += int(lengths[i])
        fits = all(load[b] <= max_tokens or len(bins[b]) == 1 for b in range(count))
        if fits or count >= most:
            break
        count += 1
    return [torch.tensor(sorted(b)) for b in bins if b]


def micro_batches(data: DataProto, keys: list[str], max_rows: Optional[int], max_tokens: Optional[int],
                  multiple: int = 1, seq_multiple: int = 1, thd: bool = False, min_count: int = 1,
                  cp: tuple[int, int] = (0, 1)) -> list[MicroBatch]:
    """MicroBatches of `data` carrying the [B, R] tensors named in `keys` as extras; `thd` packs each into
    one sequence (use_remove_padding), `seq_multiple` rounds its (padded row or packed) length. With
    cp = (rank, size > 1) every sequence is padded to a multiple of 2*size*seq_multiple and this rank
    keeps its share (forward.split_for_cp)."""
    n = len(data)
    if max_tokens is not None:
        groups = split_tokens(row_lengths(data), max_tokens, multiple, min_count)
    else:
        groups = split_rows(n, max_rows or n, multiple, min_count)
    batch = data.batch
    missing = [k for k in ("input_ids", "attention_mask", "responses", *keys) if k not in batch]
    if missing:
        raise KeyError(f"DataProto is missing {missing}; present: {sorted(batch)}")
    cp_rank, cp_size = cp
    align = 2 * cp_size * seq_multiple if cp_size > 1 else 1
    out = []
    for rows in groups:
        extras = {k: batch[k][rows] for k in keys}
        args = (batch["input_ids"][rows], batch["attention_mask"][rows], batch["responses"][rows], rows, extras)
        mb = pack_thd(*args, multiple=max(seq_multiple, align), align=align) if thd else pack(*args, multiple=max(seq_multiple, align))
        out.append(split_for_cp(mb, cp_rank, cp_size))
    return out


def mini_batch_rows(n: int, per_mini: int, epoch_seed: Optional[int]) -> list[torch.Tensor]:
    """Row indices of each mini-batch of one epoch (shuffled when epoch_seed is given)."""
    if n % per_mini:
        raise ValueError(f"this rank holds {n} samples, not a multiple of the per-rank mini-batch {per_mini} "
                         "(ppo_mini_batch_size * rollout.n / dp); the batch given to update_policy does not match the plan")
    order = torch.arange(n)
    if epoch_seed is not None:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch_seed))
    return list(order.split(per_mini))
