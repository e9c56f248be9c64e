"""Job configuration: typed schema (verl's keys), composition with overrides, one validation pass.

    cfg = load_config(["data.train_batch_size=256", ...], config_name="ppo_trainer")
    run = validate(cfg)          # RunConfig(cfg, derived); raises ConfigError naming the keys
"""
from .layout import BatchPlan, Derived, ParallelLayout, RunConfig
from .loader import ConfigError, compose, load_config, to_dict, to_yaml
from .rollout_checks import RolloutLayout
from .schema import PPOConfig
from .validate import validate

__all__ = [
    "BatchPlan", "ConfigError", "Derived", "PPOConfig", "ParallelLayout", "RolloutLayout", "RunConfig",
    "compose", "load_config", "to_dict", "to_yaml", "validate",
]
