"""DPPO (arXiv 2602.04879): trust region on the sampled token's probability, not on the ratio.

Per token p = exp(log_prob), p_old = exp(old_log_prob), r = exp(clamp(log_prob - old_log_prob, -20, 20)).
A token stays in the update (valid) unless the divergence between the binary distributions (p, 1-p)
and (p_old, 1-p_old) exceeds its bound in the direction the advantage pushes:
- dppo_tv: for A > 0 valid iff p - p_old <= high; otherwise valid iff p - p_old >= -low
- dppo_kl: D = p_old log(p_old/p) + (1-p_old) log((1-p_old+1e-8)/(1-p+1e-8));
           for A > 0 valid iff D <= high or p <= p_old; otherwise valid iff D <= low or p >= p_old
(low/high are actor.clip_ratio_low/high, here divergence bounds). Loss = -A * sg[min(r, clip_ratio_c)]
* log_prob * sg[valid] (times rollout_is_weights): truncated IS replaces PPO's dual clip; the paper
recommends a large clip_ratio_c (e.g. 20; verl's config default, and ours, is 3).
Metrics: pg_clipfrac = fraction of tokens left out, pg_clipfrac_lower = fraction of valid tokens whose
ratio was truncated, ppo_kl.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..torch_functional import masked_mean
from .base import POLICY_LOSSES, PolicyLossOutput, PolicyLossParams, aggregate, ppo_kl


def _binary_kl(p_old: torch.Tensor, p: torch.Tensor, old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    return p_old * (old_log_prob - log_prob) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))


def _dppo(kind: str, old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
          response_mask: torch.Tensor, loss_agg_mode: str, params: PolicyLossParams,
          rollout_is_weights: Optional[torch.Tensor]) -> PolicyLossOutput:
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    truncated = torch.clamp(ratio, max=params.clip_ratio_c).detach()
    p, p_old = torch.exp(log_prob), torch.exp(old_log_prob)
    if kind == "tv":
        up_ok, down_ok = (p - p_old) <= params.high, (p - p_old) >= -params.low
    else:
        d = _binary_kl(p_old, p, old_log_prob, log_prob)
        up_ok, down_ok = (d <= params.high) | (p <= p_old), (d <= params.low) | (p >= p_old)
    valid = torch.where(advantages > 0, up_ok, down_ok).detach().to(log_prob.dtype)
    pg_losses = -advantages * truncated * log_prob * valid
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return PolicyLossOutput(aggregate(pg_losses, response_mask, loss_agg_mode, params), {
        "actor/pg_clipfrac": masked_mean(1.0 - valid, response_mask).detach(),
        "actor/ppo_kl": ppo_kl(log_ratio, response_mask),
        "actor/pg_clipfrac_lower": masked_mean((ratio > params.clip_ratio_c).to(valid.dtype) * valid,
                                               response_mask).detach(),
    })


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[PolicyLossParams] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> PolicyLossOutput:
    """All inputs [B, T]; gradient flows through `log_prob` only (mask and truncated ratio are constants)."""
    return _dppo("tv", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config or PolicyLossParams(),
                 rollout_is_weights)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[PolicyLossParams] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> PolicyLossOutput:
    """All inputs [B, T]; gradient flows through `log_prob` only (mask and truncated ratio are constants)."""
    return _dppo("kl", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config or PolicyLossParams(),
                 rollout_is_weights)
