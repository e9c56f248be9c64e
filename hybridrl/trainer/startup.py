"""What a user waits for between launching a job and its first training step, part by part.

`timing_s/startup` runs from this process's start (python and imports included) to the moment the first
training step begins. Its parts, in the order they happen:
  launch            python start-up, imports, config composition and validation
  data              tokenizer, datasets, reward functions (with Ray: on a thread while Ray starts, and `data` is
                    only what Ray's start did not hide; data_background, the thread's own time, is not summed)
  ray_init          the Ray cluster (Ray backend only)
  workers           spawning the worker processes (their python, imports, role constructors)
  process_group     the workers joining torch.distributed (rank 0's init call)
  worker_init       the rest of the worker's init call beyond its listed parts (tokenizer, reshard plan, offload
                    before the engine and onload after it, the call's round trip)
  actor_build       the actor: actor_model_build (megatron-core's import and parallel groups, the model, its
                    optimizer) and actor_weight_load (the HF checkpoint read into it) (+ ref_build for the reference)
  host_pin_wait     waiting for the pinned host memory offload keeps the training state in between steps: it is
                    allocated on a thread from the actor's build on (host_pin_background: the thread's own time,
                    beside the other parts, not added to the total)
  engine_init       the rollout engine; for vLLM split into engine_import (vllm's import), engine_load (dummy
                    weights), engine_compile (torch.compile, or loading it from the cache), engine_profile_run (the
                    first forward after an AOT compile), engine_capture (CUDA graphs), engine_warmup (the rest of
                    vLLM's "init engine": memory profiling, KV-cache allocation, warm-up runs) and engine_other
                    (config, model construction, what vLLM does not time)
  first_sync        the first weight sync (streamed, and the proof of the direct copy)
  val_before_train  validation before training, when trainer.val_before_train is set
Worker-side parts come from rank 0's report; the rest of the wall time is listed as `other`.

`phase_table` folds these into the rows of issue 39's table (Ray, workers, model build, weight load, vLLM engine,
compile and graph capture, first validation, first step) plus the rest, each row once, so that the rows before
the first step add up to `timing_s/startup`.
"""
from __future__ import annotations

import time
from typing import Optional

import psutil

# worker parts whose sum is the worker's init (engine_* parts other than engine_init are inside engine_init)
WORKER_PARTS = ("process_group", "actor_build", "ref_build", "host_pin_wait", "engine_init", "first_sync")
ENGINE_PARTS = ("engine_import", "engine_load", "engine_compile", "engine_profile_run", "engine_capture",
                "engine_warmup", "engine_other")
ACTOR_PARTS = ("actor_model_build", "actor_weight_load")  # inside actor_build
INNER_PARTS = ENGINE_PARTS + ACTOR_PARTS  # parts of a listed part: reported, not summed again
BACKGROUND_PARTS = ("host_pin_background", "data_background")  # ran beside the listed parts: reported, not summed
FLAGS = ("engine_kv_from_plan",)  # not seconds: 1 where vLLM took the KV-cache size from its persisted plan
NOT_SUMMED = INNER_PARTS + BACKGROUND_PARTS + FLAGS


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

    def add_worker(self, report: dict[str, float], name: str = "worker_init") -> None:
        """Since the previous lap, a worker's init call ran: its own parts (rank 0's report) are listed as
        such, and the rest of the call's wall time (process group, tokenizer, plan) goes to `name`."""
        now = time.perf_counter()
        wall, self._mark = now - self._mark, now
        inner = {k: float(v) for k, v in report.items() if k in WORKER_PARTS + NOT_SUMMED}
        self.parts.update(inner)
        self.parts[name] = self.parts.get(name, 0.0) + max(0.0, wall - sum(inner.get(k, 0.0) for k in WORKER_PARTS))

    def done(self) -> dict[str, float]:
        """Called as the first training step begins (later calls repeat the same numbers): the start-up's
        metrics; what no part covers is `other`."""
        if self.total is None:
            self.total = time.perf_counter() - self._origin
        listed = sum(v for k, v in self.parts.items() if k not in NOT_SUMMED)
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
                          if v >= 0.05 * total and k not in NOT_SUMMED)
        engine = ", ".join(f"{k[len('engine_'):]} {m[f'timing_s/startup/{k}']:.1f}" for k in ENGINE_PARTS
                           if f"timing_s/startup/{k}" in m)
        return f"hybridrl: start-up {total:.1f} s to the first step ({shown})" + (f"; engine: {engine}" if engine else "")


def engine_parts(outer_seconds: float, reported: dict[str, float]) -> dict[str, float]:
    """The engine's start-up parts within `outer_seconds`, the worker's own clock around the whole engine build
    (imports included): engine_init is that clock, and engine_other what no reported part covers."""
    out = {k: float(v) for k, v in reported.items() if k in ENGINE_PARTS + FLAGS and k != "engine_other"}
    out["engine_init"] = outer_seconds
    out["engine_other"] = max(0.0, outer_seconds - sum(out[k] for k in ENGINE_PARTS if k in out))
    return out


# issue 39's rows: (row, the parts it sums); what no row names goes to "other" (launch, data, first sync, ...)
TABLE_ROWS = (
    ("ray", ("ray_init",)),
    ("workers", ("workers", "process_group", "worker_init")),
    ("model_build", ("actor_model_build", "ref_build", "critic_build", "reward_model_build")),
    ("weight_load", ("actor_weight_load",)),
    ("vllm_engine", ("engine_import", "engine_load", "engine_warmup", "engine_other")),
    ("compile_and_capture", ("engine_compile", "engine_profile_run", "engine_capture")),
    ("first_validation", ("val_before_train",)),
)


def phase_table(metrics: dict[str, float], first_step: Optional[float] = None) -> dict[str, float]:
    """Issue 39's start-up table from one run's start-up metrics (those of `StartupClock.done`, logged with step 1):
    each row's seconds, `other` (every top-level part no row names: launch, data, host_pin_wait, first_sync, what the
    clock left over), `to_first_step` (the total, = the rows so far) and, when given, `first_step` (the first step's
    own time, after the total). Where actor_build or engine_init came without their inner parts (a torch engine, a
    custom adapter), the whole part goes to model_build or vllm_engine."""
    part = {k.rsplit("/", 1)[1]: float(v) for k, v in metrics.items() if k.startswith("timing_s/startup/")}
    if "actor_build" in part and not any(k in part for k in ACTOR_PARTS):
        part["actor_model_build"] = part["actor_build"]
    if "engine_init" in part and not any(k in part for k in ENGINE_PARTS):
        part["engine_other"] = part["engine_init"]
    rows = {name: sum(part.get(k, 0.0) for k in keys) for name, keys in TABLE_ROWS}
    # the worker parts the rows split further: what of them the inner parts do not cover stays in their row
    rows["model_build"] += max(0.0, part.get("actor_build", 0.0) - part.get("actor_model_build", 0.0)
                               - part.get("actor_weight_load", 0.0))
    covered = {k for _, keys in TABLE_ROWS for k in keys} | {"actor_build", "engine_init"}
    rows["other"] = sum(v for k, v in part.items() if k not in covered and k not in NOT_SUMMED)
    rows["to_first_step"] = float(metrics["timing_s/startup"])
    if first_step is not None:
        rows["first_step"] = float(first_step)
    return rows
