"""GRPO (Shao et al. 2024) outcome advantage, and Dr.GRPO with `norm_adv_by_std_in_grpo=False`.

Score s_i = sum of row i's token rewards. Within each group (same `index`):
A_i = (s_i - mean) / (std + epsilon), std unbiased (torch.std); Dr.GRPO: A_i = s_i - mean.
A group of one uses mean 0 and std 1 (its advantage is its score / (1 + epsilon)), as verl does.
A_i is broadcast over the row's response tokens; returns = advantages.
"""

from __future__ import annotations

from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams, group_stats


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages = returns: [B, T], zero off the mask. Needs `index`."""
    index = inputs.require("index", "grpo")
    rewards = inputs.token_level_rewards
    scores = rewards.sum(dim=-1)  # [B]
    g = group_stats(scores, index)
    single = g.size == 1
    mean = g.mean.masked_fill(single, 0.0)
    centered = scores.double() - mean
    if params.norm_adv_by_std_in_grpo:
        centered = centered / (g.std.masked_fill(single, 1.0) + params.epsilon)
    adv = centered.to(rewards.dtype).unsqueeze(-1) * inputs.response_mask
    return AdvantageOutput(adv, adv)
