"""DAPO's overlong reward shaping (reward_model.overlong_buffer) and verl's `dapo` reward manager.

A response of L tokens with max_response_length M and buffer length B gets
    penalty = min(-(L - (M - B)) / B * penalty_factor, 0)
added to its score: 0 up to M - B tokens, then linearly down to -penalty_factor at M. A soft version of
truncation's hard 0 reward that tells the policy *how* far over it went. L counts the response tokens in
response_mask (verl: the response part of the attention mask; the same for rollouts).
"""
from __future__ import annotations

from typing import Any

import torch

from hybridrl.protocol import DataProto

from .managers import (
    NaiveRewardManager,
    RewardManager,
    RewardOutput,
    last_valid_positions,
    register_reward_manager,
    response_mask_of,
)


def overlong_penalty(lengths: torch.Tensor, max_response_length: int, buffer_len: int,
                     penalty_factor: float) -> torch.Tensor:
    """[B] penalties (<= 0) of response lengths [B]."""
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(f"reward_model.overlong_buffer.len={buffer_len} must be in (0, data.max_response_length="
                         f"{max_response_length}]")
    exceed = lengths.to(torch.float64) - (max_response_length - buffer_len)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


class OverlongBuffer(RewardManager):
    """Wraps a reward manager: adds the overlong penalty to each row's score (at its last response token)."""

    def __init__(self, inner: RewardManager, max_response_length: int, buffer_len: int, penalty_factor: float,
                 log: bool = False) -> None:
        self.inner, self.max_len, self.buffer_len = inner, max_response_length, buffer_len
        self.penalty_factor, self.log = penalty_factor, log
        overlong_penalty(torch.zeros(1), max_response_length, buffer_len, penalty_factor)  # check the sizes now

    def __getattr__(self, name: str) -> Any:  # tokenizer, reward_fn_key, ... of the wrapped manager
        return getattr(self.inner, name)

    def __call__(self, data: DataProto) -> RewardOutput:
        out = self.inner(data)
        mask = response_mask_of(data)
        penalty = overlong_penalty(mask.sum(-1), self.max_len, self.buffer_len, self.penalty_factor)
        reward = out.reward_tensor.clone()
        rows = torch.arange(len(reward))
        reward[rows, last_valid_positions(mask)] += penalty.to(reward.dtype)
        info = dict(out.reward_extra_info)
        if self.log:
            info["overlong_reward"] = penalty.tolist()
            info["overlong"] = (penalty < 0).tolist()
        return RewardOutput(reward, info)


def with_overlong_buffer(manager: RewardManager, overlong_cfg: Any, max_response_length: int) -> RewardManager:
    """`manager` itself, or wrapped in OverlongBuffer when reward_model.overlong_buffer.enable."""
    if overlong_cfg is None or not overlong_cfg.enable:
        return manager
    return OverlongBuffer(manager, max_response_length, overlong_cfg.len, overlong_cfg.penalty_factor,
                          overlong_cfg.log)


@register_reward_manager("dapo")
class DAPORewardManager(NaiveRewardManager):
    """verl's `dapo` manager: compute_score per sample; a plain number is also reported as `acc` (the
    field DAPO's group filter usually reads). The overlong buffer applies to any manager (OverlongBuffer)."""

    def check_result(self, result, where):
        score, extras = super().check_result(result, where)
        return score, extras if extras is not None else {"acc": score}
