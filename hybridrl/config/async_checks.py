"""async_training.*: the fully asynchronous mode's settings, checked once, and the sizes it derives (AsyncPlan).

Units: a *group* is one prompt with its rollout.n samples (GRPO's unit, verl's "sample"); a *version* is the number
of actor updates the weights have had; a *sync* pushes the actor's weights to the rollout every
trigger_parameter_sync_step steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .problems import Problems
from .schema import PPOConfig

AT = "async_training"
RC = "algorithm.rollout_correction"


@dataclass(frozen=True)
class AsyncPlan:
    groups_per_step: int  # require_batches x ppo_mini_batch_size (= data.train_batch_size)
    sync_every: int  # trainer steps between weight syncs
    staleness_threshold: float
    partial_rollout: bool
    segment_tokens: int
    queue_samples_dir: str

    @property
    def max_stale_syncs(self) -> int:
        """How many syncs older than the trainer's weights a sample's oldest token may be."""
        return math.ceil(self.staleness_threshold)

    @property
    def max_lag(self) -> int:
        """The same bound in versions (updates): a window's samples train over sync_every steps."""
        return (self.max_stale_syncs + 1) * self.sync_every - 1

    @property
    def window_groups(self) -> int:
        """verl's rollout_num: the groups the rollout may start between two syncs (before subtracting stale ones)."""
        return math.ceil((1 + self.staleness_threshold) * self.sync_every * self.groups_per_step)

    def describe(self) -> str:
        mode = "partial rollout" if self.partial_rollout else "in-flight requests finish before a sync"
        return (f"fully async: {self.groups_per_step} prompt groups a step, weights synced every {self.sync_every} "
                f"step(s), at most {self.window_groups} groups started per sync window, samples at most "
                f"{self.max_stale_syncs} sync(s) ({self.max_lag} updates) old, {mode}")


def check_async(cfg: PPOConfig, p: Problems) -> AsyncPlan | None:
    a, ara = cfg.async_training, cfg.actor_rollout_ref
    if not a.enable:
        return None
    p.check(a.staleness_threshold >= 0, f"{AT}.staleness_threshold={a.staleness_threshold} must be >= 0")
    p.check(a.trigger_parameter_sync_step >= 1,
            f"{AT}.trigger_parameter_sync_step={a.trigger_parameter_sync_step} must be >= 1")
    p.check(a.require_batches >= 1, f"{AT}.require_batches={a.require_batches} must be >= 1")
    p.check(a.segment_tokens >= 1, f"{AT}.segment_tokens={a.segment_tokens} must be >= 1")
    groups = a.require_batches * ara.actor.ppo_mini_batch_size
    p.check(cfg.data.train_batch_size == groups,
            f"{AT}.enable=true: a trainer step takes {AT}.require_batches x {ARA_MINI} = {a.require_batches} x "
            f"{ara.actor.ppo_mini_batch_size} = {groups} prompts; set data.train_batch_size={groups} (verl leaves it 0)")
    p.check(a.use_rollout_log_probs, f"{AT}.use_rollout_log_probs=false is not supported: a stale sample's "
                                     "behaviour policy is the rollout's log-prob of each token's version")
    p.check(ara.rollout.calculate_log_probs, f"{AT}.enable=true needs the rollout's log-probs: set "
                                             f"actor_rollout_ref.rollout.calculate_log_probs=true")
    bypass = cfg.algorithm.rollout_correction.bypass_mode
    if a.compute_prox_log_prob:
        p.check(not bypass, f"{AT}.compute_prox_log_prob=true recomputes old log-probs, {RC}.bypass_mode=true skips "
                            "that pass; keep one")
    else:
        p.check(bypass, f"{AT}.compute_prox_log_prob=false (verl's default: no old-log-prob pass) needs "
                        f"{RC}.bypass_mode=true; or set {AT}.compute_prox_log_prob=true to weight each token by "
                        f"{RC} against the rollout's log-prob")
    p.check(not cfg.trainer.one_step_off_policy, f"{AT}.enable=true and trainer.one_step_off_policy=true: pick one")
    p.check(not cfg.algorithm.filter_groups.enable,
            f"{AT}.enable=true with algorithm.filter_groups.enable=true is not supported; turn one of them off")
    p.check(cfg.algorithm.adv_estimator != "remax", f"{AT}.enable=true with algorithm.adv_estimator=remax is not "
                                                    "supported (the greedy baselines would be stale)")
    return AsyncPlan(groups, a.trigger_parameter_sync_step, float(a.staleness_threshold), a.partial_rollout,
                     a.segment_tokens, a.queue_samples_dir)


ARA_MINI = "actor_rollout_ref.actor.ppo_mini_batch_size"
