"""REINFORCE++ (Hu 2025): discounted token returns, whitened over the batch.

G_t = r_t + gamma * G_{t+1}, computed backward; the carry is reset to 0 after each masked-out
position, so a row's returns never include rewards from beyond its response. Advantages are the
returns whitened over all response tokens of the batch, zeroed off the mask.
"""

from __future__ import annotations

import torch

from ..torch_functional import masked_whiten
from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus")
def reinforce_plus_plus(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages [B, T] (whitened, masked), returns [B, T] (not whitened)."""
    rewards = inputs.token_level_rewards
    mask = inputs.response_mask.to(rewards.dtype)
    returns = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[:, 0])  # [B]
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + params.gamma * running
        returns[:, t] = running
        running = running * mask[:, t]  # a masked-out token ends the carry
    advantages = masked_whiten(returns, inputs.response_mask) * mask
    return AdvantageOutput(advantages, returns)
