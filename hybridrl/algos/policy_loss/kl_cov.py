"""KL-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"): a KL penalty on the
tokens whose advantage and log-prob covary the most.

Per token the loss is -A r with r = exp(log_prob - old_log_prob) (no clipping, no clamp, as verl);
cov_t = (A_t - mean A) * (log_prob_t - mean log_prob) over the batch's valid tokens (detached); on the
max(1, int(kl_cov_ratio * valid tokens)) tokens with the largest cov the loss is
-A r + ppo_kl_coef * |log_prob - old_log_prob|. Keys: actor.policy_loss.kl_cov_ratio, ppo_kl_coef.
Metric: actor/ppo_kl, which here is the token mean of |log_prob - old_log_prob| (as verl reports it).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..torch_functional import masked_mean
from .base import POLICY_LOSSES, PolicyLossOutput, PolicyLossParams, aggregate, declare_metrics


@POLICY_LOSSES.register("kl_cov")
@declare_metrics(("actor/ppo_kl",))
def kl_cov(
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
    opts = params.policy_loss
    if opts.kl_cov_ratio <= 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.kl_cov_ratio must be > 0, got {opts.kl_cov_ratio}")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    valid = response_mask > 0
    with torch.no_grad():
        penalized = torch.zeros_like(valid)
        adv, lp = advantages[valid].detach(), log_prob[valid].detach()
        if len(adv):
            cov = (adv - adv.mean()) * (lp - lp.mean())
            top = torch.topk(cov, max(1, int(len(cov) * opts.kl_cov_ratio))).indices
            flat = torch.nonzero(valid.reshape(-1)).flatten()[top]
            penalized.view(-1)[flat] = True
    pg_losses = -advantages * ratio + penalized * (opts.ppo_kl_coef * log_ratio.abs())
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return PolicyLossOutput(aggregate(pg_losses, response_mask, loss_agg_mode, params),
                            {"actor/ppo_kl": masked_mean(log_ratio.abs(), response_mask).detach()})
