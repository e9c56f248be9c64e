"""The config of `python -m hybridrl.trainer.main_eval` (verl's evaluation.yaml keys, plus pass@k)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .common import doc
from .critic import CustomRewardFunctionConfig


@dataclass(frozen=True)
class EvalDataConfig:
    path: Optional[str] = doc("Parquet written by main_generation: one row per prompt, a list of responses each.", None)
    prompt_key: str = doc("Prompt column; shown when a reward function fails on a sample.", "prompt")
    last_user_msg_template: Optional[str] = doc("Accepted for verl compatibility; scoring does not use it.", None)
    response_key: str = doc("Column holding each row's list of generated responses (strings).", "responses")
    data_source_key: str = doc("Column naming the scorer and the group metrics are reported under.", "data_source")
    reward_model_key: str = doc("Column of dicts holding `ground_truth`.", "reward_model")
    extra_info_key: str = doc("Column passed to the reward function as extra_info when present.", "extra_info")
    output_path: Optional[str] = doc("Where the results JSON goes; null: next to data.path as <name>.eval.json.", None)


@dataclass(frozen=True)
class EvalRayInitConfig:
    num_cpus: Optional[int] = doc("Accepted for verl compatibility; scoring runs in this process.", None)
    timeline_json_file: Optional[str] = None


@dataclass(frozen=True)
class EvalConfig:
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    ray_init: EvalRayInitConfig = field(default_factory=EvalRayInitConfig)
    pass_threshold: float = doc(
        "A response counts as correct for pass@k when its score >= this; a reward returning a dict with "
        "`acc` is judged by that instead.", 1.0)
