"""SAPO (arXiv 2511.20347): a smooth, temperature-controlled gate instead of PPO's hard clip.

Per token r = exp(clamp(log_prob - old_log_prob, -20, 20)), tau = tau_pos where A > 0 else tau_neg
(actor.tau_pos / actor.tau_neg), gate f(r) = sigmoid(tau (r - 1)) * 4 / tau, loss = -f(r) * A (times
rollout_is_weights). f(1) = 2/tau and f'(1) = 1, so near r = 1 the gradient is PPO's, and it fades
smoothly as r leaves 1 (faster for larger tau). Aggregated with seq-mean-token-mean whatever
loss_agg_mode says, as verl 0.9 does. pg_clipfrac and pg_clipfrac_lower are 0 (nothing is clipped).
"""

from __future__ import annotations

from typing import Optional

import torch

from .base import POLICY_LOSSES, PolicyLossOutput, PolicyLossParams, aggregate, ppo_kl

SAPO_AGG_MODE = "seq-mean-token-mean"


@POLICY_LOSSES.register("sapo")
def sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = SAPO_AGG_MODE,
    config: Optional[PolicyLossParams] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> PolicyLossOutput:
    """All inputs [B, T]; gradient flows through `log_prob` only."""
    params = config or PolicyLossParams()
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.as_tensor(params.tau_pos, dtype=advantages.dtype, device=advantages.device),
                      torch.as_tensor(params.tau_neg, dtype=advantages.dtype, device=advantages.device))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = -gate * advantages
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    return PolicyLossOutput(aggregate(pg_losses, response_mask, SAPO_AGG_MODE, params), {
        "actor/pg_clipfrac": zero, "actor/ppo_kl": ppo_kl(log_ratio, response_mask), "actor/pg_clipfrac_lower": zero,
    })
