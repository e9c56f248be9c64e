"""Driver-side steps of a PPO/GRPO iteration that are plain tensor work on the gathered batch.

Kept apart from the loop so each is one small function with a unit test: group ids, balancing rows
over data-parallel ranks, rewards into the batch, KL in the reward, rollout correction, advantages,
validation scores.
"""
from __future__ import annotations

import math
import uuid
from collections import defaultdict
from typing import Any, Optional

import numpy as np
import torch

from hybridrl.algos import (
    AdvantageInputs,
    AdvantageParams,
    RolloutCorrection,
    apply_kl_penalty,
    compute_advantage,
    rollout_correction,
)
from hybridrl.protocol import DataProto


def add_group_ids(prompts: DataProto) -> DataProto:
    """A `uid` per prompt, shared by its n samples after generation (GRPO/RLOO groups)."""
    uids = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
    return prompts.union(DataProto.from_dict(non_tensors={"uid": uids}))


def balance_order(token_counts: list[int], parts: int, sort_by_length: bool = False) -> list[int]:
    """A row order that gives each of `parts` consecutive equal chunks a similar token total.

    Greedy longest-first into the lightest chunk that still has room (chunks hold len/parts rows),
    so every dp rank gets the same number of rows and nearly the same number of tokens. Within a chunk the
    rows keep their rollout order, so a GRPO group stays in one mini-batch; `sort_by_length` orders them as
    verl 0.9.1 does instead (`length_interleaved`), also with one chunk.
    """
    n = len(token_counts)
    if n % max(parts, 1):
        return list(range(n))
    size = n // max(parts, 1)
    bins: list[list[int]] = [[] for _ in range(max(parts, 1))]
    loads = [0] * len(bins)
    for i in sorted(range(n), key=lambda i: -token_counts[i]):
        k = min((k for k in range(len(bins)) if len(bins[k]) < size), key=lambda k: loads[k])
        bins[k].append(i)
        loads[k] += token_counts[i]
    return [i for b in bins for i in (length_interleaved(b, token_counts) if sort_by_length else sorted(b))]


def length_interleaved(rows: list[int], token_counts: list[int]) -> list[int]:
    """verl's order within one dp rank (ray_trainer._balance_batch): rows sorted by length, every other one
    ascending, then the rest descending, so short micro-batches sit at both ends. Alternate ranks send a sample
    to the first or the second half about at random: two mini-batches each get about half of every GRPO group."""
    ranked = sorted(rows, key=lambda i: (token_counts[i], i))
    return ranked[::2] + ranked[1::2][::-1]


