"""KL-in-reward: the coefficient controllers and the reward shaping step (verl's apply_kl_penalty).

The driver calls `apply_kl_penalty` once per step, before advantages: rewards = scores - beta * kl
per response token, then the controller sees the batch's mean KL. The adaptive rule is Ziegler et
al. 2019: beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon.
"""

from __future__ import annotations

from typing import Optional, Protocol

import torch

from .kl import kl_penalty
from .torch_functional import masked_mean


class KLController(Protocol):
    """Holds the current coefficient `value`; `update` is called once per batch."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


class FixedKLController:
    """Constant coefficient."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op."""


class AdaptiveKLController:
    """Moves `value` toward the coefficient that keeps the per-token KL near `target_kl`."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl must be > 0 for the adaptive controller, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """One multiplicative step; the proportional error is clipped to [-0.2, 0.2]."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def build_kl_controller(
    type: str, kl_coef: float, target_kl: Optional[float] = None, horizon: Optional[int] = None
) -> KLController:
    """Controller from algorithm.kl_ctrl.{type, kl_coef, target_kl, horizon}; type is fixed | adaptive."""
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("algorithm.kl_ctrl.type=adaptive needs kl_ctrl.target_kl and kl_ctrl.horizon")
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"Unknown algorithm.kl_ctrl.type {type!r}. Valid choices: adaptive, fixed")


def compute_rewards(
    token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_ratio: float
) -> torch.Tensor:
    """verl's compute_rewards: scores - kl_ratio * (old_log_prob - ref_log_prob) per token (k1, unmasked)."""
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    controller: KLController,
    kind: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Subtract beta * KL from the scores and step the controller.

    Args: token_level_scores, old_log_prob, ref_log_prob, response_mask: [B, T].
    Returns: token_level_rewards [B, T] (scores - beta * kl * mask, beta read before the update),
    metrics {"actor/reward_kl_penalty": batch mean of per-sequence token-mean KL,
             "actor/reward_kl_penalty_coeff": beta used}. The controller is updated with that
    mean KL and n_steps = B.
    """
    kld = kl_penalty(old_log_prob, ref_log_prob, kind)
    kld = torch.where(response_mask.bool(), kld, torch.zeros_like(kld))  # [B, T], 0 off the mask
    beta = controller.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, response_mask, axis=-1).mean().item()
    controller.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
