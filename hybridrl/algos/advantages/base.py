"""The advantage-estimator contract: typed inputs, parameters, output and the registry.

Every estimator is `fn(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput`
and is registered under verl's `algorithm.adv_estimator` name. A user estimator:

    @ADVANTAGE_ESTIMATORS.register("my_estimator")
    @needs("index")            # optional: the AdvantageInputs fields it reads beyond rewards and mask
    def my_estimator(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput: ...

`needs` is how the trainer knows what to compute before advantages: `sum_pi_squared` makes the actor's
log-prob pass return it, `index` needs rollout.n >= 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, TypeVar

import numpy as np
import torch

from ...utils.registry import Registry


@dataclass(frozen=True)
class AdvantageParams:
    """algorithm.* knobs the estimators read."""

    gamma: float = 1.0
    """Discount factor (gae, reinforce_plus_plus)."""
    lam: float = 1.0
    """GAE lambda."""
    norm_adv_by_std_in_grpo: bool = True
    """grpo: divide by the group std; False is Dr.GRPO (mean-centering only)."""
    epsilon: float = 1e-6
    """Added to the group std before dividing (grpo and its kin)."""
    gdpo_reward_keys: tuple[str, ...] = ()
    """gdpo: the reward components (keys of the reward function's dict) normalized one by one."""
    gdpo_reward_weights: Optional[tuple[float, ...]] = None
    """gdpo: one weight per key (None: all 1)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"algorithm.gamma must be in [0, 1], got {self.gamma}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"algorithm.lam must be in [0, 1], got {self.lam}")
        if self.epsilon < 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")
        weights = self.gdpo_reward_weights
        if weights is not None and len(weights) != len(self.gdpo_reward_keys):
            raise ValueError(f"algorithm.gdpo_reward_weights has {len(weights)} values for "
                             f"{len(self.gdpo_reward_keys)} algorithm.gdpo_reward_keys; give one weight per key")


@dataclass(frozen=True)
class AdvantageInputs:
    """One batch of B responses padded to T tokens (right padding: mask is 1 then 0)."""

    token_level_rewards: torch.Tensor
    """[B, T] rewards per response token (outcome reward usually on the last token)."""
    response_mask: torch.Tensor
    """[B, T] 1 on response tokens, 0 on padding."""
    values: Optional[torch.Tensor] = None
    """[B, T] critic values (gae)."""
    index: Optional[Any] = None
    """Length-B group ids (np.ndarray of any hashable, e.g. prompt uids): grpo, rloo, rf++ baseline."""
    reward_baselines: Optional[torch.Tensor] = None
    """[B] reward of the greedy response (remax)."""
    old_log_probs: Optional[torch.Tensor] = None
    """[B, T] the actor's log-probs of the sampled tokens before the update (optimal token baseline)."""
    sum_pi_squared: Optional[torch.Tensor] = None
    """[B, T] sum over the vocabulary of the actor's squared probabilities (optimal token baseline)."""
    rollout_is_weights: Optional[torch.Tensor] = None
    """[B, T] rollout-correction importance weights, when rollout correction computes them."""
    reward_components: Optional[dict[str, torch.Tensor]] = None
    """{name: [B] score} of the reward function's separate components (gdpo)."""

    def __post_init__(self) -> None:
        rewards, mask = self.token_level_rewards, self.response_mask
        if rewards.dim() != 2 or rewards.shape != mask.shape:
            raise ValueError(
                f"token_level_rewards and response_mask must both be [B, T], got "
                f"{tuple(rewards.shape)} and {tuple(mask.shape)}"
            )
        for name in ("values", "old_log_probs", "sum_pi_squared", "rollout_is_weights"):
            value = getattr(self, name)
            if value is not None and value.shape != rewards.shape:
                raise ValueError(f"{name} must be [B, T]={tuple(rewards.shape)}, got {tuple(value.shape)}")
        for key, comp in (self.reward_components or {}).items():
            if comp.shape != rewards.shape[:1]:
                raise ValueError(f"reward component {key!r} must be [B]=({rewards.shape[0]},), got {tuple(comp.shape)}")
        if self.index is not None and len(self.index) != rewards.shape[0]:
            raise ValueError(f"index must have one group id per row (B={rewards.shape[0]}), got {len(self.index)}")
        if self.reward_baselines is not None and self.reward_baselines.shape != rewards.shape[:1]:
            raise ValueError(
                f"reward_baselines must be [B]=({rewards.shape[0]},), got {tuple(self.reward_baselines.shape)}"
            )

    def require(self, field_name: str, estimator: str) -> Any:
        """The named optional field, or ValueError saying which estimator needs it."""
        value = getattr(self, field_name)
        if value is None:
            raise ValueError(f"adv_estimator={estimator!r} needs AdvantageInputs.{field_name}")
        return value


class AdvantageOutput(NamedTuple):
    advantages: torch.Tensor  # [B, T]
    returns: torch.Tensor  # [B, T]


AdvantageFn = Callable[[AdvantageInputs, AdvantageParams], AdvantageOutput]
ADVANTAGE_ESTIMATORS = Registry("advantage estimator", key="algorithm.adv_estimator")  # of AdvantageFn
F = TypeVar("F")


def needs(*fields: str) -> Callable[[F], F]:
    """Declare the optional AdvantageInputs fields an estimator reads (see `estimator_needs`)."""
    known = {f for f in AdvantageInputs.__dataclass_fields__ if f not in ("token_level_rewards", "response_mask")}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"needs(): {sorted(unknown)} are not AdvantageInputs fields ({sorted(known)})")

    def mark(fn: F) -> F:
        fn.needs = frozenset(fields)  # type: ignore[attr-defined]
        return fn

    return mark


