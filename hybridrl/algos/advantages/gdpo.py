"""GDPO (arXiv 2601.05242): group reward-decoupled normalization for multi-reward training.

Each reward component k (algorithm.gdpo_reward_keys: fields of the dict the reward function returns)
is GRPO-normalized within each group on its own, A_k = (r_k - mean_g) / (std_g + epsilon) (Dr.GRPO
form with norm_adv_by_std_in_grpo=false; a group of one uses mean 0, std 1), so a large reward cannot
drown a small one. Then A = sum_k w_k A_k (algorithm.gdpo_reward_weights, default 1 each),
broadcast over the response tokens and whitened over all response tokens of the batch, zeroed off the
mask; returns = advantages. As in verl, with component keys the total reward (and anything added to
it, e.g. a KL or overlong penalty) is not used; without keys the total score is the only component.
"""

from __future__ import annotations

from ..torch_functional import masked_whiten
from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams, needs
from .grpo import grpo_scores


@ADVANTAGE_ESTIMATORS.register("gdpo")
@needs("index", "reward_components")
def gdpo(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages = returns: [B, T]. Needs `index` and, with gdpo_reward_keys, `reward_components`."""
    index = inputs.require("index", "gdpo")
    rewards, mask = inputs.token_level_rewards, inputs.response_mask
    if params.gdpo_reward_keys:
        components = inputs.require("reward_components", "gdpo")
        missing = [k for k in params.gdpo_reward_keys if k not in components]
        if missing:
            raise KeyError(f"algorithm.gdpo_reward_keys {missing} are not among the reward components "
                           f"{sorted(components)}: the reward function must return a dict with these keys")
        scores = [components[k] for k in params.gdpo_reward_keys]
    else:
        scores = [rewards.sum(dim=-1)]
    weights = params.gdpo_reward_weights or (1.0,) * len(scores)
    total = sum(w * grpo_scores(s, index, params.norm_adv_by_std_in_grpo, params.epsilon)
                for w, s in zip(weights, scores))
    per_token = total.to(rewards.dtype).unsqueeze(-1) * mask
    adv = masked_whiten(per_token, mask) * mask
    return AdvantageOutput(adv, adv)