def balance_batch(batch: DataProto, dp_size: int, sort_by_length: bool = False) -> tuple[DataProto, dict[str, float]]:
    tokens = batch.batch["attention_mask"].sum(-1).tolist()
    order = balance_order(tokens, dp_size, sort_by_length)
    if dp_size > 1 and len(batch) % dp_size == 0:
        per_rank = np.add.reduceat(np.asarray(tokens)[order], np.arange(0, len(batch), len(batch) // dp_size))
        metrics = {"balance/max_over_mean_tokens": float(per_rank.max() / max(per_rank.mean(), 1))}
    else:
        metrics = {}
    return batch.reorder(order), metrics


def with_scores(batch: DataProto, reward_tensor: torch.Tensor, extra: dict[str, list]) -> DataProto:
    """token_level_scores [B, R] (the score on each response's last token) plus per-sample extras."""
    out = batch.union(DataProto.from_dict({"token_level_scores": reward_tensor.to(torch.float32)}))
    for k, v in extra.items():
        if len(v) == len(batch):
            out.non_tensor_batch[f"reward_extra/{k}"] = np.asarray(v, dtype=object)
    return out


def rewards_with_kl(batch: DataProto, use_kl_in_reward: bool, controller: Any, kind: str) -> tuple[DataProto, dict]:
    """token_level_rewards: the scores, minus beta * KL(actor || ref) per token when use_kl_in_reward."""
    scores = batch.batch["token_level_scores"]
    if not use_kl_in_reward:
        return batch.union(DataProto.from_dict({"token_level_rewards": scores})), {}
    rewards, metrics = apply_kl_penalty(scores, batch.batch["old_log_probs"], batch.batch["ref_log_prob"],
                                        batch.batch["response_mask"], controller, kind)
    return batch.union(DataProto.from_dict({"token_level_rewards": rewards})), metrics


def rollout_log_probs_as_old(batch: DataProto) -> DataProto:
    """bypass_mode: the rollout engine's log-probs stand in for the old policy's (no old-log-prob pass)."""
    if "rollout_log_probs" not in batch.batch:
        raise KeyError("algorithm.rollout_correction.bypass_mode=true needs rollout_log_probs in the batch; set "
                       "actor_rollout_ref.rollout.calculate_log_probs=true")
    return batch.union(DataProto.from_dict({"old_log_probs": batch.batch["rollout_log_probs"]}))


def with_rollout_correction(batch: DataProto, spec: RolloutCorrection) -> tuple[DataProto, dict[str, float]]:
    """rollout_is_weights (with rollout_is) and response_mask without the rejected tokens (with rollout_rs), from
    old_log_probs vs rollout_log_probs; plus the rollout_corr/* metrics."""
    b = batch.batch
    out = rollout_correction(b["old_log_probs"], b["rollout_log_probs"], b["response_mask"], spec)
    tensors = {"response_mask": out.response_mask.to(b["response_mask"].dtype)}
    if out.weights is not None:
        tensors["rollout_is_weights"] = out.weights.to(b["old_log_probs"].dtype)
    kept = {k: v for k, v in b.items() if k not in tensors}
    return DataProto({**kept, **tensors}, dict(batch.non_tensor_batch), dict(batch.meta_info)), out.metrics


def reward_components(batch: DataProto, keys: tuple[str, ...]) -> Optional[dict[str, torch.Tensor]]:
    """{key: [B] float} of the reward function's dict fields `keys` (gdpo); None without keys."""
    if not keys:
        return None
    have = sorted(k.split("/", 1)[1] for k in batch.non_tensor_batch if k.startswith("reward_extra/"))
    missing = [k for k in keys if f"reward_extra/{k}" not in batch.non_tensor_batch]
    if missing:
        raise KeyError(f"algorithm.gdpo_reward_keys {missing}: the reward function's results have no such fields "
                       f"(they have {have or 'none: it returns numbers'}); return a dict with these keys")
    return {k: torch.tensor(np.asarray(batch.non_tensor_batch[f"reward_extra/{k}"], dtype=np.float64),
                            dtype=torch.float32) for k in keys}


def advantages(batch: DataProto, estimator: str, params: AdvantageParams,
               reward_baselines: Optional[torch.Tensor] = None) -> DataProto:
    b = batch.batch
    inputs = AdvantageInputs(
        token_level_rewards=b["token_level_rewards"],
        response_mask=b["response_mask"],
        values=b.get("values"),
        index=batch.non_tensor_batch.get("uid"),
        reward_baselines=reward_baselines,
        old_log_probs=b.get("old_log_probs"),
        sum_pi_squared=b.get("sum_pi_squared"),
        rollout_is_weights=b.get("rollout_is_weights"),
        reward_components=reward_components(batch, params.gdpo_reward_keys),
    )
    out = compute_advantage(estimator, inputs, params)
    return batch.union(DataProto.from_dict({"advantages": out.advantages, "returns": out.returns}))


def validation_metrics(sources: list[str], scores: list[float], n: int, lengths: list[int],
                       extras: Optional[dict[str, list]] = None) -> dict[str, float]:
    """verl's val-core/{data_source}/reward/mean@n per source (val-aux/{data_source}/{key}/mean@n for the
    numeric extras a reward function returns, e.g. acc), plus val/score over all sources and lengths."""
    by_source: dict[str, list[float]] = defaultdict(list)
    for s, x in zip(sources, scores):
        by_source[str(s)].append(float(x))
    metrics = {f"val-core/{s}/reward/mean@{n}": float(np.mean(v)) for s, v in sorted(by_source.items())}
    for key, values in (extras or {}).items():
        grouped: dict[str, list[float]] = defaultdict(list)
        for s, v in zip(sources, values):
            if isinstance(v, (int, float, bool, np.number)) and not isinstance(v, str):
                grouped[str(s)].append(float(v))
        metrics.update({f"val-aux/{s}/{key}/mean@{n}": float(np.mean(v)) for s, v in sorted(grouped.items())})
    metrics["val/score"] = float(np.mean(scores)) if scores else math.nan
    metrics["val/response_length/mean"] = float(np.mean(lengths)) if lengths else math.nan
    return metrics


def agent_metrics(tool_calls: Any, turns: Any, prefix: str = "agent") -> dict[str, float]:
    """Whole-batch agent-loop counts from the per-sample agent_tool_calls / agent_turns (the metrics a rollout
    reports in meta_info are one replica's); {} for single-turn batches."""
    if tool_calls is None or len(tool_calls) == 0:
        return {}
    calls, turns = np.asarray(tool_calls, dtype=float), np.asarray(turns, dtype=float)
    return {f"{prefix}/tool_calls_per_sample": float(calls.mean()), f"{prefix}/tool_call_rate": float((calls > 0).mean()),
            f"{prefix}/turns_per_sample": float(turns.mean())}


def first_nonfinite(metrics: dict[str, float], keys: tuple[str, ...]) -> Optional[str]:
    for k in keys:
        v = metrics.get(k)
        if v is not None and not math.isfinite(float(v)):
            return k
    return None
