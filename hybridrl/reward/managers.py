"""Reward managers: a batch of responses -> token-level rewards, the score on the last response token.

Input DataProto:
  batch         responses [B, R] token ids; response_mask [B, R] (preferred) or attention_mask
                [B, P+R] / [B, R] whose last R columns cover the responses
  non-tensors   <reward_fn_key> (data_source), reward_model ({"ground_truth": ...}), extra_info
                (optional, dict or None), index (optional; shown in error messages)
Output: RewardOutput(reward_tensor [B, R] float32, zero except at each row's LAST valid response token,
which holds the score; reward_extra_info {key: list of B values}).

The response text is the decoded ids from the first response token through the last valid one,
special tokens skipped. A row with no valid response token is scored on "" and its score sits at
position 0.

`naive` calls compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)
per sample; `batch` calls compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=,
**reward_kwargs) once with lists. A result is a number, or a dict with "score" plus extra fields;
extra fields of all samples are gathered into reward_extra_info (None where a sample has no such
field; "score" included). A compute_score that raises, or returns None/NaN/inf/a non-number, is a
RewardFunctionError naming the sample (batch position, index, data_source, the start of the
response, the ground truth), chained to the original exception: never swallowed.

Add a manager:  @register_reward_manager("mine") class Mine(RewardManager): def __call__(self, data): ...
"""
from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from hybridrl.protocol import DataProto
from hybridrl.utils.registry import Registry

from .scoring import default_compute_score, default_compute_score_batch

# The reward tensor is float32: a score beyond this would become +-inf there (finite in Python's float64).
FLOAT32_MAX = float(torch.finfo(torch.float32).max)

__all__ = ["RewardOutput", "RewardFunctionError", "RewardManager", "NaiveRewardManager", "BatchRewardManager",
           "REWARD_MANAGERS", "register_reward_manager", "response_mask_of", "last_valid_positions"]

logger = logging.getLogger(__name__)

REWARD_MANAGERS = Registry("reward manager", key="reward_model.reward_manager")
register_reward_manager = REWARD_MANAGERS.register

PREVIEW_CHARS = 200


class RewardFunctionError(RuntimeError):
    """A reward function failed or returned a non-score; the message names the sample."""


@dataclass
class RewardOutput:
    reward_tensor: torch.Tensor  # [B, R] float32; the score at each row's last valid response token
    reward_extra_info: dict[str, list] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # the step's reward metrics (reward model, judge)


def response_mask_of(data: DataProto) -> torch.Tensor:
    """[B, R] 0/1 mask of the valid response tokens."""
    if "responses" not in data.batch:
        raise KeyError(f"reward manager: the batch has no 'responses' tensor (tensors: {sorted(data.batch)})")
    r = data.batch["responses"].shape[-1]
    if "response_mask" in data.batch:
        mask = data.batch["response_mask"]
    elif "attention_mask" in data.batch and data.batch["attention_mask"].shape[-1] >= r:
        mask = data.batch["attention_mask"][:, -r:]
    else:
        raise KeyError("reward manager: needs 'response_mask' [B, R] or 'attention_mask' [B, P+R] in the batch "
                       f"(tensors: {sorted(data.batch)})")
    if mask.shape != data.batch["responses"].shape:
        raise ValueError(f"reward manager: response mask {tuple(mask.shape)} does not match responses "
                         f"{tuple(data.batch['responses'].shape)}")
    return mask


def last_valid_positions(mask: torch.Tensor) -> torch.Tensor:
    """[B] index of the last nonzero of each row of mask [B, R] (0 for a row without one)."""
    r = mask.shape[-1]
    flipped_first = torch.argmax((mask.flip(-1) != 0).to(torch.int8), dim=-1)
    return torch.where((mask != 0).any(-1), r - 1 - flipped_first, torch.zeros_like(flipped_first))


