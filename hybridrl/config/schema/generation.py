"""The config of `python -m hybridrl.trainer.main_generation` (verl's generation.yaml keys)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from .common import doc
from .rollout import RolloutConfig


@dataclass(frozen=True)
class GenTrainerConfig:
    nnodes: int = 1
    n_gpus_per_node: int = doc("GPUs to use (the vLLM engine's tensor parallel size is rollout.tensor_model_parallel_size).", 1)
    device: str = doc("auto | cuda | cpu (cpu: the built-in torch engine).", "auto")


@dataclass(frozen=True)
class GenDataConfig:
    path: str = doc("Prompts in verl's format (parquet, Arrow or jsonl).", "~/data/rlhf/math/test.parquet")
    prompt_key: str = "prompt"
    n_samples: int = doc("Responses per prompt.", 5)
    output_path: str = doc("Parquet written: the input rows plus a `responses` column (a list of n strings).",
                           "generations.parquet")
    overwrite_output: bool = doc("An existing output_path is refused (main_generation never replaces a file it may not "
                                 "have written); true replaces it. The input data.path is never overwritten.", False)
    batch_size: int = doc("Prompts per engine call.", 128)
    truncation: str = doc("error | left | right | middle for prompts over rollout.prompt_length.", "error")
    max_samples: int = doc("Use the first N prompts (-1: all).", -1)
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GenModelConfig:
    path: str = doc("An HF folder, a folder with a .gguf file, or a hybridrl actor checkpoint (merged first).",
                    "~/models/Qwen2-7B-Instruct")
    external_lib: Optional[str] = None
    trust_remote_code: bool = False
    gguf_file: Optional[str] = None


@dataclass(frozen=True)
class GenRolloutConfig(RolloutConfig):
    """rollout.* as in training, with verl's generation defaults (no links into the training config)."""

    name: str = "auto"
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 0.7
    prompt_length: int = 1536
    response_length: int = 512
    tensor_model_parallel_size: int = 1
    enforce_eager: bool = False  # verl's generation default is true; CUDA graphs are what makes decode fast
    log_prob_micro_batch_size_per_gpu: Optional[int] = 8
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384


@dataclass(frozen=True)
class GenerationConfig:
    trainer: GenTrainerConfig = field(default_factory=GenTrainerConfig)
    data: GenDataConfig = field(default_factory=GenDataConfig)
    model: GenModelConfig = field(default_factory=GenModelConfig)
    rollout: GenRolloutConfig = field(default_factory=GenRolloutConfig)
    ray_init: dict[str, Any] = field(default_factory=lambda: {"num_cpus": None, "timeline_json_file": None})
    # rollout.* keys the training schema has but main_generation never reads (it samples data.n_samples per prompt
    # with rollout.temperature/top_p/top_k, computes no log-probs, syncs no weights): never offered as a did-you-mean
    UNREAD_KEYS: ClassVar[tuple[str, ...]] = (
        "rollout.val_kwargs", "rollout.multi_turn", "rollout.n", "rollout.mode", "rollout.nnodes",
        "rollout.n_gpus_per_node", "rollout.data_parallel_size", "rollout.load_format", "rollout.max_model_len",
        "rollout.calculate_log_probs", "rollout.log_prob_micro_batch_size", "rollout.log_prob_micro_batch_size_per_gpu",
        "rollout.log_prob_use_dynamic_bsz", "rollout.log_prob_max_token_len_per_gpu",
        "rollout.update_weights_bucket_megabytes", "rollout.direct_weight_copy", "rollout.cross_gpu_zero_copy",
        "rollout.cross_gpu_overlap_local",
        "rollout.sync_check",
        "rollout.enable_rollout_routing_replay")
