"""critic.*, reward_model.*, custom_reward_function.*."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .common import CheckpointConfig, Link, MegatronConfig, OptimConfig, doc, follow_actor_layout, link
from .reward import JudgeConfig, RewardCombineConfig


@dataclass(frozen=True)
class CriticModelConfig:
    path: str = "~/models/deepseek-llm-7b-chat"
    tokenizer_path: str = link("actor_rollout_ref.model.path")
    override_config: dict[str, Any] = field(default_factory=dict)
    external_lib: Optional[str] = link("actor_rollout_ref.model.external_lib")
    trust_remote_code: bool = link("actor_rollout_ref.model.trust_remote_code")
    enable_gradient_checkpointing: bool = False
    use_remove_padding: bool = False
    gguf_file: Optional[str] = None


@dataclass(frozen=True)
class CriticConfig:
    rollout_n: int = link("actor_rollout_ref.rollout.n")
    strategy: str = "megatron"
    enable: Optional[bool] = doc("null: on when the advantage estimator needs values (gae).", None)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    megatron: MegatronConfig = field(default_factory=follow_actor_layout)
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    ppo_mini_batch_size: int = link("actor_rollout_ref.actor.ppo_mini_batch_size")
    ppo_micro_batch_size: Optional[int] = None
    ppo_micro_batch_size_per_gpu: Optional[int] = None
    forward_micro_batch_size_per_gpu: Optional[int] = doc("Samples per value forward; null: ppo_micro_batch_size_per_gpu.", None)
    use_dynamic_bsz: bool = link("actor_rollout_ref.actor.use_dynamic_bsz")
    ppo_max_token_len_per_gpu: int = 32768
    forward_max_token_len_per_gpu: int = link("critic.ppo_max_token_len_per_gpu")
    ppo_epochs: int = link("actor_rollout_ref.actor.ppo_epochs")
    shuffle: bool = link("actor_rollout_ref.actor.shuffle")
    cliprange_value: float = 0.5
    loss_agg_mode: str = link("actor_rollout_ref.actor.loss_agg_mode")
    loss_scale_factor: Optional[float] = doc("seq-mean-token-sum-norm's constant horizon (null: the response length).",
                                             None)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    nccl_timeout: int = 600
    load_weight: bool = True
    data_loader_seed: Optional[int] = link("actor_rollout_ref.actor.data_loader_seed")


@dataclass(frozen=True)
class RewardModelModelConfig:
    input_tokenizer: Optional[str] = field(default=Link("actor_rollout_ref.model.path"), metadata={"doc": (
        "The policy's tokenizer: where the reward model's tokenizer differs from it, prompt and response are decoded "
        "with it and re-rendered with the reward model's chat template; null: the policy's tokens are scored as they "
        "are.")})
    path: str = doc("A HF *ForSequenceClassification / *ForTokenClassification folder (num_labels=1).",
                    "~/models/FsfairX-LLaMA3-RM-v0.1")
    external_lib: Optional[str] = link("actor_rollout_ref.model.external_lib")
    trust_remote_code: bool = False
    override_config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OverlongBufferConfig:
    """DAPO's soft overlong punishment of responses near data.max_response_length."""

    enable: bool = doc("Subtract a length penalty from the score of responses longer than "
                       "max_response_length - len.", False)
    len: int = doc("Buffer length L: the penalty grows linearly from 0 at max_response_length - L to "
                   "penalty_factor at max_response_length.", 0)
    penalty_factor: float = doc("Penalty at the full response length.", 1.0)
    log: bool = doc("Report overlong_reward and overlong per sample among the reward extras.", False)


@dataclass(frozen=True)
class RewardModelConfig:
    enable: bool = doc("Score responses with a reward model (reward_model.model.path) on the Megatron engine, in the "
                       "actor's processes and layout; reward_model.combine says how it meets the rule reward.", False)
    enable_resource_pool: bool = False
    n_gpus_per_node: int = 0
    nnodes: int = 0
    strategy: str = "megatron"
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    micro_batch_size: Optional[int] = None
    micro_batch_size_per_gpu: Optional[int] = None
    max_length: Optional[int] = None
    use_dynamic_bsz: bool = link("critic.use_dynamic_bsz")
    forward_max_token_len_per_gpu: int = link("critic.forward_max_token_len_per_gpu")
    reward_manager: str = doc("naive | batch | dapo (naive, with a number's score also reported as acc) | a "
                              "user-registered manager.", "naive")
    launch_reward_fn_async: bool = False
    megatron: MegatronConfig = doc("The reward model's layout follows the actor's (it runs in the actor's processes); "
                                   "param_offload defaults to true here: its weights leave the GPU while it is idle.",
                                   factory=lambda: follow_actor_layout(use_distributed_optimizer=False,
                                                                       param_offload=True))
    load_weight: bool = True
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    combine: RewardCombineConfig = field(default_factory=RewardCombineConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)


@dataclass(frozen=True)
class CustomRewardFunctionConfig:
    path: Optional[str] = doc("A .py file defining compute_score(data_source, solution_str, ground_truth, extra_info).", None)
    name: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
