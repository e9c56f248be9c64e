"""Typed config dataclasses with verl's key names and defaults (frozen: built once by the loader)."""
from .actor import ActorConfig, ModelConfig, PolicyLossConfig, RefConfig
from .algorithm import AlgorithmConfig, FilterGroupsConfig, KLControlConfig, RolloutCorrectionConfig
from .common import CheckpointConfig, CustomClsConfig, Link, MegatronConfig, OptimConfig
from .critic import CriticConfig, CriticModelConfig, CustomRewardFunctionConfig, OverlongBufferConfig, RewardModelConfig
from .data import DataConfig
from .evaluation import EvalConfig  # noqa: F401  main_eval's schema (not a section of PPOConfig)
from .generation import GenerationConfig  # noqa: F401  main_generation's schema
from .rollout import RolloutConfig, SamplingConfig, SyncCheckConfig
from .root import ActorRolloutRefConfig, PPOConfig
from .trainer import RayKwargsConfig, TrainerConfig

__all__ = [
    "ActorConfig", "ActorRolloutRefConfig", "AlgorithmConfig", "CheckpointConfig", "CriticConfig",
    "CriticModelConfig", "CustomClsConfig", "CustomRewardFunctionConfig", "DataConfig", "FilterGroupsConfig",
    "KLControlConfig", "Link", "MegatronConfig", "ModelConfig", "OptimConfig", "OverlongBufferConfig", "PPOConfig",
    "PolicyLossConfig", "RayKwargsConfig", "RefConfig", "RewardModelConfig", "RolloutConfig",
    "RolloutCorrectionConfig", "SamplingConfig", "SyncCheckConfig", "TrainerConfig",
]
