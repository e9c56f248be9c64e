"""algorithm.*: advantage estimator, KL in reward, discounting."""
from __future__ import annotations

from dataclasses import dataclass, field

from .common import doc


@dataclass(frozen=True)
class KLControlConfig:
    type: str = doc("fixed | adaptive", "fixed")
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass(frozen=True)
class PFPPOConfig:
    reweight_method: str = "pow"
    weight_pow: float = 2.0


@dataclass(frozen=True)
class AlgorithmConfig:
    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: str = doc("gae | grpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline | remax | user", "gae")
    norm_adv_by_std_in_grpo: bool = doc("false gives Dr.GRPO (no std normalization).", True)
    use_kl_in_reward: bool = False
    kl_penalty: str = doc("kl | abs | mse | low_var_kl: estimator of the in-reward KL.", "kl")
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    use_pf_ppo: bool = False
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
