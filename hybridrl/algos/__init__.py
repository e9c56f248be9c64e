"""hybridrl.algos: the RL math of PPO/GRPO-style post-training as small pure torch functions.

No distributed code and no engine imports here: everything runs on CPU tensors and is tested
against independent references. Semantics follow verl's definitions so the same inputs give the
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
    group_stats,
)
from .agg import LOSS_AGG_MODES, agg_loss
from .entropy import entropy_loss, entropy_loss_from_logits
from .kl import KL_PENALTIES, kl_loss, kl_penalty
from .kl_control import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    build_kl_controller,
)
from .policy_loss import (
    GSPO_PARAMS,
    POLICY_LOSSES,
    PolicyLossFn,
    PolicyLossOutput,
    PolicyLossParams,
    tis_weights,
)
from .torch_functional import (
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
    "AdaptiveKLController",
    "AdvantageFn",
    "AdvantageInputs",
    "AdvantageOutput",
    "AdvantageParams",
    "FixedKLController",
    "GSPO_PARAMS",
    "KLController",
    "KL_PENALTIES",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "PolicyLossFn",
    "PolicyLossOutput",
    "PolicyLossParams",
    "Registry",
    "ValueLossOutput",
    "agg_loss",
    "apply_kl_penalty",
    "build_kl_controller",
    "compute_advantage",
    "entropy_from_logits",
    "entropy_loss",
    "entropy_loss_from_logits",
    "group_stats",
    "kl_loss",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "tis_weights",
    "value_loss",
]
