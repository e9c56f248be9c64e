"""Advantage estimators, one per file, registered under verl's adv_estimator names."""

from .base import (
    ADVANTAGE_ESTIMATORS,
    AdvantageFn,
    AdvantageInputs,
    AdvantageOutput,
    AdvantageParams,
    Groups,
    compute_advantage,
    group_stats,
)
from .gae import gae
from .grpo import grpo
from .reinforce_plus_plus import reinforce_plus_plus
from .reinforce_plus_plus_baseline import reinforce_plus_plus_baseline
from .remax import remax
from .rloo import rloo

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageFn",
    "AdvantageInputs",
    "AdvantageOutput",
    "AdvantageParams",
    "Groups",
    "compute_advantage",
    "gae",
    "group_stats",
    "grpo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rloo",
]
