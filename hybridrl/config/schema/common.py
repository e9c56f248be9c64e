"""Pieces shared by several config sections: links, optimizer, Megatron engine, checkpoint contents.

A `Link` default means "same value as that other key unless set" (verl writes these as `${...}`
interpolations); the loader resolves every link before the dataclasses are built, so a validated
config never holds one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class Link:
    """Default that follows another dotted key (resolved by the loader)."""

    target: str
    fallback: Any = None

    def __repr__(self) -> str:
        return "${" + self.target + "}"


def link(target: str, fallback: Any = None) -> Any:
    return field(default=Link(target, fallback))


def doc(text: str, default: Any = None, factory: Any = None) -> Any:
    """A field with its help text kept in the metadata (printed by `hybridrl config --help-keys`)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


@dataclass(frozen=True)
class OptimConfig:
    """Megatron optimizer and LR schedule (verl's McoreOptimizerConfig keys)."""

    lr: float = 1e-6
    lr_warmup_steps_ratio: float = 0.0
    total_training_steps: int = -1
    weight_decay: float = 0.01
    lr_warmup_steps: int = doc("Warm-up steps; -1 derives them from lr_warmup_steps_ratio.", -1)
    betas: list[float] = doc("Adam betas.", factory=lambda: [0.9, 0.999])
    clip_grad: float = doc("Gradient-norm clip (0 disables).", 1.0)
    optimizer: str = "adam"
    lr_warmup_init: float = 0.0
    lr_decay_steps: Optional[int] = None
    lr_decay_style: str = doc("constant | linear | cosine | inverse-square-root | WSD", "constant")
    min_lr: float = 0.0
    weight_decay_incr_style: str = "constant"
    lr_wsd_decay_style: str = "exponential"
    lr_wsd_decay_steps: Optional[int] = None
    use_checkpoint_opt_param_scheduler: bool = False
    override_optimizer_config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MegatronConfig:
    """Megatron parallel layout and memory options of one role (actor, ref, critic, reward model)."""

    param_offload: bool = doc("Offload parameters to pinned CPU memory while the role is idle (GPU only).", False)
    grad_offload: bool = doc("Offload gradients while idle (GPU only).", False)
    optimizer_offload: bool = doc("Offload optimizer state while idle (GPU only), as in verl. The colocated actor's "
                                  "then waits on the host during generation and comes back for its optimizer step, "
                                  "as much of it beside the forward/backward as the memory the plan leaves allows "
                                  "(`hybridrl plan`: phase train_actor_onload); false keeps it on the GPU beside the "
                                  "rollout engine (faster where both fit: `hybridrl plan` shows the rollout phase).",
                                  False)
    optimizer_onload_overlap: bool = doc("With optimizer_offload: the actor's optimizer state comes back from the host "
                                         "on a side stream during the forward/backward, as far as the plan's memory "
                                         "allows; false brings it back after the backward (serial, the memory of the "
                                         "forward/backward left alone).", True)
    tensor_model_parallel_size: int = 1
    expert_model_parallel_size: int = doc("Expert parallelism (MoE models): the experts are split over this many ranks "
                                          "of each pipeline stage's tp*dp ranks; must divide the number of experts.", 1)
    expert_tensor_parallel_size: Optional[int] = doc("Tensor parallelism inside each expert (MoE models); null: the "
                                                     "same as tensor_model_parallel_size.", None)
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: Optional[int] = None
    context_parallel_size: int = 1
    sequence_parallel: bool = doc("Sequence parallelism; only takes effect when tensor_model_parallel_size > 1.", True)
    use_distributed_optimizer: bool = True
    use_dist_checkpointing: bool = False
    dist_checkpointing_path: Optional[str] = None
    seed: int = 42
    override_ddp_config: dict[str, Any] = field(default_factory=dict)
    override_transformer_config: dict[str, Any] = field(default_factory=dict)
    dtype: str = doc("bfloat16 | float16 | float32 on GPU; CPU always trains in float32.", "bfloat16")
    transformer_impl: Optional[str] = doc(
        "Layer spec: transformer_engine (fused norm+linear, TE attention; FP8 and context parallelism need it; a "
        "mixture of experts' experts as one grouped GEMM a layer unless override_transformer_config."
        "moe_grouped_gemm=false) | local (torch; experts one after another); null: transformer_engine where it "
        "imports on a GPU, else local.", None)


@dataclass(frozen=True)
class CheckpointConfig:
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    load_contents: Optional[list[str]] = doc("Defaults to save_contents.", None)
    async_save: bool = False


@dataclass(frozen=True)
class CustomClsConfig:
    """A user class loaded from a file: `path` (a .py file or pkg://module) and class `name`."""

    path: Optional[str] = None
    name: Optional[str] = None


LAYOUT_KEYS = (
    "tensor_model_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "sequence_parallel",
)


def follow_actor_layout(**overrides: Any) -> MegatronConfig:
    """Default Megatron block of a role that runs in the actor's processes (ref, critic).

    megatron-core keeps one parallel layout per process, so these roles follow the actor's tp/pp/cp
    unless set; validation rejects a layout that differs from the actor's.
    """
    links = {k: Link(f"actor_rollout_ref.actor.megatron.{k}") for k in LAYOUT_KEYS}
    links["seed"] = Link("actor_rollout_ref.actor.megatron.seed")
    links["transformer_impl"] = Link("actor_rollout_ref.actor.megatron.transformer_impl")
    links.update(overrides)
    return MegatronConfig(**links)
