"""One torch profiler per process, opened and closed around a training step (global_profiler.*).

Colocated roles share a process, and the driver asks every role's group: the first `start` of a step opens the
window and the others are no-ops; the first `stop` writes the files and the others return None. What a step's
window holds on each process: `ROLE_rankR.txt`, the ops by device time (self time: where a GPU's time went) and
by host time; `ROLE_rankR.trace.json.gz`, the chrome trace (chrome://tracing, perfetto.dev). A name already taken
gets a numbered sibling: a resumed run profiling the same step keeps the first run's files.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

import torch

log = logging.getLogger(__name__)
ROWS = 40  # ops per table

_open: Optional[tuple[int, Any, float]] = None  # (step, the profiler, when it started)


def start(step: int) -> bool:
    """Open this process's window for `step` (False: one is open already)."""
    global _open
    if _open is not None:
        return False
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = profile(activities=activities, record_shapes=False, with_stack=False)
    prof.start()
    _open = (step, prof, time.perf_counter())
    return True


def stop(step: int, folder: str, name: str) -> Optional[str]:
    """Close the window of `step` and write its files into folder/step_STEP/NAME*; the table's path (None: no
    window of that step was open here)."""
    global _open
    if _open is None or _open[0] != step:
        return None
    _, prof, began = _open
    _open = None
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # the step's kernels are in the window
    prof.stop()
    seconds = time.perf_counter() - began
    where = os.path.join(folder, f"step_{step}")
    os.makedirs(where, exist_ok=True)
    base = _free_name(where, name)
    table = _tables(prof, step, seconds)
    with open(base + ".txt", "x") as f:  # "x": never over a file that is there
        f.write(table)
    prof.export_chrome_trace(base + ".trace.json.gz")
    log.info("profile of step %d (%.1f s): %s.txt and .trace.json.gz", step, seconds, base)
    return base + ".txt"


def _free_name(folder: str, name: str) -> str:
    base, n = os.path.join(folder, name), 1
    while os.path.exists(base + ".txt") or os.path.exists(base + ".trace.json.gz"):
        base, n = os.path.join(folder, f"{name}.{n}"), n + 1
    return base


def _tables(prof: Any, step: int, seconds: float) -> str:
    events = prof.key_averages()
    parts = [f"step {step}: {seconds:.3f} s in the window\n"]
    if torch.cuda.is_available():
        busy = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA") / 1e6
        parts.append(f"GPU busy {busy:.3f} s ({busy / seconds:.0%} of the window)\n\nby device time:\n")
        parts.append(events.table(sort_by="self_cuda_time_total", row_limit=ROWS, max_name_column_width=80))
    parts.append("\n\nby host time:\n")
    parts.append(events.table(sort_by="self_cpu_time_total", row_limit=ROWS, max_name_column_width=80))
    return "".join(parts) + "\n"
