"""algorithm.*: advantage estimator, KL in reward, discounting, DAPO's group filter, rollout correction."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

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
class FilterGroupsConfig:
    """DAPO's dynamic sampling: keep generating until the batch holds enough groups with signal."""

    enable: bool = doc("Drop prompt groups whose `metric` is the same for every sample; generate more batches "
                       "until data.train_batch_size groups are kept.", False)
    metric: Optional[str] = doc("reward / seq_reward (the summed score), seq_final_reward (the summed reward "
                                "after the in-reward KL), or a field of the reward function's dict (e.g. acc).",
                                "reward")
    max_num_gen_batches: int = doc("Give up (error) after this many generation batches in one step; <= 0: no limit.",
                                   0)
    max_inflight_gen_batches: int = doc("Accepted for verl compatibility; generation batches run one at a time.", 1)


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """verl's rollout correction between the rollout engine's and the actor's log-probs (off by default)."""

    rollout_is: Optional[str] = doc("token | sequence: importance weights pi_old/pi_rollout on the policy loss; "
                                    "null: off.", None)
    rollout_is_threshold: Any = doc("A number U truncates weights at U (TIS); 'L_U' zeroes weights outside [L, U] "
                                    "(IcePop, masked IS).", 2.0)
    rollout_is_batch_normalize: bool = doc("Divide the weights by their batch mean.", False)
    rollout_rs: Optional[str] = doc("Rejection sampling options, comma-separated: token_k1|k2|k3, seq_sum_k1|k2|k3, "
                                    "seq_mean_k1|k2|k3, seq_max_k2|k3; null: off.", None)
    rollout_rs_threshold: Any = doc("One threshold for all rollout_rs options or one per option ('L_U' or U for k1, "
                                    "U for k2/k3).", None)
    bypass_mode: bool = doc("Use the rollout's log-probs as old log-probs (no old-log-prob pass) with the "
                            "bypass_mode policy loss.", False)
    loss_type: str = doc("bypass_mode's loss: ppo_clip | reinforce.", "ppo_clip")


@dataclass(frozen=True)
class AlgorithmConfig:
    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: str = doc("A registered estimator (docs/algorithms.md lists them): gae, grpo, rloo, opo, ...", "gae")
    norm_adv_by_std_in_grpo: bool = doc("false gives Dr.GRPO (no std normalization).", True)
    use_kl_in_reward: bool = False
    kl_penalty: str = doc("kl|k1 | abs | mse|k2 | low_var_kl|k3, or NAME+ (straight-through): in-reward KL estimator.",
                          "kl")
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    use_pf_ppo: bool = False
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    gdpo_reward_keys: Optional[list[str]] = doc("gdpo: fields of the reward function's dict, normalized one by one.",
                                                None)
    gdpo_reward_weights: Optional[list[float]] = doc("gdpo: one weight per key (null: all 1).", None)
