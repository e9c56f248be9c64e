"""GMPO (Zhao et al. 2025, arXiv 2507.20673): geometric-mean policy optimization.

Per token d = log_prob - old_log_prob, clipped in the direction of the advantage's sign:
d' = sgn(A) * min(sgn(A) d, sgn(A) clamp(d, -low, high)). Per sequence, with n the response tokens:
ratio_i = exp(sum_t d'_t / (n + 1e-8)) (the geometric mean of the clipped token ratios), A_i = sum_t A_t
/ (n + 1e-8) (sequence-level advantages), loss_i = -A_i * ratio_i, times the geometric mean of the
row's rollout_is_weights if given. loss_agg_mode is not used (as verl): the loss is the sequence mean,
sum_i loss_i * dp_size / global_batch_size, which is verl's torch.mean over rows when no global batch
is given and, with one, keeps the update independent of how the mini-batch is split.
Metrics: pg_clipfrac (d clipped where A > 0), pg_clipfrac_lower (where A < 0), ppo_kl.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..torch_functional import masked_mean
from .base import POLICY_LOSSES, PolicyLossOutput, PolicyLossParams, ppo_kl


@POLICY_LOSSES.register("geo_mean")
def geo_mean(
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
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    bounded = torch.clamp(log_ratio, -params.low, params.high)
    clipped = sign * torch.minimum(sign * log_ratio, sign * bounded)
    n = mask.sum(dim=-1) + 1e-8  # [B]
    ratio = torch.exp((clipped * mask).sum(dim=-1) / n)
    seq_adv = (advantages * mask).sum(dim=-1) / n
    pg_losses = -seq_adv * ratio  # [B]
    if rollout_is_weights is not None:
        pg_losses = pg_losses * torch.exp((torch.log(rollout_is_weights + 1e-10) * mask).sum(dim=-1) / n)
    batch = params.global_batch_info
    if batch.global_batch_size is None and batch.dp_size > 1:
        raise ValueError("policy loss geo_mean with dp_size > 1 needs the global global_batch_size")
    rows = batch.global_batch_size if batch.global_batch_size is not None else len(pg_losses)
    pg_loss = pg_losses.sum() / max(rows, 1) * batch.dp_size
    was_clipped = torch.ne(log_ratio, bounded).to(log_prob.dtype)
    return PolicyLossOutput(pg_loss, {
        "actor/pg_clipfrac": masked_mean(was_clipped * (advantages > 0), response_mask).detach(),
        "actor/ppo_kl": ppo_kl(log_ratio, response_mask),
        "actor/pg_clipfrac_lower": masked_mean(was_clipped * (advantages < 0), response_mask).detach(),
    })
