"""RLOO (Ahmadian et al. 2024): baseline = mean score of the *other* responses of the group.

A_i = s_i - mean_{j != i} s_j = n/(n-1) * (s_i - mean_group) for a group of n > 1.
A group of one has no baseline: A_i = s_i (as verl). Broadcast over tokens; returns = advantages.
"""

from __future__ import annotations

from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams, group_stats


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages = returns: [B, T], zero off the mask. Needs `index`."""
    index = inputs.require("index", "rloo")
    rewards = inputs.token_level_rewards
    scores = rewards.sum(dim=-1).double()  # [B]
    g = group_stats(scores, index)
    n = g.size.double()
    loo = n / (n - 1).clamp(min=1) * (scores - g.mean)
    adv = scores.where(g.size == 1, loo)
    adv = adv.to(rewards.dtype).unsqueeze(-1) * inputs.response_mask
    return AdvantageOutput(adv, adv)
