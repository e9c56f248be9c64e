"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"): PPO, plus stopping the
gradient of a few tokens whose advantage and log-prob covary strongly (they drive entropy collapse).

Per token, PPO's max(-A r, -A clip(r, 1 - low, 1 + high)) with r = exp(log_prob - old_log_prob) (no
log-ratio clamp, as verl). cov_t = (A_t - mean A) * (log_prob_t - mean log_prob) over the batch's valid
tokens (detached). Among valid tokens that PPO did not clip and with clip_cov_lb < cov < clip_cov_ub,
max(1, int(clip_cov_ratio * valid tokens)) are drawn at random (torch's global generator) and their
loss is multiplied by 0. Keys: actor.policy_loss.clip_cov_ratio/_lb/_ub. Metrics: pg_clipfrac (fraction
of tokens zeroed this way), ppo_kl.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..torch_functional import masked_mean
from .base import POLICY_LOSSES, PolicyLossOutput, PolicyLossParams, aggregate, declare_metrics, ppo_kl


@POLICY_LOSSES.register("clip_cov")
@declare_metrics(("actor/pg_clipfrac", "actor/ppo_kl"))
def clip_cov(
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
    if opts.clip_cov_ratio <= 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.clip_cov_ratio must be > 0, got {opts.clip_cov_ratio}")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - params.low, 1 + params.high)
    valid = response_mask > 0
    with torch.no_grad():
        lp = log_prob.detach()
        cov = (advantages - masked_mean(advantages, response_mask)) * (lp - masked_mean(lp, response_mask))
        candidates = valid & ~(clipped > unclipped) & (cov > opts.clip_cov_lb) & (cov < opts.clip_cov_ub)
        picked = torch.nonzero(candidates)
        count = max(int(opts.clip_cov_ratio * int(valid.sum())), 1)
        picked = picked[torch.randperm(len(picked))[:count].to(picked.device)]
        keep = torch.ones_like(log_prob)
        keep[picked[:, 0], picked[:, 1]] = 0
    pg_losses = torch.maximum(unclipped, clipped) * keep
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return PolicyLossOutput(aggregate(pg_losses, response_mask, loss_agg_mode, params), {
        "actor/pg_clipfrac": masked_mean((keep == 0).to(log_prob.dtype), response_mask),
        "actor/ppo_kl": ppo_kl(log_ratio, response_mask),
    })
