"""GRPO for pass@k (Chen et al. 2025, arXiv 2503.19595): only a group's best response learns.

Within each group (same `index`, at least 2 responses): the row with the highest score gets
r_max - r_second (divided by the group's unbiased std + epsilon with norm_adv_by_std_in_grpo), every
other row 0. Ties at the top give 0 to all. Broadcast over the response tokens; returns = advantages.
"""

from __future__ import annotations

import torch

from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams, group_stats, needs


@ADVANTAGE_ESTIMATORS.register("grpo_passk")
@needs("index")
def grpo_passk(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages = returns: [B, T], zero off the mask. Needs `index`; a group of one is an error."""
    index = inputs.require("index", "grpo_passk")
    rewards = inputs.token_level_rewards
    scores = rewards.sum(dim=-1).double()  # [B]
    g = group_stats(scores, index)
    adv = torch.zeros_like(scores)
    for group in range(int(g.group_of_row.max()) + 1 if len(scores) else 0):
        rows = torch.nonzero(g.group_of_row == group).flatten()
        if len(rows) < 2:
            raise ValueError(f"adv_estimator=grpo_passk needs at least 2 responses per prompt; group {index[int(rows[0])]!r} "
                             "has 1 (set actor_rollout_ref.rollout.n >= 2)")
        top, at = torch.topk(scores[rows], 2)
        gap = top[0] - top[1]
        if params.norm_adv_by_std_in_grpo:
            gap = gap / (g.std[rows[0]] + params.epsilon)
        adv[rows[at[0]]] = gap
    adv = adv.to(rewards.dtype).unsqueeze(-1) * inputs.response_mask
    return AdvantageOutput(adv, adv)
