"""Advantage estimators, one per file, registered under verl's adv_estimator names."""

from .base import (
    ADVANTAGE_ESTIMATORS,
    AdvantageFn,
    AdvantageInputs,
    AdvantageOutput,
    AdvantageParams,
    Groups,
    compute_advantage,
    estimator_needs,
    group_stats,
    needs,
)
from .gae import gae
from .gdpo import gdpo
from .gpg import gpg
from .grpo import grpo
from .grpo_passk import grpo_passk
from .opo import opo
from .optimal_token_baseline import optimal_token_baseline, tir_optimal_token_baseline
from .reinforce_plus_plus import reinforce_plus_plus
from .reinforce_plus_plus_baseline import reinforce_plus_plus_baseline
from .remax import remax
from .rloo import rloo, rloo_vectorized

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageFn",
    "AdvantageInputs",
    "AdvantageOutput",
    "AdvantageParams",
    "Groups",
    "compute_advantage",
    "estimator_needs",
    "gae",
    "gdpo",
    "gpg",
    "group_stats",
    "grpo",
    "grpo_passk",
    "needs",
    "opo",
    "optimal_token_baseline",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rloo",
    "rloo_vectorized",
    "tir_optimal_token_baseline",
]
