"""actor_rollout_ref.{model,actor,ref}.*: the policy, its optimizer and the frozen reference."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .algorithm import RolloutCorrectionConfig
from .common import CheckpointConfig, CustomClsConfig, MegatronConfig, OptimConfig, doc, follow_actor_layout, link


@dataclass(frozen=True)
class LoraSyncConfig:
    """actor_rollout_ref.model.lora: how LoRA adapters reach the rollout engine (verl's megatron key)."""

    merge: bool = doc("false: the rollout engine loads the frozen base once and takes only the adapters each step "
                      "(vLLM LoRA, updated in place; hybridrl/rollout/lora.py); true: the adapters are merged into the "
                      "base weights and the full weights are synced each step, as without LoRA.", False)


@dataclass(frozen=True)
class ModelConfig:
    path: str = doc("HuggingFace model folder (config.json + safetensors) or GGUF folder.", "~/models/deepseek-llm-7b-chat")
    custom_chat_template: Optional[str] = None
    external_lib: Optional[str] = None
    override_config: dict[str, Any] = doc("Overrides applied to the HF config before building.", factory=dict)
    enable_gradient_checkpointing: bool = doc("Full activation recompute in Megatron.", False)
    use_remove_padding: bool = False
    use_fused_kernels: bool = False
    trust_remote_code: bool = False
    lora_rank: int = doc("LoRA rank of the actor's adapters (adapters/megatron/lora.py); 0: full fine-tuning. With "
                         "LoRA the reference is the actor with its adapters off (no second model).", 0)
    lora_alpha: float = doc("LoRA scaling numerator: the adapters' output is scaled by lora_alpha/lora_rank.", 16)
    target_modules: Any = doc("Linear layers that get adapters: all-linear, or a list of q_proj, k_proj, v_proj, "
                              "o_proj, gate_proj, up_proj, down_proj (megatron's linear_qkv, linear_proj, linear_fc1, "
                              "linear_fc2 name their groups).", "all-linear")
    exclude_modules: Any = doc("Linear layers left without adapters (same names as target_modules); null: none.", None)
    lora_adapter_path: Optional[str] = doc("A PEFT adapter folder (adapter_config.json + adapter_model.safetensors) "
                                           "to start from; its r, lora_alpha and target_modules must match the keys.",
                                           None)
    lora: LoraSyncConfig = doc("LoRA's weight sync into the rollout engine (lora.merge).", factory=LoraSyncConfig)
    gguf_file: Optional[str] = doc("GGUF file inside `path` to load (dequantized to float).", None)


@dataclass(frozen=True)
class PolicyLossConfig:
    loss_mode: str = doc("A registered policy loss (docs/algorithms.md lists them): vanilla, gspo, cispo, ...",
                         "vanilla")
    clip_cov_ratio: float = doc("clip_cov: fraction of tokens whose gradient is stopped.", 0.0002)
    clip_cov_lb: float = doc("clip_cov: covariance lower bound of the candidates.", 1.0)
    clip_cov_ub: float = doc("clip_cov: covariance upper bound of the candidates.", 5.0)
    kl_cov_ratio: float = doc("kl_cov: fraction of tokens that get the KL penalty.", 0.0002)
    ppo_kl_coef: float = doc("kl_cov: coefficient of |log ratio| on those tokens.", 0.1)
    dro_beta: Optional[float] = doc("dro: quadratic log-ratio penalty (required for loss_mode=dro).", None)
    rollout_correction: RolloutCorrectionConfig = doc("Follows algorithm.rollout_correction in a job config (set it "
                                                      "there); off in an ActorConfig built by hand.",
                                                      factory=RolloutCorrectionConfig)


@dataclass(frozen=True)
class RouterReplayConfig:
    """Mixture-of-experts routing replay (verl's keys)."""

    mode: str = doc("disabled | R3: the actor's log-prob and update passes route every token to the experts the "
                    "rollout chose (needs rollout.enable_rollout_routing_replay=true); R2 is not supported.",
                    "disabled")


@dataclass(frozen=True)
class ActorConfig:
    strategy: str = "megatron"
    ppo_mini_batch_size: int = doc("Prompts per optimizer step (multiplied by rollout.n into samples).", 256)
    ppo_micro_batch_size: Optional[int] = doc("Deprecated global micro batch; prefer ppo_micro_batch_size_per_gpu.", None)
    ppo_micro_batch_size_per_gpu: Optional[int] = doc("Samples per forward/backward on one data-parallel rank.", None)
    use_dynamic_bsz: bool = doc("Pack micro-batches up to ppo_max_token_len_per_gpu tokens.", False)
    ppo_max_token_len_per_gpu: int = 16384
    clip_ratio: float = 0.2
    clip_ratio_low: Optional[float] = doc("Lower clip; null: clip_ratio.", None)
    clip_ratio_high: Optional[float] = doc("Upper clip (clip-higher); null: clip_ratio.", None)
    clip_ratio_c: float = doc("Dual-clip bound for negative advantages (> 1).", 3.0)
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    loss_agg_mode: str = doc("token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | "
                             "seq-mean-token-sum-norm", "token-mean")
    loss_scale_factor: Optional[float] = doc("seq-mean-token-sum-norm's constant horizon (null: the response length).",
                                             None)
    entropy_coeff: float = 0.0
    tau_pos: float = doc("sapo: gate temperature for positive advantages.", 1.0)
    tau_neg: float = doc("sapo: gate temperature for negative advantages.", 1.05)
    calculate_sum_pi_squared: bool = doc("Return sum of squared token probabilities from the old-log-prob pass "
                                         "(on by itself for the optimal-token-baseline estimators).", False)
    use_kl_loss: bool = False
    use_torch_compile: bool = True
    kl_loss_coef: float = 0.001
    kl_loss_type: str = doc("KL estimator of the KL loss (as algorithm.kl_penalty; NAME+ is straight-through).",
                            "low_var_kl")
    ppo_epochs: int = 1
    shuffle: bool = False
    tis_imp_ratio_cap: float = doc("Older key: C > 0 means algorithm.rollout_correction.rollout_is=token with "
                                   "rollout_is_threshold=C (<= 0: off).", -1.0)
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    data_loader_seed: Optional[int] = None
    load_weight: bool = True
    adapter: CustomClsConfig = doc("A user ActorModel class (path, name); default: the Megatron adapter.",
                                   factory=CustomClsConfig)


@dataclass(frozen=True)
class RefConfig:
    strategy: str = "megatron"
    use_torch_compile: bool = True
    log_prob_micro_batch_size: Optional[int] = None
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    log_prob_use_dynamic_bsz: bool = link("actor_rollout_ref.actor.use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int = link("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    megatron: MegatronConfig = field(default_factory=lambda: follow_actor_layout(use_distributed_optimizer=False))
    load_weight: bool = True
