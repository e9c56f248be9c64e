"""GPG (Chu et al. 2025): plain policy gradient, no importance ratio and no clipping.

Loss per token -log_prob * A (times rollout_is_weights), aggregated with loss_agg_mode. It is exact
only on-policy (one optimizer step per batch); pair it with adv_estimator=gpg. No metrics.
"""

from __future__ import annotations

from typing import Optional

import torch

from .base import POLICY_LOSSES, PolicyLossOutput, PolicyLossParams, aggregate, declare_metrics


@POLICY_LOSSES.register("gpg")
@declare_metrics(())
def gpg(
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
    pg_losses = -log_prob * advantages
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return PolicyLossOutput(aggregate(pg_losses, response_mask, loss_agg_mode, params), {})
