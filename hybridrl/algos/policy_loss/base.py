"""The policy-loss contract: parameters, output, the registry and truncated importance sampling.

Every loss is

    fn(old_log_prob, log_prob, advantages, response_mask, params: PolicyLossParams,
       loss_agg_mode: str = "token-mean", rollout_is_weights: Tensor | None = None) -> PolicyLossOutput

with all tensors [B, T], registered under verl's `actor.policy_loss.loss_mode` name. A user loss:

    @POLICY_LOSSES.register("my_loss")
    def my_loss(old_log_prob, log_prob, advantages, response_mask, params, loss_agg_mode="token-mean",
                rollout_is_weights=None) -> PolicyLossOutput: ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import torch

from ...utils.registry import Registry


@dataclass(frozen=True)
class PolicyLossParams:
    """actor_rollout_ref.actor.* clipping knobs."""

    clip_ratio: float = 0.2
    """PPO epsilon; used for a side whose own bound is None."""
    clip_ratio_low: Optional[float] = None
    """Ratio floor is 1 - clip_ratio_low."""
    clip_ratio_high: Optional[float] = None
    """Ratio ceiling is 1 + clip_ratio_high (clip-higher when > clip_ratio_low)."""
    clip_ratio_c: float = 3.0
    """Dual-clip: for A < 0 the loss is at most -A * clip_ratio_c (must be > 1)."""
    loss_scale_factor: Optional[float] = None
    """Constant horizon for loss_agg_mode=seq-mean-token-sum-norm (default: T)."""

    def __post_init__(self) -> None:
        if self.clip_ratio_c <= 1.0:
            raise ValueError(f"actor.clip_ratio_c (dual-clip bound) must be > 1, got {self.clip_ratio_c}")
        for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"actor.{name} must be >= 0, got {value}")

    @property
    def low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


# verl's recommended GSPO setting (the GSPO paper's sequence-ratio clip range).
GSPO_PARAMS = PolicyLossParams(clip_ratio_low=3e-4, clip_ratio_high=4e-4)


@dataclass(frozen=True)
class PolicyLossOutput:
    """pg_loss carries the gradient; the rest are detached [] metrics."""

    pg_loss: torch.Tensor
    pg_clipfrac: torch.Tensor
    """Fraction of masked tokens where the clipped surrogate was the active (larger) loss."""
    ppo_kl: torch.Tensor
    """Token mean of old_log_prob - log_prob (k1 estimate of KL(old || new))."""
    pg_clipfrac_lower: torch.Tensor
    """Fraction of masked tokens where dual-clip bounded a negative-advantage loss."""

    def metrics(self) -> dict[str, float]:
        """verl's metric names."""
        return {
            "actor/pg_loss": self.pg_loss.detach().item(),
            "actor/pg_clipfrac": self.pg_clipfrac.item(),
            "actor/ppo_kl": self.ppo_kl.item(),
            "actor/pg_clipfrac_lower": self.pg_clipfrac_lower.item(),
        }


class PolicyLossFn(Protocol):
    def __call__(
        self,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        params: PolicyLossParams,
        loss_agg_mode: str = "token-mean",
        rollout_is_weights: Optional[torch.Tensor] = None,
    ) -> PolicyLossOutput: ...


POLICY_LOSSES = Registry("policy loss", key="actor_rollout_ref.actor.policy_loss.loss_mode")  # of PolicyLossFn


def tis_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance-sampling weights min(pi_old / pi_rollout, cap), detached: [B, T].

    Corrects for the rollout engine's probabilities differing from the trainer's (precision,
    kernels); pass the result as `rollout_is_weights`. `cap` is actor.tis_imp_ratio_cap (> 0).
    """
    if cap <= 0:
        raise ValueError(f"actor.tis_imp_ratio_cap must be > 0 to use truncated IS, got {cap}")
    return torch.clamp(torch.exp(old_log_prob - rollout_log_prob), max=cap).detach()