class RewardManager:
    """Shared plumbing: decoding, sample fields, score checks, placing scores. Subclasses score."""

    # keywords compute_score is called with (checked against custom functions at load time)
    call_keywords: tuple[str, ...] = ("data_source", "solution_str", "ground_truth", "extra_info")
    default_compute_score: Callable = staticmethod(default_compute_score)

    def __init__(self, tokenizer: Any, compute_score: Optional[Callable] = None, reward_fn_key: str = "data_source",
                 reward_kwargs: Optional[dict] = None, num_examine: int = 0) -> None:
        self.tokenizer = tokenizer
        self.compute_score = compute_score or type(self).default_compute_score
        self.reward_fn_key = reward_fn_key
        self.reward_kwargs = dict(reward_kwargs or {})
        self.num_examine = num_examine

    def __call__(self, data: DataProto) -> RewardOutput:
        raise NotImplementedError

    # ----------------------------------------------------------------- inputs
    def decode_responses(self, data: DataProto) -> tuple[list[str], torch.Tensor]:
        """(response strings, last valid position per row [B])."""
        mask = response_mask_of(data)
        last = last_valid_positions(mask)
        has_any = (mask != 0).any(-1)
        responses = data.batch["responses"]
        texts = [self.tokenizer.decode(responses[i, : int(last[i]) + 1].tolist(), skip_special_tokens=True)
                 if has_any[i] else "" for i in range(len(responses))]
        return texts, last

    def sample_fields(self, data: DataProto) -> tuple[list[Any], list[Any], list[Any]]:
        """(data_sources, ground_truths, extra_infos) of the batch."""
        nt = data.non_tensor_batch
        n = len(data)
        for key in (self.reward_fn_key, "reward_model"):
            if key not in nt:
                raise KeyError(f"reward manager: the batch has no non-tensor {key!r} (has {sorted(nt)}); "
                               "it comes from the dataset's columns (verl format)")
        truths = []
        for i, rm in enumerate(nt["reward_model"]):
            if not isinstance(rm, dict) or "ground_truth" not in rm:
                raise RewardFunctionError(f"sample {i} (index={self._index(data, i)}): reward_model is {rm!r:.120}, "
                                          "expected a dict with 'ground_truth'")
            truths.append(rm["ground_truth"])
        extras = list(nt["extra_info"]) if "extra_info" in nt else [None] * n
        extras = [dict(e) if isinstance(e, dict) else e for e in extras]  # the function may mutate its copy
        return list(nt[self.reward_fn_key]), truths, extras

    @staticmethod
    def _index(data: DataProto, i: int) -> Any:
        idx = data.non_tensor_batch.get("index")
        return None if idx is None else idx[i]

    def describe(self, data: DataProto, i: int, source: Any, text: str, truth: Any) -> str:
        preview = text[:PREVIEW_CHARS] + ("..." if len(text) > PREVIEW_CHARS else "")
        return (f"sample {i} (index={self._index(data, i)}, {self.reward_fn_key}={source!r}, "
                f"ground_truth={truth!r:.120}, response[:{PREVIEW_CHARS}]={preview!r})")

    # ----------------------------------------------------------------- outputs
    def check_result(self, result: Any, where: Callable[[], str]) -> tuple[float, Optional[dict]]:
        """(score, extra fields or None) of one compute_score result; RewardFunctionError if it is no score."""
        extras = None
        value = result
        if isinstance(result, dict):
            if "score" not in result:
                raise RewardFunctionError(f"compute_score returned a dict without 'score' (keys {sorted(result)}) "
                                          f"for {where()}")
            extras, value = result, result["score"]
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Real) and not isinstance(value, bool)):
            score = float(value)
        else:
            raise RewardFunctionError(f"compute_score returned {value!r:.80} ({type(value).__name__}), expected a "
                                      f"number or a dict with a numeric 'score', for {where()}")
        if not math.isfinite(score):
            raise RewardFunctionError(f"compute_score returned {score} for {where()}")
        if abs(score) > FLOAT32_MAX:
            raise RewardFunctionError(f"compute_score returned {score}, outside the float32 range of the reward tensor "
                                      f"(|score| <= {FLOAT32_MAX:.4g}; it would become {'-' if score < 0 else ''}inf) "
                                      f"for {where()}")
        return score, extras

    def build_output(self, scores: Sequence[float], extras: Sequence[Optional[dict]], last: torch.Tensor,
                     shape: torch.Size) -> RewardOutput:
        reward = torch.zeros(shape, dtype=torch.float32)
        if len(scores):
            reward[torch.arange(len(scores)), last] = torch.tensor(list(scores), dtype=torch.float32)
        info: dict[str, list] = {}
        if any(e is not None for e in extras):
            keys = list(dict.fromkeys(k for e in extras if e is not None for k in e))
            for k in keys:
                info[k] = [(e.get(k) if e is not None else (s if k == "score" else None))
                           for e, s in zip(extras, scores)]
        return RewardOutput(reward, info)

    def examine(self, data_sources: Sequence[Any], texts: Sequence[str], truths: Sequence[Any],
                scores: Sequence[float]) -> None:
        """Log the first num_examine samples of each data source."""
        if self.num_examine <= 0:
            return
        shown: dict[Any, int] = {}
        for src, text, truth, score in zip(data_sources, texts, truths, scores):
            if shown.get(src, 0) < self.num_examine:
                shown[src] = shown.get(src, 0) + 1
                logger.info("[%s] response=%r ground_truth=%r score=%s", src, text[:PREVIEW_CHARS], truth, score)


