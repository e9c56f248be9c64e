"""GSPO (Zheng et al. 2025), token form: one importance ratio per sequence, clipped per sequence.

s_i = exp(mean over row i's response tokens of (log_prob - old_log_prob)), the geometric mean of
the token ratios. Each token uses s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)], i.e. in log space
sg[log s_i] + log_prob - sg[log_prob] (clamped at 10): its value is s_i, and the gradient of a
sequence-level advantage through it equals the gradient of the sequence objective A_i * s_i.
Loss per token: max(-A * s, -A * clip(s, 1 - low, 1 + high)), times rollout_is_weights if given,
aggregated with loss_agg_mode as verl 0.9 does (the paper's sequence-level objective is
seq-mean-token-mean, the default when no mode is passed). Use GSPO_PARAMS for verl's clip range.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..torch_functional import masked_mean, masked_sum
from .base import POLICY_LOSSES, PolicyLossOutput, PolicyLossParams, aggregate, ppo_kl

LOG_RATIO_MAX = 10.0


@POLICY_LOSSES.register("gspo")
def gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Optional[PolicyLossParams] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> PolicyLossOutput:
    """All inputs [B, T]; gradient flows through `log_prob` only. pg_clipfrac_lower is always 0."""
    params = config or PolicyLossParams()
    log_ratio = log_prob - old_log_prob  # [B, T]
    lengths = response_mask.to(log_prob.dtype).sum(dim=-1).clamp(min=1)  # [B]
    seq_log_ratio = masked_sum(log_ratio, response_mask, axis=-1) / lengths  # [B]
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=LOG_RATIO_MAX))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - params.low, 1 + params.high)
    pg_losses = torch.maximum(unclipped, clipped)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    dtype = log_prob.dtype
    return PolicyLossOutput(aggregate(pg_losses, response_mask, loss_agg_mode, params), {
        "actor/pg_clipfrac": masked_mean(torch.gt(clipped, unclipped).to(dtype), response_mask).detach(),
        "actor/ppo_kl": ppo_kl(log_ratio, response_mask),
        "actor/pg_clipfrac_lower": torch.zeros((), dtype=dtype, device=log_prob.device),
    })
