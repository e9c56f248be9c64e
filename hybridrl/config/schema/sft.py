"""The config of `python -m hybridrl.trainer.main_sft` (verl's SFT trainer keys).

verl has two SFT trainers and both spellings are read here: fsdp_sft_trainer's (`model.partial_pretrain`,
`data.multiturn.{enable,messages_key,tools_key}`, `data.micro_batch_size`) and the engine-based sft_trainer's
(`model.path`, `data.messages_key`, `data.use_dynamic_bsz`, `engine.*` for the Megatron layout). The Megatron
engine is the one RL uses (actor_rollout_ref.actor.megatron.* there, `engine.*` here, verl's name).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .common import CustomClsConfig, MegatronConfig, OptimConfig, doc, link


@dataclass(frozen=True)
class MultiturnConfig:
    """verl fsdp_sft_trainer's data.multiturn.* (the engine trainer spells the keys under data.)."""

    enable: Optional[bool] = doc("true: rows are conversations (messages_key); false: prompt_key/response_key pairs; "
                                 "null: conversations when the files have the messages_key column.", None)
    messages_key: str = link("data.messages_key")
    tools_key: str = link("data.tools_key")
    enable_thinking_key: str = link("data.enable_thinking_key")


@dataclass(frozen=True)
class SFTDataConfig:
    train_files: list[str] = doc("Parquet, Arrow or jsonl files; a single path or a list.",
                                 factory=lambda: ["~/data/gsm8k/train.parquet"])
    val_files: Optional[list[str]] = doc("Validation files (val/loss every trainer.test_freq steps); null: none.", None)
    train_max_samples: int = doc("Keep the first N training rows (-1: all).", -1)
    val_max_samples: int = -1
    train_batch_size: int = doc("Sequences per optimizer step (global, over all data-parallel ranks).", 256)
    micro_batch_size: Optional[int] = doc("Deprecated in verl: the global micro-batch; use micro_batch_size_per_gpu.", None)
    micro_batch_size_per_gpu: int = doc("Sequences per forward/backward on one rank (also the validation micro-batch).", 4)
    use_dynamic_bsz: bool = doc("Micro-batches cut by tokens (max_token_len_per_gpu) instead of by rows.", False)
    max_token_len_per_gpu: int = doc("Token budget of one micro-batch with use_dynamic_bsz.", 8192)
    prompt_key: str = doc("Single-turn rows: the prompt column (a string, or a list of chat messages).", "question")
    response_key: str = doc("Single-turn rows: the response column (the assistant's answer).", "answer")
    prompt_dict_keys: Optional[list[str]] = doc("The prompt column is a dict: the nested keys to its text.", None)
    response_dict_keys: Optional[list[str]] = doc("The response column is a dict: the nested keys to its text.", None)
    messages_key: str = doc("Multi-turn rows: the column of OpenAI-style messages (system, user, assistant with "
                            "optional tool_calls, tool).", "messages")
    tools_key: str = doc("Multi-turn rows: the column of OpenAI tool schemas rendered into the prompt.", "tools")
    enable_thinking_key: str = doc("Multi-turn rows: a per-row enable_thinking flag passed to the chat template.",
                                   "enable_thinking")
    multiturn: MultiturnConfig = field(default_factory=MultiturnConfig)
    max_length: int = doc("Longest sequence in tokens (prompt and all turns).", 1024)
    truncation: str = doc("error | left | right: what to do with a longer conversation.", "error")
    shuffle: bool = True
    seed: Optional[int] = doc("Shuffle seed; null: trainer.seed.", None)
    chat_template: Optional[str] = doc("A Jinja chat template used instead of the tokenizer's.", None)
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    ignore_input_ids_mismatch: bool = doc("A template whose rendering of a conversation's prefix is not a prefix of the "
                                          "whole (e.g. thinking templates that rewrite earlier turns) is refused; "
                                          "true trains on the whole conversation's rendering, masks per message as "
                                          "far as they match.", False)
    custom_cls: CustomClsConfig = field(default_factory=CustomClsConfig)
    tokenizer: Optional[str] = doc("Tokenizer folder; null: the model's.", None)
    # accepted for verl compatibility; no effect here (a note says so)
    balance_dp_token: bool = False
    use_shm: bool = False
    pad_mode: str = doc("verl's right | no_padding: here model.use_remove_padding decides (packed THD or padded).",
                        "no_padding")


