"""Entropy bonus: per-token policy entropy aggregated like the policy loss."""

from __future__ import annotations

from typing import Optional

import torch

from .agg import agg_loss
from .torch_functional import entropy_from_logits


def entropy_loss(
    token_entropy: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: Optional[float] = None,
) -> torch.Tensor:
    """Aggregate per-token entropy [B, T] -> scalar (the actor subtracts entropy_coeff * this).

    Takes entropies rather than logits so backends that compute them vocab-parallel can use it.
    """
    return agg_loss(token_entropy, response_mask, loss_agg_mode, loss_scale_factor)


def entropy_loss_from_logits(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """entropy_loss on entropies computed from full logits [B, T, V]."""
    return entropy_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
