"""reward_model.*: the reward model's layout and micro-batches, how rewards combine (per data source) and the judge.

The result, RewardPlan, is what the trainer and the workers read; nothing below re-reads these keys' raw values.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from .problems import Problems, choices
from .schema.common import LAYOUT_KEYS
from .schema.reward import JudgeConfig, RewardCombineConfig

RM = "reward_model"
COMBINE_MODES = ("replace", "sum", "gate")
JUDGE_BACKENDS = ("engine", "endpoint")
RULE_FIELDS = ("mode", "rule_weight", "model_weight", "judge_weight", "gate_threshold")


@dataclass(frozen=True)
class CombineRule:
    """How one data source's rewards combine (reward_model.combine, with its per_data_source override)."""

    mode: str = "replace"
    rule_weight: float = 1.0
    model_weight: float = 1.0
    judge_weight: float = 1.0
    gate_threshold: float = 1.0

    @property
    def needs_rule(self) -> bool:
        return self.mode != "replace"


@dataclass(frozen=True)
class RewardPlan:
    """The validated reward_model.* of a job. `model`: a reward model worker runs; `judge`: a judge scores."""

    model: bool = False
    layout: Any = None  # the reward model's ParallelLayout (the actor's, in reward_model.megatron.dtype)
    micro_batch_per_gpu: Optional[int] = None
    max_token_len_per_gpu: Optional[int] = None  # dynamic micro-batches of at most this many tokens
    max_length: Optional[int] = None  # re-rendered sequences are cut to this many tokens (null: the batch's width)
    judge: Optional[JudgeConfig] = None
    default_rule: CombineRule = field(default_factory=CombineRule)
    per_source: dict[str, CombineRule] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.model or self.judge is not None

    def rule_for(self, data_source: Any) -> CombineRule:
        return self.per_source.get(str(data_source), self.default_rule)

    def describe(self) -> str:
        parts = [f"reward model (micro-batch {self.micro_batch_per_gpu or 'dynamic'})"] if self.model else []
        parts += [f"judge ({self.judge.backend})"] if self.judge is not None else []
        r = self.default_rule
        rule = f"combine={r.mode}" + (f" rule*{r.rule_weight} model*{r.model_weight} judge*{r.judge_weight}"
                                      if r.mode != "replace" else "")
        return ", ".join(parts + [rule] + ([f"{len(self.per_source)} data source override(s)"] if self.per_source else []))


def _rule(base: CombineRule, values: dict[str, Any], key: str, p: Problems) -> CombineRule:
    unknown = sorted(set(values) - set(RULE_FIELDS))
    if not p.check(not unknown, f"{key}: unknown field(s) {unknown}; the fields are {', '.join(RULE_FIELDS)}"):
        return base
    changes: dict[str, Any] = {}
    for name, value in values.items():
        if name == "mode":
            if choices(f"{key}.mode", value, list(COMBINE_MODES), p):
                changes[name] = value
        elif p.check(isinstance(value, (int, float)) and not isinstance(value, bool),
                     f"{key}.{name}={value!r} must be a number"):
            changes[name] = float(value)
    return dataclasses.replace(base, **changes)


def check_combine(combine: RewardCombineConfig, p: Problems) -> tuple[CombineRule, dict[str, CombineRule]]:
    key = f"{RM}.combine"
    default = _rule(CombineRule(), {k: getattr(combine, k) for k in RULE_FIELDS}, key, p)
    per_source: dict[str, CombineRule] = {}
    for source, values in (combine.per_data_source or {}).items():
        where = f"{key}.per_data_source.{source}"
        if p.check(isinstance(values, dict), f"{where} must be a mapping of {', '.join(RULE_FIELDS)}"):
            per_source[str(source)] = _rule(default, dict(values), where, p)
    return default, per_source


