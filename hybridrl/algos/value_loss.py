"""PPO's clipped value loss for the critic (verl's compute_value_loss)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .agg import agg_loss
from .torch_functional import clip_by_value, masked_mean


class ValueLossOutput(NamedTuple):
    vf_loss: torch.Tensor  # [] scalar, differentiable w.r.t. vpreds
    vf_clipfrac: torch.Tensor  # [] fraction of masked tokens where the clipped term was larger


def value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: Optional[float] = None,
    dp_size: int = 1,
    batch_num_tokens: Optional[float] = None,
    global_batch_size: Optional[float] = None,
) -> ValueLossOutput:
    """0.5 * agg(max((v - R)^2, (clip(v, V_old - c, V_old + c) - R)^2)).

    Args: vpreds (new values), returns, values (old values), response_mask: [B, T];
    cliprange_value: c (critic.cliprange_value); the global-batch arguments mean what they mean in agg_loss.
    """
    vpred_clipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped = (vpreds - returns) ** 2
    clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(unclipped, clipped), response_mask, loss_agg_mode, dp_size,
                             batch_num_tokens, global_batch_size, loss_scale_factor)
    vf_clipfrac = masked_mean(torch.gt(clipped, unclipped).to(vpreds.dtype), response_mask).detach()
    return ValueLossOutput(vf_loss, vf_clipfrac)
