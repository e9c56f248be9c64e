"""CISPO (MiniMax-M1, arXiv 2506.13585): clip the importance weight, never drop a token's gradient.

Per token r = exp(clamp(log_prob - old_log_prob, -20, 20)), loss = -sg[clip(r, 1 - low, 1 + high)] * A
* log_prob (times rollout_is_weights): the clipped ratio is a constant weight, so every token keeps the
REINFORCE gradient -w A grad log pi, where PPO's clip would zero it. Metrics: pg_clipfrac (r outside the
band), ppo_kl; pg_clipfrac_lower is 0.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..torch_functional import masked_mean
from .base import POLICY_LOSSES, PolicyLossOutput, PolicyLossParams, aggregate, ppo_kl


@POLICY_LOSSES.register("cispo")
def cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[PolicyLossParams] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> PolicyLossOutput:
    """All inputs [B, T]; gradient flows through `log_prob` only (the weight is detached)."""
    params = config or PolicyLossParams()
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - params.low, 1 + params.high)
    pg_losses = -clipped.detach() * advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    dtype = log_prob.dtype
    return PolicyLossOutput(aggregate(pg_losses, response_mask, loss_agg_mode, params), {
        "actor/pg_clipfrac": masked_mean((ratio != clipped).to(dtype), response_mask).detach(),
        "actor/ppo_kl": ppo_kl(log_ratio, response_mask),
        "actor/pg_clipfrac_lower": torch.zeros((), dtype=dtype, device=log_prob.device),
    })
