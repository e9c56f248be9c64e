"""Policy losses, one per file, registered under verl's policy_loss.loss_mode names."""

from .base import (
    GSPO_PARAMS,
    POLICY_LOSSES,
    PolicyLossFn,
    PolicyLossOutput,
    PolicyLossParams,
    tis_weights,
)
from .gspo import gspo
from .vanilla import vanilla

__all__ = [
    "GSPO_PARAMS",
    "POLICY_LOSSES",
    "PolicyLossFn",
    "PolicyLossOutput",
    "PolicyLossParams",
    "gspo",
    "tis_weights",
    "vanilla",
]
