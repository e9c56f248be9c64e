"""GRPO (Shao et al. 2024) outcome advantage, and Dr.GRPO with `norm_adv_by_std_in_grpo=False`.

Score s_i = sum of row i's token rewards. Within each group (same `index`):
A_i = (s_i - mean) / (std + epsilon), std unbiased (torch.std); Dr.GRPO: A_i = s_i - mean.
A group of one uses mean 0 and std 1 (its advantage is its score / (1 + epsilon)), as verl does.
A_i is broadcast over the row's response tokens; returns = advantages.

`grpo_vectorized` is verl's scatter-based implementation of the same numbers (its group_mean_std
gives singletons mean 0 / std 1 and floors the variance at 0): here both names run this code.
"""

from __future__ import annotations

import torch

from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams, group_stats, needs


def grpo_scores(scores: torch.Tensor, index, norm_by_std: bool, epsilon: float) -> torch.Tensor:
    """[B] group-normalized scores (float64) of [B] `scores` grouped by `index`."""
    g = group_stats(scores, index)
    single = g.size == 1
    centered = scores.double() - g.mean.masked_fill(single, 0.0)
    if norm_by_std:
        centered = centered / (g.std.masked_fill(single, 1.0) + epsilon)
    return centered


@ADVANTAGE_ESTIMATORS.register("grpo")
@ADVANTAGE_ESTIMATORS.register("grpo_vectorized")
@needs("index")
def grpo(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages = returns: [B, T], zero off the mask. Needs `index`."""
    index = inputs.require("index", "grpo")
    rewards = inputs.token_level_rewards
    adv = grpo_scores(rewards.sum(dim=-1), index, params.norm_adv_by_std_in_grpo, params.epsilon)
    adv = adv.to(rewards.dtype).unsqueeze(-1) * inputs.response_mask
    return AdvantageOutput(adv, adv)
