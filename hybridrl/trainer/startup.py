"""What a user waits for between launching a job and its first training step, part by part.

`timing_s/startup` runs from this process's start (python and imports included) to the moment the first
training step begins. Its parts, in the order they happen:
  launch            python start-up, imports, config composition and validation
  data              tokenizer, datasets, reward functions
  ray_init          the Ray cluster (Ray backend only)
  workers           spawning the worker processes and joining their process group
  actor_build       megatron model build and HF weight load (+ ref_build for the reference)
  host_pin_wait     waiting for the pinned host memory offload keeps the training state in between steps: it is
                    allocated on a thread from the actor's build on (host_pin_background: the thread's own time,
                    beside the other parts, not added to the total)
  engine_init       the rollout engine; for vLLM split into engine_load, engine_compile (torch.compile, or
                    loading it from the cache), engine_capture (CUDA graphs) and engine_other (profiling,
                    KV cache, warm-up)
  first_sync        the first weight sync (streamed, and the proof of the direct copy)
  val_before_train  validation before training, when trainer.val_before_train is set
Worker-side parts come from rank 0's report; the rest of the wall time is listed as `other`.
"""
from __future__ import annotations

import time
from typing import Optional

import psutil

# worker parts whose sum is the worker's init (engine_* parts other than engine_init are inside engine_init)
WORKER_PARTS = ("actor_build", "ref_build", "host_pin_wait", "engine_init", "first_sync")
ENGINE_PARTS = ("engine_load", "engine_compile", "engine_capture", "engine_other")
BACKGROUND_PARTS = ("host_pin_background",)  # ran beside the listed parts: reported, not summed


def process_age() -> float:
    """Seconds since this process started (the launch, as the user saw it)."""
    return max(0.0, time.time() - psutil.Process().create_time())


class StartupClock:
    """Named parts of the start-up, each measured where it happens."""

    def __init__(self) -> None:
        self._origin = time.perf_counter() - process_age()
        self._mark = time.perf_counter()
        self.parts: dict[str, float] = {"launch": self._mark - self._origin}
        self.total: Optional[float] = None

    def lap(self, name: str) -> float:
        """Time since the previous lap (or since launch) is part `name`."""
        now = time.perf_counter()
        self.parts[name] = self.parts.get(name, 0.0) + now - self._mark
        self._mark = now
        return self.parts[name]

    def add_worker(self, report: dict[str, float], name: str = "workers") -> None:
        """Since the previous lap, a worker's init call ran: its own parts (rank 0's report) are listed as
        such, and the rest of the call's wall time (process group, tokenizer, plan) goes to `name`."""
        now = time.perf_counter()
        wall, self._mark = now - self._mark, now
        inner = {k: float(v) for k, v in report.items() if k in WORKER_PARTS + ENGINE_PARTS + BACKGROUND_PARTS}
        self.parts.update(inner)
        self.parts[name] = self.parts.get(name, 0.0) + max(0.0, wall - sum(inner.get(k, 0.0) for k in WORKER_PARTS))

    def done(self) -> dict[str, float]:
        """Called as the first training step begins (later calls repeat the same numbers): the start-up's
        metrics; what no part covers is `other`."""
        if self.total is None:
            self.total = time.perf_counter() - self._origin
        listed = sum(v for k, v in self.parts.items() if k not in ENGINE_PARTS + BACKGROUND_PARTS)
        metrics = {"timing_s/startup": self.total, **{f"timing_s/startup/{k}": v for k, v in self.parts.items()}}
        metrics["timing_s/startup/other"] = max(0.0, self.total - listed)
        return metrics

    def summary(self) -> str:
        """One line: the total and the parts that took at least 5% of it, largest first."""
        m = self.done()
        total = m["timing_s/startup"]
        parts = sorted(((k.rsplit("/", 1)[1], v) for k, v in m.items() if k.startswith("timing_s/startup/")),
                       key=lambda kv: -kv[1])
        shown = ", ".join(f"{k} {v:.1f}" for k, v in parts
                          if v >= 0.05 * total and k not in ENGINE_PARTS + BACKGROUND_PARTS)
        engine = ", ".join(f"{k[len('engine_'):]} {m[f'timing_s/startup/{k}']:.1f}" for k in ENGINE_PARTS
                           if f"timing_s/startup/{k}" in m)
        return f"hybridrl: start-up {total:.1f} s to the first step ({shown})" + (f"; engine: {engine}" if engine else "")
