"""An LLM-as-judge reward: the judge's prompt from a file, an answer from a backend, a score parsed out of it.

    judge = LLMJudge.from_config(cfg.reward_model.judge, backend)
    scores, metrics = judge(prompts, responses, ground_truths)     # scores[i] in [0, 1], or None (failed)

The template file's {prompt}, {response} and {ground_truth} are replaced by each sample's (plain replacement,
so other braces in the file stay as they are). The score is the first group of `score_pattern`'s LAST match in
the answer, clipped to [min_score, max_score] and mapped to [0, 1].

Backends (JUDGE_BACKENDS, extensible: @register_judge_backend("name")) answer a list of prompts with a list of
answers, one per prompt: a string, or an Exception for that prompt. `endpoint` (judge_endpoint.py) asks an
OpenAI-compatible server; `engine` generates with the job's own rollout engine (the policy judges, greedily).

Failures are never silent zeros: a prompt whose answer still fails (transport error, timeout, no score in
it) after reward_model.judge.max_retries retries is logged with the sample and counted in `judge/failed`;
on_failure=error stops the step with a JudgeError naming the sample, on_failure=skip returns None for it and
the combiner leaves the judge part out of that sample's reward. Judgements are cached by the exact request
(in memory, and in cache_path's JSON lines when set), so a repeated sample costs no call.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

from hybridrl.config.schema.reward import JudgeConfig
from hybridrl.utils.registry import Registry

log = logging.getLogger(__name__)

JUDGE_BACKENDS = Registry("judge backend", key="reward_model.judge.backend")
register_judge_backend = JUDGE_BACKENDS.register

Answer = Union[str, Exception]
Backend = Callable[[Sequence[str]], list[Answer]]
PREVIEW = 120


class JudgeError(RuntimeError):
    """A judgement failed after its retries and reward_model.judge.on_failure=error."""


class UnparsableAnswer(ValueError):
    """The judge answered, but no score matched reward_model.judge.score_pattern."""


@dataclass
class JudgeTemplate:
    text: str
    source: str = "<string>"

    @classmethod
    def from_file(cls, path: str) -> "JudgeTemplate":
        full = os.path.expanduser(path)
        with open(full, encoding="utf-8") as f:
            text = f.read()
        if "{response}" not in text:
            raise ValueError(f"reward_model.judge.prompt_path={path}: the prompt has no {{response}} placeholder; the "
                             "judge would not see the response")
        return cls(text, full)

    def render(self, prompt: str, response: str, ground_truth: Any) -> str:
        truth = "" if ground_truth is None else str(ground_truth)
        return self.text.replace("{prompt}", prompt).replace("{response}", response).replace("{ground_truth}", truth)


class JudgeCache:
    """Judgements by request key, in memory and (when `path` is set) appended to a JSON-lines file."""

    def __init__(self, path: Optional[str] = None) -> None:
        self.path = os.path.expanduser(path) if path else None
        self.entries: dict[str, float] = {}
        self._lock = threading.Lock()
        if self.path and os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if line:
                        row = json.loads(line)
                        self.entries[row["key"]] = float(row["score"])

    def get(self, key: str) -> Optional[float]:
        return self.entries.get(key)

    def put(self, key: str, score: float) -> None:
        with self._lock:
            self.entries[key] = score
            if self.path:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": key, "score": score}) + "\n")


class LLMJudge:
    def __init__(self, cfg: JudgeConfig, backend: Backend, template: JudgeTemplate, identity: str = "",
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.cfg = cfg
        self.backend = backend
        self.template = template
        self.identity = identity  # what, besides the prompt, makes a judgement (backend, model, sampling)
        self.cache = JudgeCache(cfg.cache_path)
        self.pattern = re.compile(cfg.score_pattern)
        self.sleep = sleep

    @classmethod
    def from_config(cls, cfg: JudgeConfig, backend: Backend) -> "LLMJudge":
        identity = json.dumps([cfg.backend, cfg.model, cfg.url if cfg.backend == "endpoint" else None, cfg.max_tokens,
                               cfg.temperature, cfg.score_pattern, cfg.min_score, cfg.max_score])
        return cls(cfg, backend, JudgeTemplate.from_file(cfg.prompt_path), identity)

    def key(self, request: str) -> str:
        return hashlib.sha256((self.identity + "\0" + request).encode("utf-8")).hexdigest()

    def parse(self, answer: str) -> float:
        """The answer's score mapped to [0, 1]; UnparsableAnswer when none is found."""
        matches = self.pattern.findall(answer)
        if not matches:
            raise UnparsableAnswer(f"no match of score_pattern {self.cfg.score_pattern!r} in {answer[:PREVIEW]!r}")
        last = matches[-1]
        value = float(last[0] if isinstance(last, tuple) else last)
        lo, hi = self.cfg.min_score, self.cfg.max_score
        return (min(max(value, lo), hi) - lo) / (hi - lo)

    def __call__(self, prompts: Sequence[str], responses: Sequence[str],
                 ground_truths: Sequence[Any]) -> tuple[list[Optional[float]], dict[str, float]]:
        start = time.perf_counter()
        requests = [self.template.render(p, r, g) for p, r, g in zip(prompts, responses, ground_truths)]
        keys = [self.key(q) for q in requests]
        scores: list[Optional[float]] = [self.cache.get(k) for k in keys]
        hits = sum(s is not None for s in scores)
        todo = [i for i, s in enumerate(scores) if s is None]
        errors: dict[int, Exception] = {}
        retries = 0
        for attempt in range(self.cfg.max_retries + 1):
            if not todo:
                break
            if attempt:
                retries += len(todo)
                self.sleep(self.cfg.retry_backoff_s * 2 ** (attempt - 1))
            answers = self.backend([requests[i] for i in todo])
            if len(answers) != len(todo):
                raise JudgeError(f"judge backend {self.cfg.backend!r} answered {len(answers)} of {len(todo)} prompts")
            failed = []
            for i, answer in zip(todo, answers):
                try:
                    if isinstance(answer, Exception):
                        raise answer
                    scores[i] = self.parse(answer)
                    self.cache.put(keys[i], scores[i])
                    errors.pop(i, None)
                except Exception as e:  # transport errors, timeouts and unparsable answers are retried alike
                    errors[i] = e
                    failed.append(i)
            todo = failed
        for i in todo:
            self._failed(i, responses[i], errors[i])
        metrics = {"judge/requests": float(len(requests) - hits), "judge/cache_hits": float(hits),
                   "judge/retries": float(retries), "judge/failed": float(len(todo)),
                   "timing_s/judge": time.perf_counter() - start}
        return scores, metrics

    def _failed(self, i: int, response: str, error: Exception) -> None:
        where = (f"sample {i}: the judge ({self.cfg.backend}) failed after {self.cfg.max_retries} retries: "
                 f"{type(error).__name__}: {error} (response[:{PREVIEW}]={response[:PREVIEW]!r})")
        if self.cfg.on_failure == "error":
            raise JudgeError(where + "; reward_model.judge.on_failure=skip leaves such samples' judge part out")
        log.warning("%s; left out of its reward (reward_model.judge.on_failure=skip, counted in judge/failed)", where)


