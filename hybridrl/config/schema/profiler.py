"""global_profiler.*: torch profiler windows over chosen training steps (verl's keys)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .common import doc


@dataclass(frozen=True)
class GlobalProfilerConfig:
    tool: Optional[str] = doc("null (off) or torch: torch.profiler (CPU and CUDA activity) in every worker process "
                              "over each step of `steps`.", None)
    steps: Optional[list[int]] = doc("Steps to profile, e.g. [2, 5] (1 is the first step, whose kernels are still "
                                     "warming up). Each window spans the step's generation, log-probs and update; "
                                     "validation and checkpoints fall outside it.", None)
    save_path: Optional[str] = doc("Where each profiled step's files go (step_N/ROLE_rankR.txt: the ops by device "
                                   "time; .trace.json.gz: the chrome trace); null: PROFILE under "
                                   "trainer.default_local_dir. Files already there are kept, never overwritten.",
                                   None)
