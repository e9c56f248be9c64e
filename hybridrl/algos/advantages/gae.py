"""GAE (Schulman et al. 2016) over response tokens, masked like verl's current `gae`.

Backward in time over t = T-1..0 with delta_t = r_t + gamma * V_next - V_t and
A_t = delta_t + gamma * lam * A_next. At a masked-out position the carried V_next and A_next pass
through unchanged, so tokens that are not the policy's (padding, tool output in multi-turn) are
skipped: the next *response* token's value and advantage are used. Returns = A + V (before
whitening); the advantages are then whitened over the mask. Masked-out positions of both outputs
are not zeroed (as in verl); the losses mask them.
"""

from __future__ import annotations

import torch

from ..torch_functional import masked_whiten
from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams, needs


@ADVANTAGE_ESTIMATORS.register("gae")
@needs("values")
def gae(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages, returns: [B, T]. Needs `values`."""
    values = inputs.require("values", "gae")
    rewards, mask = inputs.token_level_rewards, inputs.response_mask.to(inputs.token_level_rewards.dtype)
    next_value = torch.zeros_like(rewards[:, 0])  # [B]
    next_adv = torch.zeros_like(rewards[:, 0])  # [B]
    advantages = torch.empty_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + params.gamma * next_value - values[:, t]
        adv_t = delta + params.gamma * params.lam * next_adv
        m = mask[:, t]
        next_value = m * values[:, t] + (1 - m) * next_value
        next_adv = m * adv_t + (1 - m) * next_adv
        advantages[:, t] = next_adv
    returns = advantages + values
    return AdvantageOutput(masked_whiten(advantages, inputs.response_mask), returns)
