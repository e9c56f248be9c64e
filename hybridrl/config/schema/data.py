"""data.*: prompt datasets (verl's keys and defaults)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .common import CustomClsConfig, doc, link


@dataclass(frozen=True)
class DataConfig:
    tokenizer: Optional[str] = doc("Tokenizer path; defaults to actor_rollout_ref.model.path.", None)
    use_shm: bool = False
    train_files: list[str] = doc(
        "Parquet, Arrow (.arrow/.feather) or jsonl files; a single path or a list.",
        factory=lambda: ["~/data/rlhf/gsm8k/train.parquet"],
    )
    val_files: list[str] = doc("Validation files (same formats).", factory=lambda: ["~/data/rlhf/gsm8k/test.parquet"])
    train_max_samples: int = doc("Keep the first N training rows (-1: all).", -1)
    val_max_samples: int = -1
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: int = 512
    max_response_length: int = 512
    train_batch_size: int = doc("Prompts per training step (before rollout.n samples each).", 1024)
    val_batch_size: Optional[int] = doc("Validation prompts per batch; null: the whole set at once.", None)
    return_raw_input_ids: bool = False
    return_raw_chat: bool = False
    return_full_prompt: bool = False
    shuffle: bool = True
    seed: Optional[int] = None
    dataloader_num_workers: int = 8
    validation_shuffle: bool = False
    filter_overlong_prompts: bool = doc("Drop prompts longer than max_prompt_length (the count is reported).", False)
    filter_overlong_prompts_workers: int = 1
    truncation: str = doc("error | left | right | middle: what to do with a prompt over max_prompt_length.", "error")
    image_key: str = "images"
    video_key: str = "videos"
    trust_remote_code: bool = False
    custom_cls: CustomClsConfig = field(default_factory=CustomClsConfig)
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # verl's key: a tool file whose schemas are rendered into every prompt; null leaves prompts as the data has them
    tool_config_path: Optional[str] = link("actor_rollout_ref.rollout.multi_turn.tool_config_path")