def check_judge(judge: JudgeConfig, p: Problems) -> Optional[JudgeConfig]:
    if not judge.enable:
        return None
    key = f"{RM}.judge"
    choices(f"{key}.backend", judge.backend, list(JUDGE_BACKENDS), p)
    path = judge.prompt_path
    if p.check(bool(path), f"{key}.prompt_path is not set; give a text file with the judge's prompt"):
        p.check(os.path.isfile(os.path.expanduser(path)), f"{key}.prompt_path={path}: no such file")
    if judge.backend == "endpoint":
        p.check(bool(judge.url) and str(judge.url).startswith(("http://", "https://")),
                f"{key}.url={judge.url!r}: the endpoint backend needs an http(s) URL of an OpenAI-compatible server")
        p.check(bool(judge.model), f"{key}.model is not set; name the model the endpoint serves")
    try:
        groups = re.compile(judge.score_pattern).groups
        p.check(groups >= 1, f"{key}.score_pattern={judge.score_pattern!r} has no group; put the score in (...)")
    except re.error as e:
        p.errors.append(f"{key}.score_pattern={judge.score_pattern!r} is not a regular expression: {e}")
    p.check(judge.max_score > judge.min_score, f"{key}.max_score={judge.max_score} must be > min_score={judge.min_score}")
    for name in ("timeout_s", "max_tokens", "concurrency"):
        p.check(getattr(judge, name) > 0, f"{key}.{name}={getattr(judge, name)} must be > 0")
    p.check(judge.max_retries >= 0 and judge.retry_backoff_s >= 0, f"{key}.max_retries and retry_backoff_s must be >= 0")
    choices(f"{key}.on_failure", judge.on_failure, ["error", "skip"], p)
    return judge


def _micro(cfg: Any, dp: int, p: Problems) -> Optional[int]:
    if cfg.micro_batch_size is not None and cfg.micro_batch_size_per_gpu is not None:
        p.errors.append(f"{RM}.micro_batch_size and {RM}.micro_batch_size_per_gpu are both set; keep only "
                        "micro_batch_size_per_gpu")
    if cfg.micro_batch_size_per_gpu is not None:
        p.check(cfg.micro_batch_size_per_gpu >= 1, f"{RM}.micro_batch_size_per_gpu must be >= 1")
        return cfg.micro_batch_size_per_gpu
    if cfg.micro_batch_size is not None:
        if p.check(cfg.micro_batch_size % dp == 0 and cfg.micro_batch_size >= dp,
                   f"{RM}.micro_batch_size={cfg.micro_batch_size} is not a multiple of dp={dp}; set "
                   f"{RM}.micro_batch_size_per_gpu instead"):
            return cfg.micro_batch_size // dp
    return None


def check_reward_model(cfg: Any, actor_megatron: Any, dp: int, p: Problems) -> RewardPlan:
    """reward_model.* of a PPOConfig -> RewardPlan (problems go to `p`, each naming its key)."""
    rm = cfg.reward_model
    default, per_source = check_combine(rm.combine, p)
    judge = check_judge(rm.judge, p)
    if not (rm.enable or judge is not None):
        return RewardPlan(default_rule=default, per_source=per_source)
    micro = tokens = None
    if rm.enable:
        p.check(rm.strategy == "megatron", f"{RM}.strategy={rm.strategy!r}: the reward model runs on megatron-core; set "
                                           "it to megatron")
        p.check(not rm.enable_resource_pool, f"{RM}.enable_resource_pool=true is not supported: the reward model runs "
                                             "in the actor's processes; set it to false")
        for k in LAYOUT_KEYS:
            mine, theirs = getattr(rm.megatron, k), getattr(actor_megatron, k)
            p.check(mine == theirs, f"{RM}.megatron.{k}={mine} differs from actor_rollout_ref.actor.megatron.{k}="
                                    f"{theirs}: the reward model runs in the actor's processes and megatron-core keeps "
                                    "one layout per process; remove the override or make them equal")
        micro = _micro(rm, dp, p)
        if rm.use_dynamic_bsz:
            tokens = rm.forward_max_token_len_per_gpu
            p.check(tokens >= 1, f"{RM}.forward_max_token_len_per_gpu={tokens} must be >= 1")
        elif micro is None:
            p.errors.append(f"{RM}.micro_batch_size_per_gpu is not set; set it (sequences per reward-model forward on "
                            f"one GPU) or {RM}.use_dynamic_bsz=true")
        p.check(rm.max_length is None or rm.max_length >= 2, f"{RM}.max_length={rm.max_length} must be null or >= 2")
        p.check(os.path.isdir(os.path.expanduser(rm.model.path)) or "://" in rm.model.path,
                f"{RM}.model.path={rm.model.path}: no such folder")
    if not rm.enable and (default.model_weight != 1.0 and default.mode != "replace"):
        p.notes.append(f"{RM}.combine.model_weight is set but {RM}.enable=false: there is no reward model score")
    return RewardPlan(model=bool(rm.enable), micro_batch_per_gpu=micro, max_token_len_per_gpu=tokens,
                      max_length=rm.max_length, judge=judge, default_rule=default, per_source=per_source)
