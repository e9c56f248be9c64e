"""PPO clipped surrogate with clip-higher (DAPO) and dual-clip (Ye et al. 2020): verl's `vanilla`.

Per token, with r = exp(clamp(log_prob - old_log_prob, -20, 20)):
  L1 = -A * r,  L2 = -A * clip(r, 1 - low, 1 + high),  L = max(L1, L2)
  for A < 0 additionally L = min(L, -A * clip_ratio_c)   (bounds the loss of a very large r)
then L *= rollout_is_weights (if given) and L is aggregated over the mask with loss_agg_mode.
Metrics: pg_clipfrac (L2 > L1), ppo_kl, pg_clipfrac_lower (dual-clip active).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..torch_functional import masked_mean
from .base import POLICY_LOSSES, PolicyLossOutput, PolicyLossParams, aggregate, ppo_kl

LOG_RATIO_CLAMP = 20.0


@POLICY_LOSSES.register("vanilla")
def vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[PolicyLossParams] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> PolicyLossOutput:
    """All inputs [B, T]; gradient flows through `log_prob` only."""
    params = config or PolicyLossParams()
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - params.low, 1 + params.high)
    ppo_clip = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * params.clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(ppo_clip, dual_bound), ppo_clip)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    dtype = log_prob.dtype
    return PolicyLossOutput(aggregate(pg_losses, response_mask, loss_agg_mode, params), {
        "actor/pg_clipfrac": masked_mean(torch.gt(clipped, unclipped).to(dtype), response_mask).detach(),
        "actor/ppo_kl": ppo_kl(log_ratio, response_mask),
        "actor/pg_clipfrac_lower": masked_mean((torch.gt(ppo_clip, dual_bound) & negative).to(dtype),
                                               response_mask).detach(),
    })
