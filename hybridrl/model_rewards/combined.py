"""Rule, reward-model and judge scores -> one reward per sample, by data source (reward_model.combine).

    reward_fn = CombinedReward(plan, rule=manager, model=score_fn, judge=judge, tokenizer=tokenizer)
    out = reward_fn(batch)      # RewardOutput: the combined score at each response's last valid token

Per sample, with the rule of its data source (RewardPlan.rule_for):
    replace   model score (+ judge score): verl's behaviour, where a reward model's score replaces the rule reward
              and the rule scorer is not called for that sample
    sum       rule_weight*rule + model_weight*model + judge_weight*judge
    gate      rule_weight*rule, plus model_weight*model + judge_weight*judge only where rule >= gate_threshold
The model and judge parts count only where they are enabled; a judgement that failed (on_failure=skip) leaves the
judge part out of that one sample (counted in judge/failed, logged by the judge).

`model` is any callable DataProto -> [B] scores (the reward model worker group behind RewardInputs, or a test's
own function). Reported per sample in reward_extra_info: rule_score, rm_score, judge_score (None where not
computed), and the rule manager's own extra fields; metrics (RewardOutput.metrics): reward_model/* and judge/*.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional, Sequence

import torch

from hybridrl.config.reward_checks import CombineRule, RewardPlan
from hybridrl.protocol import DataProto
from hybridrl.reward.managers import RewardManager, RewardOutput, last_valid_positions, response_mask_of

ModelScorer = Callable[[DataProto], torch.Tensor]


def combine(rule: CombineRule, rule_score: Optional[float], model_score: Optional[float],
            judge_score: Optional[float]) -> float:
    """One sample's reward (see the module doc); None parts are left out."""
    model_part = 0.0
    if model_score is not None:
        model_part += (1.0 if rule.mode == "replace" else rule.model_weight) * model_score
    if judge_score is not None:
        model_part += (1.0 if rule.mode == "replace" else rule.judge_weight) * judge_score
    if rule.mode == "replace":
        return model_part
    base = rule.rule_weight * float(rule_score or 0.0)
    if rule.mode == "gate" and not (rule_score is not None and rule_score >= rule.gate_threshold):
        return base
    return base + model_part


class CombinedReward:
    def __init__(self, plan: RewardPlan, *, rule: Optional[RewardManager], tokenizer: Any,
                 model: Optional[ModelScorer] = None, judge: Optional[Any] = None,
                 reward_fn_key: str = "data_source") -> None:
        if plan.model != (model is not None):
            raise ValueError("CombinedReward: a reward model scorer is given exactly when reward_model.enable=true")
        self.plan, self.rule, self.model, self.judge = plan, rule, model, judge
        self.tokenizer = tokenizer
        self.reward_fn_key = reward_fn_key

    def __call__(self, data: DataProto) -> RewardOutput:
        n = len(data)
        sources = list(data.non_tensor_batch[self.reward_fn_key]) if self.reward_fn_key in data.non_tensor_batch \
            else [None] * n
        rules = [self.plan.rule_for(s) for s in sources]
        metrics: dict[str, float] = {}
        rule_scores, rule_extra = self._rule_scores(data, rules)
        model_scores: list[Optional[float]] = [None] * n
        if self.model is not None:
            start = time.perf_counter()
            model_scores = [float(x) for x in self.model(data).tolist()]
            metrics["timing_s/reward_model"] = time.perf_counter() - start
            metrics["reward_model/score_mean"] = sum(model_scores) / max(n, 1)
            metrics.update(getattr(self.model, "last_metrics", {}))
            bad = [i for i, x in enumerate(model_scores) if not math.isfinite(x)]
            if bad:
                raise RuntimeError(f"reward model: non-finite scores for samples {bad[:8]} of {n}")
        judge_scores: list[Optional[float]] = [None] * n
        if self.judge is not None:
            judge_scores, judge_metrics = self.judge(self._prompt_texts(data), self._response_texts(data),
                                                     self._ground_truths(data))
            metrics.update(judge_metrics)
        scores = [combine(r, a, b, c) for r, a, b, c in zip(rules, rule_scores, model_scores, judge_scores)]
        last = last_valid_positions(response_mask_of(data))
        reward = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        if n:
            reward[torch.arange(n), last] = torch.tensor(scores, dtype=torch.float32)
        info = {**rule_extra, "rule_score": rule_scores, "rm_score": model_scores, "judge_score": judge_scores}
        info = {k: v for k, v in info.items() if any(x is not None for x in v)}
        return RewardOutput(reward, info, metrics)

    # ----------------------------------------------------------------- parts
    def _rule_scores(self, data: DataProto, rules: Sequence[CombineRule]) -> tuple[list[Optional[float]], dict]:
        """The rule manager's score of the samples whose combine rule uses it (None for the others)."""
        rows = [i for i, r in enumerate(rules) if r.needs_rule]
        scores: list[Optional[float]] = [None] * len(rules)
        extra: dict[str, list] = {}
        if not rows or self.rule is None:
            return scores, extra
        out = self.rule(data if len(rows) == len(rules) else data[rows])
        summed = out.reward_tensor.sum(-1).tolist()
        for j, i in enumerate(rows):
            scores[i] = summed[j]
        for key, values in out.reward_extra_info.items():
            if key in ("score",):
                continue
            column: list = [None] * len(rules)
            for j, i in enumerate(rows):
                column[i] = values[j]
            extra[key] = column
        return scores, extra

    def _response_texts(self, data: DataProto) -> list[str]:
        mask = response_mask_of(data)
        last, has_any = last_valid_positions(mask), (mask != 0).any(-1)
        responses = data.batch["responses"]
        return [self.tokenizer.decode(responses[i, : int(last[i]) + 1].tolist(), skip_special_tokens=True)
                if has_any[i] else "" for i in range(len(data))]

    def _prompt_texts(self, data: DataProto) -> list[str]:
        """The last user message of each prompt (raw_prompt), else the decoded prompt tokens."""
        raw = data.non_tensor_batch.get("raw_prompt")
        if raw is not None:
            return [next((m["content"] for m in reversed(list(msgs)) if m.get("role") == "user"), "") for msgs in raw]
        prompts = data.batch["prompts"]
        return [self.tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in prompts]

    def _ground_truths(self, data: DataProto) -> list[Any]:
        rm = data.non_tensor_batch.get("reward_model")
        if rm is None:
            return [None] * len(data)
        return [x.get("ground_truth") if isinstance(x, dict) else None for x in rm]


