"""The driver's side of global_profiler.*: every worker process's torch profiler (hybridrl.utils.profiling) opens
before a chosen step's rollout is drawn and closes after its update, so the window holds the weight sync,
generation, log-probs and update; validation and checkpoints run outside it. The driver profiles itself too (its
rewards, advantages and data movement); under torchrun it shares rank 0's process and window.
In one-step-off and fully async runs the window holds whatever generation runs beside the step.
"""
from __future__ import annotations

import os
import time
from typing import Any, Optional

from hybridrl.config import RunConfig
from hybridrl.utils import profiling


class StepProfile:
    def __init__(self, groups: list[Any], steps: list[int], folder: str) -> None:
        self.groups, self.steps, self.folder = groups, set(steps), folder
        self._open: Optional[int] = None

    @classmethod
    def from_run(cls, run: RunConfig, groups: list[Any]) -> Optional["StepProfile"]:
        g = run.cfg.global_profiler
        if g.tool is None:
            return None
        folder = g.save_path or os.path.join(run.cfg.trainer.default_local_dir, "profile")
        distinct = list({id(x): x for x in groups if x is not None}.values())
        return cls(distinct, list(g.steps or []), folder)

    def open(self, step: int) -> None:
        if step not in self.steps or self._open is not None:
            return
        profiling.start(step)
        for group in self.groups:
            group.profile_start(step)
        self._open = step

    def close(self, step: int) -> dict[str, float]:
        """After the step's update: the files written; metrics that mark the step as profiled (its timings carry
        the profiler's overhead)."""
        if self._open != step:
            return {}
        began = time.perf_counter()
        written = [p for group in self.groups for p in group.profile_stop(step, self.folder) if p]
        mine = profiling.stop(step, self.folder, "driver")
        written += [mine] if mine else []
        self._open = None
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank runs this driver
            print(f"hybridrl: profile of step {step}: {len(written)} tables (and chrome traces) in "
                  f"{os.path.join(self.folder, f'step_{step}')}", flush=True)
        return {"profile/active": 1.0, "timing_s/profile_write": time.perf_counter() - began}