@dataclass(frozen=True)
class SFTModelConfig:
    path: Optional[str] = doc("HF model folder (or a folder with a .gguf file); verl's engine SFT key.", None)
    partial_pretrain: Optional[str] = doc("verl fsdp_sft_trainer's name for model.path (set one of the two).", None)
    gguf_file: Optional[str] = None
    tokenizer_path: Optional[str] = None
    trust_remote_code: bool = False
    external_lib: Optional[str] = None
    override_config: dict[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = doc("Full activation recompute in Megatron.", False)
    use_remove_padding: bool = doc("Pack each micro-batch's sequences into one THD sequence (no compute on padding).",
                                   True)
    lora_rank: int = doc("0 only: LoRA SFT is not supported yet.", 0)
    custom_chat_template: Optional[str] = link("data.chat_template")


@dataclass(frozen=True)
class SFTOptimConfig(OptimConfig):
    """optim.*: the Megatron optimizer keys, with verl's SFT defaults."""

    lr: float = 1e-5
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    lr_warmup_steps_ratio: float = 0.1
    lr_decay_style: str = doc("constant | linear | cosine | inverse-square-root | WSD", "cosine")


@dataclass(frozen=True)
class SFTTrainerConfig:
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    default_hdfs_dir: Optional[str] = None
    project_name: str = "gsm8k-sft"
    experiment_name: str = "test"
    total_epochs: int = 4
    total_training_steps: Optional[int] = doc("null: epochs x batches per epoch.", None)
    logger: list[str] = doc("Any of console, jsonl, tensorboard, wandb.", factory=lambda: ["console"])
    seed: int = 1
    save_freq: int = doc("Save a checkpoint (and its huggingface/ export) every N steps and after the last step "
                         "(-1: only after the last step).", -1)
    test_freq: int = doc("val/loss every N steps and after the last step (-1: after the last step only).", -1)
    nnodes: int = 1
    n_gpus_per_node: int = doc("GPUs per node (on CPU: processes per node).", 1)
    max_ckpt_to_keep: Optional[int] = None
    resume_mode: str = doc("auto | disable | resume_path", "auto")
    resume_from_path: Optional[str] = None
    overwrite_existing_run: bool = doc("With resume_mode=disable, delete an earlier run in default_local_dir first.",
                                       False)
    device: str = doc("auto | cuda | cpu", "auto")
    backend: str = doc("local (torchrun, one process per rank: verl's SFT launch) | ray.", "local")
    worker_timeout_s: float = 1800.0
    dist_timeout_s: float = 600.0
    stop_grace_s: float = doc(
        "After SIGTERM/SIGINT, the run finishes the step in flight and saves it; if that takes longer than this "
        "(under torchrun: at most its shutdown timeout less 5 s), it stops at once naming the last good checkpoint. "
        "A second signal stops at once.", 60.0)
    numa_affinity: bool = doc("Pin each GPU worker to the CPU cores of its GPU's NUMA node, as trainer.numa_affinity "
                              "does for RL.", False)
    export_hf: bool = doc("Each saved step also holds huggingface/ (safetensors + config + tokenizer): an RL run "
                          "starts from it with actor_rollout_ref.model.path=.../global_step_N/huggingface.", True)


@dataclass(frozen=True)
class SFTConfig:
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    engine: MegatronConfig = field(default_factory=MegatronConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    ray_kwargs: dict[str, Any] = field(default_factory=lambda: {"ray_init": {"num_cpus": None}})
