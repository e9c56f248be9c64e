"""A tqdm bar over training steps showing the score and the step time.

Shown only on an interactive terminal and with trainer.progress_bar=true: in a log file (SLURM, Ray
job logs) a bar's carriage returns are noise, and the console tracker already writes one line per step.
"""
from __future__ import annotations

import sys
from typing import Any, Mapping, Optional, TextIO

from tqdm import tqdm


class ProgressBar:
    def __init__(self, total_steps: int, initial_step: int = 0, enabled: bool = True,
                 stream: Optional[TextIO] = None) -> None:
        stream = stream or sys.stderr
        self.enabled = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.bar = tqdm(total=total_steps, initial=initial_step, file=stream, desc="steps",
                        dynamic_ncols=True) if self.enabled else None
        self.step = initial_step

    @classmethod
    def from_config(cls, trainer_cfg: Any, total_steps: int, initial_step: int = 0) -> "ProgressBar":
        return cls(total_steps, initial_step, enabled=trainer_cfg.progress_bar)

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Advance to `step` (the global step just finished)."""
        if self.bar is None:
            self.step = step
            return
        postfix = {}
        if "critic/score/mean" in metrics:
            postfix["score"] = f"{metrics['critic/score/mean']:.3f}"
        if "timing_s/step" in metrics:
            postfix["step_s"] = f"{metrics['timing_s/step']:.1f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(step - self.step)
        self.step = step

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
