"""One-step-off-policy rollouts (trainer.one_step_off_policy): the batch of step k+1 is generated while step k
trains, on the rollout's own GPUs.

    launch(1)                                   weights v0 -> rollout, generate batch 1
    step k:  wait for batch k
             launch(k+1)                        weights after update k-1 -> rollout, generate batch k+1 ...
             score batch k, yield it            ... while the trainer runs step k on batch k
So batch k (k >= 2) comes from the policy after update k-2 and is trained by the policy after update k-1:
staleness 1 (batch 1: 0). The loss corrects for it with importance weights against the rollout's
log-probs (algorithm.rollout_correction; token TIS by default in this mode).

The loader has handed out the prompts of the prefetched batch before step k's checkpoint is written:
`loader_state()` is its state from before that draw, so a resumed run generates those prompts again.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from hybridrl.protocol import DataProto

from .dynamic_sampling import Rollout

if TYPE_CHECKING:
    from .sampling import Sampler


class OneStepOffStream:
    """`sampler` launches, finishes and scores the generations; `snapshot()` is the prompt loader's state_dict."""

    def __init__(self, prompts: Iterator[DataProto], sampler: "Sampler", *, start_step: int, steps: int,
                 snapshot: Callable[[], dict]) -> None:
        self.prompts, self.sampler = prompts, sampler
        self.first, self.last = start_step + 1, start_step + steps
        self.snapshot = snapshot
        self._state_before_prefetch: Optional[dict] = None

    def __iter__(self) -> Iterator[Rollout]:
        pending = self._launch(self.first, version=self.first - 1) if self.first <= self.last else None
        step, last_yield = self.first, time.perf_counter()
        while pending is not None:
            prompts, handle, launched_at, launch_s = pending
            start = time.perf_counter()
            batch = self.sampler.finish(handle)
            wait_s = time.perf_counter() - start
            metrics = batch.meta_info.pop("metrics", {})
            # overlaps scoring and training; the weights hold the updates before this step's (step - 1)
            pending = self._launch(step + 1, version=step - 1) if step < self.last else None
            if pending is None:
                self._state_before_prefetch = None  # nothing drawn ahead: the loader's own state is right
            start = time.perf_counter()
            batch = self.sampler.score(batch)
            timing = {"gen": wait_s, "reward": time.perf_counter() - start, "launch_gen": launch_s}
            metrics.update(idle_metrics(metrics.get("timing_s/generate", 0.0), wait_s, start - last_yield,
                                        pending[2] - launched_at if pending is not None else None))
            yield Rollout(batch, prompts.meta_info.get("epoch", 0), metrics, timing)
            step, last_yield = step + 1, time.perf_counter()

    def _launch(self, step: int, version: int) -> Optional[tuple[DataProto, Any, float, float]]:
        state = self.snapshot()
        prompts = next(self.prompts, None)
        if prompts is None:
            return None
        self._state_before_prefetch = state
        start = time.perf_counter()
        handle = self.sampler.start(prompts, step, 0, version)
        return prompts, handle, start, time.perf_counter() - start

    def loader_state(self) -> Optional[dict]:
        """The loader's state to checkpoint after the step just yielded (None: its current state)."""
        return self._state_before_prefetch


def idle_metrics(gen_s: float, wait_s: float, cycle_s: float, launch_to_launch_s: Optional[float]) -> dict[str, float]:
    """Each side's idle time under the fully async mode's names. The trainer: its wait for the batch, over the time
    since it last got one (`cycle_s`). The rollout: 1 - its generation time over the time from this batch's launch to
    the next one's (the last batch has no next launch: not reported). `async/overlapped_gen_s`: the generation that
    ran while the trainer worked."""
    out = {"async/overlapped_gen_s": max(gen_s - wait_s, 0.0), "timing_s/trainer_idle": wait_s,
           "trainer/idle_ratio": min(wait_s / cycle_s, 1.0) if cycle_s > 0 else 0.0}
    if launch_to_launch_s is not None and launch_to_launch_s > 0:
        out["rollouter/idle_ratio"] = min(max(1.0 - gen_s / launch_to_launch_s, 0.0), 1.0)
    return out
