"""REINFORCE++-baseline (Hu 2025): group-mean baseline, then whitening over the whole batch.

A_i = s_i - mean of its group (a group of one keeps s_i), broadcast over the row's tokens, then
whitened over all response tokens of the batch (so long rows weigh more in the batch statistics)
and zeroed off the mask. Returns = advantages.
"""

from __future__ import annotations

from ..torch_functional import masked_whiten
from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams, group_stats, needs


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline")
@needs("index")
def reinforce_plus_plus_baseline(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages = returns: [B, T]. Needs `index`."""
    index = inputs.require("index", "reinforce_plus_plus_baseline")
    rewards = inputs.token_level_rewards
    mask = inputs.response_mask.to(rewards.dtype)
    scores = rewards.sum(dim=-1)  # [B]
    g = group_stats(scores, index)
    centered = (scores.double() - g.mean.masked_fill(g.size == 1, 0.0)).to(rewards.dtype)
    tokens = centered.unsqueeze(-1) * mask  # [B, T]
    adv = masked_whiten(tokens, inputs.response_mask) * mask
    return AdvantageOutput(adv, adv)