def estimator_needs(name: str) -> frozenset[str]:
    """The inputs the estimator registered as `name` declared with `needs` (empty if it declared none)."""
    return getattr(ADVANTAGE_ESTIMATORS.get(name), "needs", frozenset())


def compute_advantage(name: str, inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """Run the estimator registered as `name` (no autograd graph is kept)."""
    estimator = ADVANTAGE_ESTIMATORS.get(name)
    with torch.no_grad():
        return estimator(inputs, params)


class Groups(NamedTuple):
    """Per-row view of the groups in `index` (rows keep their batch order)."""

    group_of_row: torch.Tensor  # [B] int64, dense group number of each row
    size: torch.Tensor  # [B] int64, size of the row's group
    mean: torch.Tensor  # [B] float64, mean score of the row's group
    std: torch.Tensor  # [B] float64, unbiased std of the row's group (0 for a group of one)


def group_stats(scores: torch.Tensor, index: Any) -> Groups:
    """Group statistics of `scores` [B] by the group ids in `index` (length B, any hashable).

    Stats are float64 (callers cast their final result back to the input dtype).
    """
    dense: dict[Any, int] = {}
    ids = [dense.setdefault(_hashable(key), len(dense)) for key in index]
    group_of_row = torch.tensor(ids, dtype=torch.int64, device=scores.device)
    num_groups = len(dense)
    x = scores.detach().to(torch.float64)
    count = torch.bincount(group_of_row, minlength=num_groups)  # [G]
    total = torch.zeros(num_groups, dtype=torch.float64, device=x.device).index_add_(0, group_of_row, x)
    mean = total / count
    centered_sq = (x - mean[group_of_row]) ** 2
    sq = torch.zeros(num_groups, dtype=torch.float64, device=x.device).index_add_(0, group_of_row, centered_sq)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return Groups(
        group_of_row=group_of_row,
        size=count[group_of_row],
        mean=mean[group_of_row],
        std=std[group_of_row],
    )


def _hashable(key: Any) -> Any:
    return key.item() if isinstance(key, (np.generic, torch.Tensor)) else key
