"""async_training.*: fully asynchronous RL (verl's recipe/fully_async_policy keys; hybridrl/trainer/fully_async.py).

verl picks this mode by its entry point (fully_async_main); here `async_training.enable=true` on a split placement
(actor_rollout_ref.hybrid_engine=false) does. The other keys keep verl's names and meaning.
"""
from __future__ import annotations

from dataclasses import dataclass

from .common import doc


@dataclass(frozen=True)
class AsyncTrainingConfig:
    enable: bool = doc("Fully asynchronous training: the rollout workers generate continuously into a bounded queue "
                       "and the trainer takes ready batches from it (needs actor_rollout_ref.hybrid_engine=false).",
                       False)
    staleness_threshold: float = doc(
        "verl's freshness control: between two weight syncs the rollout generates at most (1 + staleness_threshold) "
        "x the samples the trainer takes in that time, minus the stale ones still waiting. 0 is synchronous. The "
        "trainer takes no sample whose oldest token is more than ceil(staleness_threshold) syncs old.", 0.1)
    trigger_parameter_sync_step: int = doc(
        "Trainer steps (each on require_batches x ppo_mini_batch_size prompts) between two weight syncs.", 4)
    require_batches: int = doc("ppo_mini_batch_size groups the trainer takes per step.", 1)
    partial_rollout: bool = doc(
        "At a weight sync, requests in flight stop at the end of their current segment and go on with the new "
        "weights (their tokens keep the version that made them); false: the sync waits until they finish.", True)
    use_rollout_log_probs: bool = doc("The rollout's log-probs, per token of the version that made it, are the "
                                      "behaviour policy (only true is supported).", True)
    compute_prox_log_prob: bool = doc(
        "true: the trainer recomputes old log-probs and algorithm.rollout_correction weights each token against the "
        "rollout's log-prob (token TIS by default); false (verl's default): no recompute, which here means "
        "algorithm.rollout_correction.bypass_mode=true.", False)
    use_trainer_do_validate: bool = doc("Accepted for verl compatibility; validation runs on the rollout workers "
                                        "(paused meanwhile).", False)
    segment_tokens: int = doc("hybridrl: a request generates at most this many tokens before it looks for new "
                              "weights (partial rollout granularity).", 64)
    queue_samples_dir: str = doc("hybridrl: where the completed samples not trained on are written when the run "
                                 "fails or stops early (relative: under trainer.default_local_dir); a run resumed "
                                 "from a checkpoint trains them first, each once.", "async_queue")
