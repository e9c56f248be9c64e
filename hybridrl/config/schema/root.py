"""The whole job config: verl's top-level sections."""
from __future__ import annotations

from dataclasses import dataclass, field

from .actor import ActorConfig, ModelConfig, PolicyLossConfig, RefConfig
from .algorithm import AlgorithmConfig, RolloutCorrectionConfig
from .async_training import AsyncTrainingConfig
from .common import Link, doc
from .critic import CriticConfig, CustomRewardFunctionConfig, RewardModelConfig
from .data import DataConfig
from .profiler import GlobalProfilerConfig
from .rollout import RolloutConfig
from .trainer import RayKwargsConfig, TrainerConfig


def _actor_following_algorithm() -> ActorConfig:
    """verl hands algorithm.rollout_correction to the loss as actor.policy_loss.rollout_correction: in a job config
    the latter follows the former (validation rejects a different setting)."""
    links = {k: Link(f"algorithm.rollout_correction.{k}") for k in RolloutCorrectionConfig.__dataclass_fields__}
    return ActorConfig(policy_loss=PolicyLossConfig(rollout_correction=RolloutCorrectionConfig(**links)))


@dataclass(frozen=True)
class ActorRolloutRefConfig:
    hybrid_engine: bool = doc("true: rollout and training share the GPUs, weights resharded in place; false: the "
                              "rollout runs on its own GPUs (actor_rollout_ref.rollout.n_gpus_per_node) and gets the "
                              "weights by broadcast after every update.", True)
    nccl_timeout: int = 600
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=_actor_following_algorithm)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass(frozen=True)
class PPOConfig:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    global_profiler: GlobalProfilerConfig = field(default_factory=GlobalProfilerConfig)
