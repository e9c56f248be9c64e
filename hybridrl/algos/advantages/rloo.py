"""RLOO (Ahmadian et al. 2024): baseline = mean score of the *other* responses of the group.

A_i = s_i - mean_{j != i} s_j = n/(n-1) * (s_i - mean_group) for a group of n > 1, broadcast over the
row's tokens; returns = advantages. The two verl names differ on a group of one, and both are kept:
- rloo:             no baseline, A_i = s_i
- rloo_vectorized:  A_i = 0 (verl multiplies by [n > 1])
"""

from __future__ import annotations

import torch

from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams, group_stats, needs


def _leave_one_out(inputs: AdvantageInputs, name: str, singleton_keeps_score: bool) -> AdvantageOutput:
    index = inputs.require("index", name)
    rewards = inputs.token_level_rewards
    scores = rewards.sum(dim=-1).double()  # [B]
    g = group_stats(scores, index)
    n = g.size.double()
    loo = n / (n - 1).clamp(min=1) * (scores - g.mean)
    single = scores if singleton_keeps_score else torch.zeros_like(scores)
    adv = torch.where(g.size == 1, single, loo)
    adv = adv.to(rewards.dtype).unsqueeze(-1) * inputs.response_mask
    return AdvantageOutput(adv, adv)


@ADVANTAGE_ESTIMATORS.register("rloo")
@needs("index")
def rloo(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages = returns: [B, T], zero off the mask; a group of one keeps its score. Needs `index`."""
    return _leave_one_out(inputs, "rloo", singleton_keeps_score=True)


@ADVANTAGE_ESTIMATORS.register("rloo_vectorized")
@needs("index")
def rloo_vectorized(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages = returns: [B, T], zero off the mask; a group of one gets 0. Needs `index`."""
    return _leave_one_out(inputs, "rloo_vectorized", singleton_keeps_score=False)
