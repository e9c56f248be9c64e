"""Typed config dataclasses with verl's key names and defaults (frozen: built once by the loader)."""
from .actor import ActorConfig, ModelConfig, PolicyLossConfig, RefConfig
from .algorithm import AlgorithmConfig, KLControlConfig
from .common import CheckpointConfig, CustomClsConfig, Link, MegatronConfig, OptimConfig
from .critic import CriticConfig, CriticModelConfig, CustomRewardFunctionConfig, RewardModelConfig
from .data import DataConfig
from .evaluation import EvalConfig  # noqa: F401  main_eval's schema (not a section of PPOConfig)
from .generation import GenerationConfig  # noqa: F401  main_generation's schema
from .rollout import RolloutConfig, SamplingConfig, SyncCheckConfig
from .root import ActorRolloutRefConfig, PPOConfig
from .trainer import RayKwargsConfig, TrainerConfig

__all__ = [
    "ActorConfig", "ActorRolloutRefConfig", "AlgorithmConfig", "CheckpointConfig", "CriticConfig",
    "CriticModelConfig", "CustomClsConfig", "CustomRewardFunctionConfig", "DataConfig", "KLControlConfig",
    "Link", "MegatronConfig", "ModelConfig", "OptimConfig", "PPOConfig", "PolicyLossConfig", "RayKwargsConfig",
    "RefConfig", "RewardModelConfig", "RolloutConfig", "SamplingConfig", "SyncCheckConfig", "TrainerConfig",
]
