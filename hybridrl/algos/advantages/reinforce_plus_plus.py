"""REINFORCE++ (Hu 2025): discounted token returns, whitened over the batch.

Backward over t = T-1..0: G = r_t + gamma * G_carry. On a response token (mask 1) the return is G
and the carry becomes G; on a masked-out token (padding, or a tool's observation inside a
multi-turn response) the stored return is 0 and the carry passes through unchanged, so rewards
reach the policy's tokens before an observation span (verl 0.9). Returns are stored times the mask;
advantages are the returns whitened over all response tokens of the batch, zeroed off the mask.
"""

from __future__ import annotations

import torch

from ..torch_functional import masked_whiten
from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus")
def reinforce_plus_plus(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages [B, T] (whitened, masked), returns [B, T] (not whitened, masked)."""
    rewards = inputs.token_level_rewards
    mask = inputs.response_mask.to(rewards.dtype)
    returns = torch.empty_like(rewards)
    carry = torch.zeros_like(rewards[:, 0])  # [B]
    for t in reversed(range(rewards.shape[1])):
        g = rewards[:, t] + params.gamma * carry
        m = mask[:, t]
        returns[:, t] = g * m
        carry = g * m + carry * (1 - m)
    advantages = masked_whiten(returns, inputs.response_mask) * mask
    return AdvantageOutput(advantages, returns)
