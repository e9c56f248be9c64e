"""Rewards: rule scorers (gsm8k, math, arithmetic), dispatch by data_source, reward managers
(naive, batch, dapo, and user-registered ones), DAPO's overlong buffer and loading custom_reward_function
by path. Model-based rewards (reward model, judge, their combination with these) are in hybridrl.model_rewards."""
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
from .overlong import DAPORewardManager, OverlongBuffer, overlong_penalty, with_overlong_buffer
from .scoring import default_compute_score, default_compute_score_batch, register_data_source

__all__ = [
    "REWARD_MANAGERS", "BatchRewardManager", "DAPORewardManager", "NaiveRewardManager", "OverlongBuffer", "RewardFunctionError", "RewardManager",
    "RewardOutput", "default_compute_score", "default_compute_score_batch", "load_custom_reward_fn",
    "load_reward_fn", "overlong_penalty", "register_data_source", "register_reward_manager", "with_overlong_buffer",
]
