"""hybridrl.algos: the RL math of PPO/GRPO-style post-training as small pure torch functions.

No distributed code and no engine imports here: everything runs on CPU tensors and is tested
against independent references. Semantics follow verl 0.9's definitions so the same inputs give the
same numbers. Extension points are the registries: ADVANTAGE_ESTIMATORS, POLICY_LOSSES,
KL_PENALTIES, LOSS_AGG_MODES.
"""

from ..utils.registry import Registry
from .advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageFn,
    AdvantageInputs,
    AdvantageOutput,
    AdvantageParams,
    compute_advantage,
    estimator_needs,
    group_stats,
    needs,
)
from .agg import LOSS_AGG_MODES, GlobalBatch, agg_loss
from .entropy import (
    calculate_sum_pi_squared_from_logits,
    entropy_from_logits_chunked,
    entropy_loss,
    entropy_loss_from_logits,
    sum_pi_squared_from_logits,
)
from .kl import KL_PENALTIES, kl_loss, kl_penalty
from .kl_control import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    build_kl_controller,
    compute_rewards,
)
from .objective import ActorObjective, ObjectiveOutput
from .policy_loss import (
    GSPO_PARAMS,
    POLICY_LOSSES,
    PolicyLossFn,
    PolicyLossOptions,
    PolicyLossOutput,
    PolicyLossParams,
    compute_policy_loss,
    declare_metrics,
    loss_metric_names,
    register_policy_loss,
)
from .rollout_corr import Correction, RolloutCorrection, rollout_correction
from .torch_functional import (
    clip_by_value,
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from .value_loss import ValueLossOutput, value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ActorObjective",
    "AdaptiveKLController",
    "AdvantageFn",
    "AdvantageInputs",
    "AdvantageOutput",
    "AdvantageParams",
    "Correction",
    "FixedKLController",
    "GSPO_PARAMS",
    "GlobalBatch",
    "KLController",
    "KL_PENALTIES",
    "LOSS_AGG_MODES",
    "ObjectiveOutput",
    "POLICY_LOSSES",
    "PolicyLossFn",
    "PolicyLossOptions",
    "PolicyLossOutput",
    "PolicyLossParams",
    "Registry",
    "RolloutCorrection",
    "ValueLossOutput",
    "agg_loss",
    "apply_kl_penalty",
    "build_kl_controller",
    "calculate_sum_pi_squared_from_logits",
    "clip_by_value",
    "compute_advantage",
    "compute_policy_loss",
    "compute_rewards",
    "declare_metrics",
    "entropy_from_logits",
    "entropy_from_logits_chunked",
    "entropy_loss",
    "entropy_loss_from_logits",
    "estimator_needs",
    "group_stats",
    "kl_loss",
    "kl_penalty",
    "logprobs_from_logits",
    "loss_metric_names",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "needs",
    "register_policy_loss",
    "rollout_correction",
    "sum_pi_squared_from_logits",
    "value_loss",
]
