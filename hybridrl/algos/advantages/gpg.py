"""GPG (Chu et al. 2025, Group Policy Gradient): group-mean baseline rescaled by the valid fraction.

alpha = B / (number of rows with a nonzero score, at least 1); A_i = alpha * (s_i - mean of its group)
(a group of one has mean 0). Broadcast over the response tokens; returns = advantages. Pair it with
policy_loss.loss_mode=gpg (no importance ratio), as the paper does.
"""

from __future__ import annotations

from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams, group_stats, needs


@ADVANTAGE_ESTIMATORS.register("gpg")
@needs("index")
def gpg(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages = returns: [B, T], zero off the mask. Needs `index`."""
    index = inputs.require("index", "gpg")
    rewards = inputs.token_level_rewards
    scores = rewards.sum(dim=-1).double()  # [B]
    g = group_stats(scores, index)
    alpha = len(scores) / max(int((scores != 0).sum()), 1)
    adv = alpha * (scores - g.mean.masked_fill(g.size == 1, 0.0))
    adv = adv.to(rewards.dtype).unsqueeze(-1) * inputs.response_mask
    return AdvantageOutput(adv, adv)
