"""Rewards: rule scorers (gsm8k, math, arithmetic), dispatch by data_source, reward managers
(naive, batch, and user-registered ones) and loading custom_reward_function by path."""
from .loading import load_custom_reward_fn, load_reward_fn
from .managers import (
                       REWARD_MANAGERS,
                       BatchRewardManager,
                       NaiveRewardManager,
                       RewardFunctionError,
                       RewardManager,
                       RewardOutput,
                       register_reward_manager,
)
from .scoring import default_compute_score, default_compute_score_batch, register_data_source

__all__ = [
    "REWARD_MANAGERS", "BatchRewardManager", "NaiveRewardManager", "RewardFunctionError", "RewardManager",
    "RewardOutput", "default_compute_score", "default_compute_score_batch", "load_custom_reward_fn",
    "load_reward_fn", "register_data_source", "register_reward_manager",
]
