"""The policy-loss contract, verl 0.9's: parameters, output, the registry.

Every loss is called with keywords, exactly as verl 0.9 calls its policy losses,

    fn(old_log_prob=, log_prob=, advantages=, response_mask=, loss_agg_mode=, config=, rollout_is_weights=)

with all tensors [B, T] and `config` a PolicyLossParams, which carries verl's ActorConfig names
(clip_ratio, clip_ratio_low/high/c, tau_pos, tau_neg, loss_agg_mode, loss_scale_factor,
policy_loss.{clip_cov_ratio, ..., dro_beta, rollout_correction}, global_batch_info and .get()). A
loss returns PolicyLossOutput, or verl's (pg_loss, {metric: value}) tuple. So a loss written for verl
0.9 runs unchanged once its imports point here:

    from hybridrl.algos import agg_loss, register_policy_loss

    @register_policy_loss("my_loss")
    def my_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                rollout_is_weights=None):
        ...
        return agg_loss(loss_mat=..., loss_mask=response_mask, loss_agg_mode=loss_agg_mode,
                        **config.global_batch_info), {"actor/ppo_kl": ...}

`global_batch_info` holds verl's dp_size / batch_num_tokens / global_batch_size / loss_scale_factor of
the current mini-batch (agg.py says what they mean), so the returned pg_loss is this micro-batch's share
of the global objective. Metrics are micro-batch means; the actor reports the names a loss declares with
@declare_metrics (default: actor/pg_clipfrac, actor/ppo_kl, actor/pg_clipfrac_lower).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Optional, Protocol, TypeVar, Union

import torch

from ...utils.registry import Registry
from ..agg import GlobalBatch, agg_loss
from ..rollout_corr import RolloutCorrection
from ..torch_functional import masked_mean

STANDARD_METRICS = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")


@dataclass(frozen=True)
class PolicyLossOptions:
    """actor.policy_loss.* (verl's PolicyLossConfig): knobs of particular losses."""

    loss_mode: str = "vanilla"
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    dro_beta: Optional[float] = None
    rollout_correction: RolloutCorrection = field(default_factory=RolloutCorrection)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


@dataclass(frozen=True)
class PolicyLossParams:
    """What a policy loss may read from its `config` (verl's ActorConfig names)."""

    clip_ratio: float = 0.2
    """PPO epsilon; used for a side whose own bound is None."""
    clip_ratio_low: Optional[float] = None
    """Ratio floor is 1 - clip_ratio_low."""
    clip_ratio_high: Optional[float] = None
    """Ratio ceiling is 1 + clip_ratio_high (clip-higher when > clip_ratio_low)."""
    clip_ratio_c: float = 3.0
    """Dual-clip: for A < 0 the loss is at most -A * clip_ratio_c (> 1); DPPO's IS truncation."""
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: Optional[float] = None
    """Constant horizon for loss_agg_mode=seq-mean-token-sum-norm (default: T)."""
    tau_pos: float = 1.0
    """SAPO gate temperature for A > 0."""
    tau_neg: float = 1.05
    """SAPO gate temperature for A <= 0."""
    policy_loss: PolicyLossOptions = field(default_factory=PolicyLossOptions)
    global_batch_info: GlobalBatch = field(default_factory=GlobalBatch)
    """The current mini-batch's global sizes (set per micro-batch by the actor)."""

    def __post_init__(self) -> None:
        if self.clip_ratio_c <= 1.0:
            raise ValueError(f"actor.clip_ratio_c (dual-clip bound) must be > 1, got {self.clip_ratio_c}")
        for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"actor.{name} must be >= 0, got {value}")
        if self.tau_pos <= 0 or self.tau_neg <= 0:
            raise ValueError(f"actor.tau_pos and actor.tau_neg must be > 0, got {self.tau_pos}, {self.tau_neg}")

    @classmethod
    def from_config(cls, actor: Any) -> "PolicyLossParams":
        """From actor_rollout_ref.actor (any object with verl's attribute names)."""
        pl = actor.policy_loss
        options = PolicyLossOptions(**{f.name: getattr(pl, f.name) for f in fields(PolicyLossOptions)
                                       if f.name != "rollout_correction"},
                                    rollout_correction=RolloutCorrection.from_config(pl.rollout_correction))
        own = {f.name: getattr(actor, f.name) for f in fields(cls) if f.name not in ("policy_loss", "global_batch_info")}
        return cls(**own, policy_loss=options)

    def with_global_batch(self, batch: GlobalBatch) -> "PolicyLossParams":
        return replace(self, global_batch_info=batch)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

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
    """pg_loss carries the gradient; metrics are detached micro-batch means under verl's names."""

    pg_loss: torch.Tensor
    metrics: dict[str, Union[float, torch.Tensor]] = field(default_factory=dict)

    def floats(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.metrics.items()}


class PolicyLossFn(Protocol):
    def __call__(
        self,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Optional[PolicyLossParams] = None,
        rollout_is_weights: Optional[torch.Tensor] = None,
    ) -> Union[PolicyLossOutput, tuple[torch.Tensor, dict[str, Any]]]: ...


POLICY_LOSSES = Registry("policy loss", key="actor_rollout_ref.actor.policy_loss.loss_mode")  # of PolicyLossFn
register_policy_loss = POLICY_LOSSES.register
F = TypeVar("F")


def declare_metrics(names: Union[tuple[str, ...], Callable[[PolicyLossParams], list[str]]]) -> Callable[[F], F]:
    """The metric names a loss reports (a tuple, or a function of its params for config-dependent sets)."""

    def mark(fn: F) -> F:
        fn.metric_names = names  # type: ignore[attr-defined]
        return fn

    return mark


def loss_metric_names(mode: str, params: PolicyLossParams) -> list[str]:
    """The metrics the actor reports for policy loss `mode` (declared, or verl's three standard ones)."""
    names = getattr(POLICY_LOSSES.get(mode), "metric_names", STANDARD_METRICS)
    return list(names(params) if callable(names) else names)


def aggregate(loss_mat: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str,
              params: PolicyLossParams) -> torch.Tensor:
    """agg_loss with the params' global batch (and actor.loss_scale_factor when the batch sets none)."""
    batch = params.global_batch_info
    if batch.loss_scale_factor is None and params.loss_scale_factor is not None:
        batch = replace(batch, loss_scale_factor=params.loss_scale_factor)
    return agg_loss(loss_mat, response_mask, loss_agg_mode, **batch)


def ppo_kl(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """actor/ppo_kl: token mean of old_log_prob - log_prob (k1 estimate of KL(old || new)), detached."""
    return masked_mean(-log_ratio, response_mask).detach()


def compute_policy_loss(
    mode: str,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams,
    rollout_is_weights: Optional[torch.Tensor] = None,
    loss_agg_mode: Optional[str] = None,
) -> PolicyLossOutput:
    """Call the loss registered as `mode` the way verl does and return a PolicyLossOutput."""
    out = POLICY_LOSSES.get(mode)(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask,
        loss_agg_mode=params.loss_agg_mode if loss_agg_mode is None else loss_agg_mode, config=params,
        rollout_is_weights=rollout_is_weights,
    )
    if isinstance(out, PolicyLossOutput):
        return out
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
        return PolicyLossOutput(out[0], dict(out[1]))
    raise TypeError(f"policy loss {mode!r} returned {type(out).__name__}; expected PolicyLossOutput or "
                    "(pg_loss, metrics dict) like verl's losses")
