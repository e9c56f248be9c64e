"""Policy losses, one per file, registered under verl's policy_loss.loss_mode names."""

from .base import (
    GSPO_PARAMS,
    POLICY_LOSSES,
    STANDARD_METRICS,
    PolicyLossFn,
    PolicyLossOptions,
    PolicyLossOutput,
    PolicyLossParams,
    aggregate,
    compute_policy_loss,
    declare_metrics,
    loss_metric_names,
    register_policy_loss,
)
from .bypass_mode import bypass_mode
from .cispo import cispo
from .clip_cov import clip_cov
from .dppo import dppo_kl, dppo_tv
from .dro import dro
from .geo_mean import geo_mean
from .gpg import gpg
from .gspo import gspo
from .kl_cov import kl_cov
from .reinforce import reinforce
from .sapo import sapo
from .vanilla import vanilla

__all__ = [
    "GSPO_PARAMS",
    "POLICY_LOSSES",
    "STANDARD_METRICS",
    "PolicyLossFn",
    "PolicyLossOptions",
    "PolicyLossOutput",
    "PolicyLossParams",
    "aggregate",
    "bypass_mode",
    "cispo",
    "clip_cov",
    "compute_policy_loss",
    "declare_metrics",
    "dppo_kl",
    "dppo_tv",
    "dro",
    "geo_mean",
    "gpg",
    "gspo",
    "kl_cov",
    "loss_metric_names",
    "reinforce",
    "register_policy_loss",
    "sapo",
    "vanilla",
]
