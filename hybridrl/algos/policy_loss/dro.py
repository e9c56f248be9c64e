"""DRO (Direct Reward Optimization, Richemond et al. 2024): policy gradient with a quadratic
log-ratio penalty instead of a clip.

Per token loss = -(log_prob * A - beta / 2 * (log_prob - old_log_prob)^2) (times rollout_is_weights),
beta = actor.policy_loss.dro_beta (required, > 0). The penalty's gradient beta * (log_prob - old) pulls
the policy back toward the one that sampled the batch. Metric: ppo_kl.
"""

from __future__ import annotations

from typing import Optional

import torch

from .base import POLICY_LOSSES, PolicyLossOutput, PolicyLossParams, aggregate, declare_metrics, ppo_kl


@POLICY_LOSSES.register("dro")
@declare_metrics(("actor/ppo_kl",))
def dro(
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
    beta = params.policy_loss.dro_beta
    if beta is None or beta <= 0:
        raise ValueError(f"policy_loss.loss_mode=dro needs actor_rollout_ref.actor.policy_loss.dro_beta > 0, got {beta}")
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return PolicyLossOutput(aggregate(pg_losses, response_mask, loss_agg_mode, params),
                            {"actor/ppo_kl": ppo_kl(log_ratio, response_mask)})