@register_judge_backend("engine")
class EngineJudge:
    """The job's rollout engine answers (greedy, one answer per prompt): `generate(DataProto) -> DataProto`.

    The judge prompt goes through the policy tokenizer's chat template; the answer is as long as the rollout's
    response length at most (data.max_response_length), and the prompt must fit the engine's context."""

    def __init__(self, cfg: JudgeConfig, *, tokenizer: Any, generate: Callable[[Any], Any], max_prompt_length: int,
                 **_: Any) -> None:
        self.tokenizer = tokenizer
        self.generate = generate
        self.max_prompt_length = max_prompt_length

    def __call__(self, prompts: Sequence[str]) -> list[Answer]:
        import torch

        from hybridrl.data.prompt import left_pad, position_ids_from_mask
        from hybridrl.protocol import DataProto

        answers: list[Answer] = [ValueError("not asked")] * len(prompts)
        rows, ids_list = [], []
        for i, text in enumerate(prompts):
            rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                          add_generation_prompt=True, tokenize=False)
            ids = self.tokenizer(rendered, add_special_tokens=False)["input_ids"]
            if len(ids) > self.max_prompt_length:
                answers[i] = ValueError(f"the judge prompt has {len(ids)} tokens, more than the rollout engine's "
                                        f"prompt length {self.max_prompt_length} (data.max_prompt_length)")
                continue
            rows.append(i)
            ids_list.append(ids)
        if not rows:
            return answers
        pad = self.tokenizer.pad_token_id
        padded = [left_pad(ids, self.max_prompt_length, pad) for ids in ids_list]
        input_ids = torch.stack([p[0] for p in padded])
        mask = torch.stack([p[1] for p in padded])
        batch = DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask,
                                     "position_ids": position_ids_from_mask(mask)},
                                    meta_info={"greedy": True, "validate": True})
        out = self.generate(batch)
        responses, rmask = out.batch["responses"], out.batch["response_mask"]
        for j, i in enumerate(rows):
            n = int(rmask[j].sum())
            answers[i] = self.tokenizer.decode(responses[j, :n].tolist(), skip_special_tokens=True)
        return answers


def build_judge(cfg: JudgeConfig, **context: Any) -> LLMJudge:
    """The judge of reward_model.judge; `context` gives what backends need (tokenizer, generate, ...)."""
    from . import judge_endpoint  # noqa: F401  (registers the endpoint backend)

    backend = JUDGE_BACKENDS.get(cfg.backend)(cfg, **context)
    return LLMJudge.from_config(cfg, backend)
