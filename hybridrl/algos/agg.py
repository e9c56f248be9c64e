"""Loss aggregation: a per-token loss matrix [B, T] and its mask -> one scalar (verl 0.9's agg_loss).

The scalar is a share of a GLOBAL objective when the global-batch arguments are given (verl's
meaning, the one rule for weighting micro-batches in hybridrl):
  dp_size            data-parallel ranks; the result is multiplied by it because an averaging
                     all-reduce of gradients divides by it again (roles whose engine SUMS over dp,
                     as our engine does, divide the loss by dp_size)
  batch_num_tokens   valid tokens of the whole mini-batch on all ranks
  global_batch_size  sequences of the whole mini-batch on all ranks
  loss_scale_factor  seq-mean-token-sum-norm's constant horizon H (default T = loss_mask.shape[-1])
Without them (dp_size 1, None) every divisor is this batch's own count.

Modes (n_i = set mask entries of row i; N = batch_num_tokens or sum_i n_i; G = global_batch_size or
the number of rows with n_i > 0):
- token-mean:              dp * sum_{i,t} l / N                   (every token weighs the same)
- token-sum:               dp * sum_{i,t} l
- seq-mean-token-sum:      dp * sum_i (sum_t l_{i,t}) / G
- seq-mean-token-mean:     dp * sum_{i: n_i>0} (sum_t l_{i,t} / n_i) / G   (every sequence weighs the same)
- seq-mean-token-sum-norm: dp * sum_i (sum_t l_{i,t}) / G / H    (Dr.GRPO: a constant horizon)
Sums are over masked positions only (NaN-safe). Where a divisor is 0 the numerator is 0 too and the
result is 0 (verl returns NaN there).

Users add modes with `@LOSS_AGG_MODES.register("name")` on `fn(loss_mat, loss_mask, batch: GlobalBatch)`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Iterator, Optional

import torch

from ..utils.registry import Registry
from .torch_functional import masked_sum


@dataclass(frozen=True)
class GlobalBatch:
    """verl 0.9's global-batch arguments of agg_loss; `**GlobalBatch(...)` gives them as keywords."""

    dp_size: int = 1
    batch_num_tokens: Optional[float] = None
    global_batch_size: Optional[float] = None
    loss_scale_factor: Optional[float] = None

    def __post_init__(self) -> None:
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {self.dp_size}")
        if self.loss_scale_factor is not None and self.loss_scale_factor <= 0:
            raise ValueError(f"loss_scale_factor must be > 0, got {self.loss_scale_factor}")
        for name in ("batch_num_tokens", "global_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")

    # a Mapping's keys() and [] are what `**` needs: verl losses call agg_loss(..., **config.global_batch_info)
    def keys(self) -> Iterator[str]:
        return iter(f.name for f in fields(self))

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


AggFn = Callable[[torch.Tensor, torch.Tensor, GlobalBatch], torch.Tensor]
LOSS_AGG_MODES = Registry("loss aggregation mode", key="actor_rollout_ref.actor.loss_agg_mode")  # of AggFn


def _divide(total: torch.Tensor, count: Any) -> torch.Tensor:
    count = torch.as_tensor(count, dtype=total.dtype, device=total.device)
    return total / torch.where(count == 0, torch.ones_like(count), count)


def _tokens(loss_mask: torch.Tensor, batch: GlobalBatch, mode: str) -> Any:
    if batch.batch_num_tokens is not None:
        return batch.batch_num_tokens
    if batch.dp_size > 1:
        raise ValueError(f"loss_agg_mode={mode} with dp_size > 1 needs the global batch_num_tokens")
    return loss_mask.sum()


def _rows(nonempty: torch.Tensor, batch: GlobalBatch, mode: str) -> Any:
    if batch.global_batch_size is not None:
        return batch.global_batch_size
    if batch.dp_size > 1:
        raise ValueError(f"loss_agg_mode={mode} with dp_size > 1 needs the global global_batch_size")
    return nonempty.sum()


@LOSS_AGG_MODES.register("token-mean")
def _token_mean(loss_mat: torch.Tensor, loss_mask: torch.Tensor, batch: GlobalBatch) -> torch.Tensor:
    return _divide(masked_sum(loss_mat, loss_mask), _tokens(loss_mask, batch, "token-mean")) * batch.dp_size


@LOSS_AGG_MODES.register("token-sum")
def _token_sum(loss_mat: torch.Tensor, loss_mask: torch.Tensor, batch: GlobalBatch) -> torch.Tensor:
    return masked_sum(loss_mat, loss_mask) * batch.dp_size


def _seq_mean(seq_losses: torch.Tensor, loss_mask: torch.Tensor, batch: GlobalBatch, mode: str) -> torch.Tensor:
    nonempty = (loss_mask != 0).any(dim=-1).to(seq_losses.dtype)  # rows without a valid token do not count
    return _divide(masked_sum(seq_losses, nonempty), _rows(nonempty, batch, mode)) * batch.dp_size


@LOSS_AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat: torch.Tensor, loss_mask: torch.Tensor, batch: GlobalBatch) -> torch.Tensor:
    return _seq_mean(masked_sum(loss_mat, loss_mask, axis=-1), loss_mask, batch, "seq-mean-token-sum")


@LOSS_AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat: torch.Tensor, loss_mask: torch.Tensor, batch: GlobalBatch) -> torch.Tensor:
    tokens = loss_mask.to(loss_mat.dtype).sum(dim=-1)  # [B]
    per_row = _divide(masked_sum(loss_mat, loss_mask, axis=-1), tokens)
    return _seq_mean(per_row, loss_mask, batch, "seq-mean-token-mean")


@LOSS_AGG_MODES.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, loss_mask: torch.Tensor, batch: GlobalBatch) -> torch.Tensor:
    horizon = loss_mask.shape[-1] if batch.loss_scale_factor is None else batch.loss_scale_factor
    seq_mean = _seq_mean(masked_sum(loss_mat, loss_mask, axis=-1), loss_mask, batch, "seq-mean-token-sum-norm")
    return seq_mean / horizon


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: Optional[float] = None,
    global_batch_size: Optional[float] = None,
    loss_scale_factor: Optional[float] = None,
) -> torch.Tensor:
    """Aggregate `loss_mat` [B, T] over `loss_mask` [B, T] with the named mode -> scalar tensor.

    Same arguments and meaning as verl 0.9's agg_loss (see the module docstring).
    """
    if loss_mat.dim() != 2 or loss_mat.shape != loss_mask.shape:
        raise ValueError(
            f"agg_loss expects loss_mat and loss_mask of the same [B, T] shape, got "
            f"{tuple(loss_mat.shape)} and {tuple(loss_mask.shape)}"
        )
    batch = GlobalBatch(dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)
    return LOSS_AGG_MODES.get(loss_agg_mode)(loss_mat, loss_mask, batch)