class WorkerScorer:
    """The reward model worker group behind RewardInputs: DataProto of samples -> [B] scores."""

    def __init__(self, group: Any, inputs: Any) -> None:
        self.group, self.inputs = group, inputs
        self.last_metrics: dict[str, float] = {}

    def __call__(self, data: DataProto) -> torch.Tensor:
        out = self.group.compute_rm_score(self.inputs(data))
        self.last_metrics = dict(out.meta_info.get("metrics", {}))  # memory/reward_peak_bytes on GPU
        if self.inputs.rerenders:
            self.last_metrics["reward_model/truncated"] = float(self.inputs.truncated)
        return out.batch["rm_score"].float()


def build_combined_reward(run: Any, rule: RewardManager, tokenizer: Any, *, rm_group: Any = None, rm_dir: str = "",
                          generate: Optional[Callable[[DataProto], DataProto]] = None) -> Any:
    """The job's reward function: `rule` alone unless reward_model.enable or reward_model.judge.enable."""
    plan, cfg = run.derived.reward, run.cfg
    if not plan.enabled:
        return rule
    model = None
    if plan.model:
        from hybridrl.data.tokenizer import load_tokenizer

        from .rm_inputs import RewardInputs, tokenizers_differ

        rm_cfg = cfg.reward_model.model
        rm_tokenizer = None
        if rm_cfg.input_tokenizer:
            policy = tokenizer if rm_cfg.input_tokenizer == cfg.actor_rollout_ref.model.path else \
                load_tokenizer(rm_cfg.input_tokenizer, trust_remote_code=rm_cfg.trust_remote_code)
            theirs = load_tokenizer(rm_dir or rm_cfg.path, trust_remote_code=rm_cfg.trust_remote_code)
            rm_tokenizer = theirs if tokenizers_differ(policy, theirs) else None
            tokenizer_for_inputs = policy
        else:
            tokenizer_for_inputs = tokenizer
        inputs = RewardInputs(tokenizer_for_inputs, rm_tokenizer, plan.max_length,
                              chat_kwargs=cfg.data.apply_chat_template_kwargs)
        model = WorkerScorer(rm_group, inputs)
    judge = None
    if plan.judge is not None:
        from .judge import build_judge

        judge = build_judge(plan.judge, tokenizer=tokenizer, generate=generate,
                            max_prompt_length=cfg.data.max_prompt_length)
    return CombinedReward(plan, rule=rule, tokenizer=tokenizer, model=model, judge=judge,
                          reward_fn_key=cfg.data.reward_fn_key)
