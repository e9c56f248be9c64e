"""ReMax (Li et al. 2023): baseline = reward of the greedy response to the same prompt.

Returns are the reverse cumulative sums of the masked token rewards (reward-to-go);
advantages = returns - reward_baseline on response tokens (no whitening).
"""

from __future__ import annotations

from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams, needs


@ADVANTAGE_ESTIMATORS.register("remax")
@needs("reward_baselines")
def remax(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages, returns: [B, T]. Needs `reward_baselines` [B]."""
    baselines = inputs.require("reward_baselines", "remax")
    mask = inputs.response_mask.to(inputs.token_level_rewards.dtype)
    returns = (inputs.token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - baselines.to(returns.dtype).unsqueeze(-1) * mask
    return AdvantageOutput(advantages, returns)