@register_reward_manager("naive")
class NaiveRewardManager(RewardManager):
    """compute_score once per sample."""

    def __call__(self, data: DataProto) -> RewardOutput:
        texts, last = self.decode_responses(data)
        sources, truths, extra_infos = self.sample_fields(data)
        scores, extras = [], []
        for i, (src, text, truth, extra) in enumerate(zip(sources, texts, truths, extra_infos)):
            where = lambda i=i, src=src, text=text, truth=truth: self.describe(data, i, src, text, truth)  # noqa: E731
            try:
                result = self.compute_score(data_source=src, solution_str=text, ground_truth=truth, extra_info=extra,
                                            **self.reward_kwargs)
            except Exception as e:
                raise RewardFunctionError(f"compute_score raised {type(e).__name__}: {e} on {where()}") from e
            score, extra_fields = self.check_result(result, where)
            scores.append(score)
            extras.append(extra_fields)
        self.examine(sources, texts, truths, scores)
        return self.build_output(scores, extras, last, data.batch["responses"].shape)


@register_reward_manager("batch")
class BatchRewardManager(RewardManager):
    """compute_score once per batch, with lists; it must return one result per sample."""

    call_keywords = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
    default_compute_score = staticmethod(default_compute_score_batch)

    def __call__(self, data: DataProto) -> RewardOutput:
        texts, last = self.decode_responses(data)
        sources, truths, extra_infos = self.sample_fields(data)
        try:
            results = self.compute_score(data_sources=sources, solution_strs=texts, ground_truths=truths,
                                         extra_infos=extra_infos, **self.reward_kwargs)
        except Exception as e:
            first = self.describe(data, 0, sources[0], texts[0], truths[0]) if texts else "empty batch"
            raise RewardFunctionError(
                f"batched compute_score raised {type(e).__name__}: {e} on a batch of {len(texts)} samples "
                f"({self.reward_fn_key}s {sorted(set(map(str, sources)))}); first {first}") from e
        if isinstance(results, (str, bytes, dict)) or not hasattr(results, "__len__") or len(results) != len(texts):
            got = len(results) if hasattr(results, "__len__") and not isinstance(results, (str, bytes)) else type(results).__name__
            raise RewardFunctionError(f"batched compute_score returned {got} results for {len(texts)} samples; "
                                      "expected a list with one score (or dict with 'score') per sample")
        scores, extras = [], []
        for i, result in enumerate(results):
            where = lambda i=i: self.describe(data, i, sources[i], texts[i], truths[i])  # noqa: E731
            score, extra_fields = self.check_result(result, where)
            scores.append(score)
            extras.append(extra_fields)
        self.examine(sources, texts, truths, scores)
        return self.build_output(scores, extras, last, data.batch["responses"].shape)
