"""OPO (Hao et al. 2025, arXiv 2505.23585): the optimal baseline of an on-policy group is the
length-weighted mean score.

b_g = sum_i |y_i| s_i / sum_i |y_i| over the group's rows (|y_i| = response tokens of row i); a group
of one has no baseline (b = 0), nor has a group whose rows are all empty. A_i = s_i - b_g, broadcast
over the row's response tokens; returns = advantages.
"""

from __future__ import annotations

import torch

from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams, group_stats, needs


@ADVANTAGE_ESTIMATORS.register("opo")
@needs("index")
def opo(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages = returns: [B, T], zero off the mask. Needs `index`."""
    index = inputs.require("index", "opo")
    rewards = inputs.token_level_rewards
    scores = rewards.sum(dim=-1).double()  # [B]
    lengths = inputs.response_mask.double().sum(dim=-1)  # [B]
    g = group_stats(scores, index)
    groups = int(g.group_of_row.max()) + 1 if len(scores) else 0
    weighted = torch.zeros(groups, dtype=torch.float64).index_add_(0, g.group_of_row, lengths * scores)
    total = torch.zeros(groups, dtype=torch.float64).index_add_(0, g.group_of_row, lengths)
    baseline = torch.where(total > 0, weighted / total.clamp(min=1e-300), torch.zeros_like(total))[g.group_of_row]
    baseline = baseline.masked_fill(g.size == 1, 0.0)
    adv = (scores - baseline).to(rewards.dtype).unsqueeze(-1) * inputs.response_mask
    return AdvantageOutput(adv, adv)
