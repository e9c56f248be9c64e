"""REINFORCE with optional importance weights: verl's compute_policy_loss_reinforce, registered.

Loss per token -A * log_prob, times rollout_is_weights w (detached, e.g. pi_theta / pi_rollout) when
given: the gradient is -w A grad log pi, no ratio and no clip. Default aggregation seq-mean-token-sum,
as verl. verl reaches it only through bypass_mode's loss_type=reinforce; here it is also a loss_mode of
its own, where `old_log_prob` plays verl's rollout_log_prob (it only feeds the ppo_kl metric).
"""

from __future__ import annotations

from typing import Optional

import torch

from .base import POLICY_LOSSES, PolicyLossOutput, PolicyLossParams, aggregate, declare_metrics, ppo_kl


@POLICY_LOSSES.register("reinforce")
@declare_metrics(("actor/ppo_kl",))
def reinforce(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Optional[PolicyLossParams] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> PolicyLossOutput:
    """All inputs [B, T]; gradient flows through `log_prob` only."""
    params = config or PolicyLossParams()
    pg_losses = -advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach()
    return PolicyLossOutput(aggregate(pg_losses, response_mask, loss_agg_mode, params),
                            {"actor/ppo_kl": ppo_kl(log_prob - old_log_prob, response_mask)})
