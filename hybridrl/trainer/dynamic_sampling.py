"""Where the trainer's batches come from: one generated and scored batch per training step, with DAPO's
dynamic sampling (algorithm.filter_groups) when it is on.

A prompt group whose samples all get the same value of filter_groups.metric teaches nothing to a
group-relative estimator (its advantages are all 0). With filtering on, such groups are dropped and
further batches of prompts are generated and scored until data.train_batch_size groups are kept (a
group of one is always kept); the surplus is cut so the step trains on exactly train_batch_size *
rollout.n samples (whole groups). After filter_groups.max_num_gen_batches generation batches (> 0) without enough
groups the step fails, as in verl's DAPO recipe. Metrics: train/num_gen_batches (generation batches
this step took), train/kept_groups_fraction (kept / generated groups over those batches); the
generation metrics a batch carries in meta_info["metrics"] are passed on (the last batch's).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

from hybridrl.protocol import DataProto

if TYPE_CHECKING:
    from .sampling import Sampler

SCORE_METRICS = ("reward", "seq_reward", "seq_final_reward")  # the summed score (KL in reward is applied later)


@dataclass
class Rollout:
    """The samples of one training step, generated and scored."""

    batch: DataProto
    epoch: int
    metrics: dict[str, float] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)  # seconds: gen, reward


def groups_with_signal(values: Sequence[float], uids: Sequence[Any]) -> tuple[list[int], int, int]:
    """(rows of the groups whose values are not all equal, or that have one member; kept groups; all groups).

    Rows keep their order. Equality is exact, as verl's std > 0 test.
    """
    by_uid: dict[Any, list[int]] = {}
    for row, uid in enumerate(uids):
        by_uid.setdefault(uid, []).append(row)
    kept = [rows for rows in by_uid.values() if len(rows) == 1 or len({float(values[r]) for r in rows}) > 1]
    keep = sorted(r for rows in kept for r in rows)
    return keep, len(kept), len(by_uid)


def filter_values(batch: DataProto, metric: str) -> list[float]:
    """Per-sample values of filter_groups.metric: the summed score, or a field of the reward function's dict."""
    if metric in SCORE_METRICS:
        return batch.batch["token_level_scores"].sum(-1).tolist()
    key = f"reward_extra/{metric}"
    if key not in batch.non_tensor_batch:
        extras = sorted(k.split("/", 1)[1] for k in batch.non_tensor_batch if k.startswith("reward_extra/"))
        raise KeyError(f"algorithm.filter_groups.metric={metric}: the reward function returned no {metric!r} field "
                       f"(its fields: {extras or 'none: it returns a number'}); use reward or one of those")
    return [float(v) for v in batch.non_tensor_batch[key]]


class RolloutStream:
    """Iterates Rollouts for `steps` training steps starting after `start_step`, each generated on the weights
    after the updates of the steps before it (version step - 1) and scored by `sampler`."""

    def __init__(self, prompts: Iterator[DataProto], sampler: "Sampler", *, start_step: int, steps: int,
                 train_batch_size: int, filter_metric: Optional[str] = None, max_num_gen_batches: int = 0) -> None:
        self.prompts, self.sampler = prompts, sampler
        self.start_step, self.steps = start_step, steps
        self.groups = train_batch_size
        self.metric, self.max_gen = filter_metric, max_num_gen_batches

    def __iter__(self) -> Iterator[Rollout]:
        for step in range(self.start_step + 1, self.start_step + self.steps + 1):
            rollout = self.collect(step)
            if rollout is None:
                return
            yield rollout

    def loader_state(self) -> None:
        """Nothing is drawn ahead of the step just yielded: checkpoints record the loader's own state."""
        return None

    def collect(self, step: int) -> Optional[Rollout]:
        """The scored samples of `step` (None when the prompts run out)."""
        timing: dict[str, float] = {"gen": 0.0, "reward": 0.0}
        metrics: dict[str, float] = {}
        kept: list[DataProto] = []
        kept_groups = seen_groups = draws = 0
        while True:
            prompts = next(self.prompts, None)
            if prompts is None:
                return None
            start = time.perf_counter()
            batch = self.sampler.generate(prompts, step, draws, version=step - 1)
            metrics.update(batch.meta_info.pop("metrics", {}))
            timing["gen"] += time.perf_counter() - start
            start = time.perf_counter()
            batch = self.sampler.score(batch)
            timing["reward"] += time.perf_counter() - start
            draws += 1
            epoch = prompts.meta_info.get("epoch", 0)
            if self.metric is None:
                return Rollout(batch, epoch, metrics, timing)
            rows, groups, total = groups_with_signal(filter_values(batch, self.metric), batch.non_tensor_batch["uid"])
            kept_groups, seen_groups = kept_groups + groups, seen_groups + total
            if rows:
                kept.append(batch[rows])
            if kept_groups >= self.groups:
                break
            if 0 < self.max_gen <= draws:
                raise RuntimeError(f"step {step}: {draws} generation batches gave {kept_groups} prompt groups with "
                                   f"different {self.metric!r} values, fewer than data.train_batch_size="
                                   f"{self.groups}; the data may be too hard or too easy. Raise "
                                   "algorithm.filter_groups.max_num_gen_batches (<= 0: no limit)")
        batch = first_groups(DataProto.concat(kept) if len(kept) > 1 else kept[0], self.groups)
        metrics.update({"train/num_gen_batches": float(draws), "train/kept_groups_fraction": kept_groups / seen_groups})
        return Rollout(batch, epoch, metrics, timing)


def first_groups(batch: DataProto, groups: int) -> DataProto:
    """The rows of the first `groups` uids (in order of first appearance): whole groups, the surplus cut."""
    chosen: dict[Any, None] = {}
    for uid in batch.non_tensor_batch["uid"]:
        if len(chosen) == groups:
            break
        chosen.setdefault(uid, None)
    return batch[[i for i, uid in enumerate(batch.non_tensor_batch["uid"]) if uid in chosen]]
