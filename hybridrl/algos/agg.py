"""Loss aggregation: a per-token loss matrix [B, T] and its mask -> one scalar (verl's loss_agg_mode).

Modes (B = rows of the micro-batch, n_i = set mask entries of row i, T = loss_mask.shape[-1]):
- token-mean:              sum_{i,t} l / sum_{i,t} m            (every token weighs the same)
- seq-mean-token-sum:      (1/B) sum_i sum_t l_{i,t}
- seq-mean-token-mean:     (1/B) sum_i (sum_t l_{i,t}) / n_i    (every sequence weighs the same)
- seq-mean-token-sum-norm: sum_{i,t} l / H,  H = loss_scale_factor or T (Dr.GRPO: a constant
                           horizon instead of a length-dependent normalizer)

All sums are over masked positions only. A fully masked row counts in B and contributes 0.
Users add modes with `@LOSS_AGG_MODES.register("name")` on `fn(loss_mat, loss_mask, loss_scale_factor)`.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..utils.registry import Registry
from .torch_functional import MASK_EPS, masked_mean, masked_sum

AggFn = Callable[[torch.Tensor, torch.Tensor, Optional[float]], torch.Tensor]
LOSS_AGG_MODES = Registry("loss aggregation mode", key="actor_rollout_ref.actor.loss_agg_mode")  # of AggFn


@LOSS_AGG_MODES.register("token-mean")
def _token_mean(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_scale_factor: Optional[float]) -> torch.Tensor:
    return masked_mean(loss_mat, loss_mask)


@LOSS_AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_scale_factor: Optional[float]
) -> torch.Tensor:
    return masked_sum(loss_mat, loss_mask, axis=-1).mean()


@LOSS_AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_scale_factor: Optional[float]
) -> torch.Tensor:
    tokens = loss_mask.to(loss_mat.dtype).sum(dim=-1)  # [B]
    return (masked_sum(loss_mat, loss_mask, axis=-1) / (tokens + MASK_EPS)).mean()


@LOSS_AGG_MODES.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_scale_factor: Optional[float]
) -> torch.Tensor:
    horizon = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    return masked_sum(loss_mat, loss_mask) / horizon


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    loss_scale_factor: Optional[float] = None,
) -> torch.Tensor:
    """Aggregate `loss_mat` [B, T] over `loss_mask` [B, T] with the named mode -> scalar tensor.

    `loss_scale_factor` is the constant horizon of seq-mean-token-sum-norm (default T); set it to
    a fixed value (e.g. the max response length) to keep the scale constant across batches.
    """
    if loss_mat.dim() != 2 or loss_mat.shape != loss_mask.shape:
        raise ValueError(
            f"agg_loss expects loss_mat and loss_mask of the same [B, T] shape, got "
            f"{tuple(loss_mat.shape)} and {tuple(loss_mask.shape)}"
        )
    if loss_scale_factor is not None and loss_scale_factor <= 0:
        raise ValueError(f"loss_scale_factor must be > 0, got {loss_scale_factor}")
    return LOSS_AGG_MODES.get(loss_agg_mode)(loss_mat, loss_mask, loss_scale_factor)
