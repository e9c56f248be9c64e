"""The memory plan against this machine's GPUs, before a GPU run starts (trainer.memory_check).

`hybridrl plan` refuses a layout that does not fit in a second; without this the trainer found out minutes later,
inside update_actor, as an NCCL "unhandled cuda error" (an out-of-memory). run_ppo calls `check_memory` before Ray,
the workers and the model load: the job is planned (estimate.py, the same plan as `hybridrl plan`, default overhead)
for the smallest GPU this process sees, at its total memory, and a phase that does not fit stops the run with the
plan's own message (the phase, its largest parts, the keys to turn; checks.fit_problems). Only those refusals count:
the plan's notes never stop a run.

The plan is a model (measured peaks 0.83-1.14x of it in most runs of benchmarks/results/), so the message says how to
start anyway: trainer.memory_check=warn logs it and goes on, skip skips the check (not `off`: YAML reads that as false).

Skipped: trainer.device=cpu (silently: host memory is not planned); with a logged line where the job's GPUs are not
this process's to see (it joins a running Ray cluster, or sees no GPU) or the model's shape cannot be read (a GGUF
folder, a config.json the plan does not know). Nothing is guessed: no check rather than a check against a made-up size.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional

from hybridrl.config import ConfigError, RunConfig

from .checks import Problem, fit_problems
from .estimate import estimate
from .memory import GiB, MemoryPlan
from .model_shape import ModelShape, ModelShapeError, resolve

log = logging.getLogger("hybridrl.plan")


@dataclass(frozen=True)
class Gpu:
    """The GPU a job is planned for: the smallest of those this process sees."""

    name: str
    memory_bytes: int  # total, as `hybridrl plan --gpu-mem-gb` takes it (the plan holds the CUDA context's share)
    count: int  # GPUs seen


def smallest_local_gpu() -> Optional[Gpu]:
    """The smallest CUDA device this process sees, or None where it sees none. From the device properties, as the
    driver reads its GPU's name for MFU anyway (components.py); not mem_get_info, which would make a CUDA context on
    GPU 0 in this process for the whole run."""
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        return None
    props = min((torch.cuda.get_device_properties(i) for i in range(count)), key=lambda p: p.total_memory)
    return Gpu(props.name, int(props.total_memory), count)


def plan_problems(run: RunConfig, gpu_bytes: int, shape: ModelShape, critic_shape: Optional[ModelShape] = None,
                  rm_shape: Optional[ModelShape] = None) -> tuple[MemoryPlan, list[Problem]]:
    """The plan on GPUs of `gpu_bytes` and its refusals (empty: every phase fits)."""
    plan = estimate(run, shape, gpu_bytes, critic_shape=critic_shape, rm_shape=rm_shape)
    return plan, fit_problems(plan, run, shape)


def check_memory(run: RunConfig, gpu: Optional[Callable[[], Optional[Gpu]]] = None) -> None:
    """Raise ConfigError (trainer.memory_check=error) or log (warn) where the plan does not fit this machine's GPUs;
    `gpu`: the probe (default smallest_local_gpu; tests pass a fake size)."""
    mode = run.cfg.trainer.memory_check
    if run.derived.device != "cuda" or mode == "skip":
        return
    inputs = _plan_inputs(run, gpu or smallest_local_gpu)
    if isinstance(inputs, str):
        log.warning("memory check skipped: %s; `python -m hybridrl plan ARGS --gpu-mem-gb N` plans this run (ARGS: "
                    "its config arguments) for GPUs of N GiB", inputs)
        return
    found, shapes = inputs
    where = f"{found.name} ({found.memory_bytes / GiB:.1f} GiB{f', the smallest of {found.count}' if found.count > 1 else ''})"
    plan, problems = plan_problems(run, found.memory_bytes, *shapes)
    if not problems:
        log.info("memory plan on %s: fits, peak %s %.1f GiB per GPU", where, plan.peak.name, plan.peak.total / GiB)
    elif mode == "error":
        raise ConfigError(refusal_message(problems, where, found.memory_bytes))
    else:
        log.warning("trainer.memory_check=warn, starting anyway: %s", refusal_message(problems, where, found.memory_bytes))


def _plan_inputs(run: RunConfig, gpu: Callable[[], Optional[Gpu]]) -> tuple[Gpu, tuple] | str:
    """(the GPU, the model shapes) to plan with, or why there is nothing to plan with."""
    skipped = _cluster_reason(run)
    if skipped:
        return skipped
    found = gpu()
    if found is None:
        return "this process sees no GPU"
    shapes = _shapes(run)
    return shapes if isinstance(shapes, str) else (found, shapes)


def refusal_message(problems: list[Problem], where: str, gpu_bytes: int) -> str:
    """The plan's refusals, the way past them and the command that prints the whole plan."""
    head = f"the memory plan of this job does not fit the GPUs here, {where}"
    way_out = ("The plan is a model (measured peaks 0.83-1.14x of it): trainer.memory_check=warn starts anyway, "
               f"trainer.memory_check=skip skips this check; `python -m hybridrl plan ARGS --gpu-mem-gb "
               f"{gpu_bytes / GiB:.1f}` (ARGS: this run's config arguments) prints every phase")
    if len(problems) == 1:
        return f"{head}: {problems[0].message}. {way_out}"
    return head + ":\n  - " + "\n  - ".join(p.message for p in problems) + "\n" + way_out


def _cluster_reason(run: RunConfig) -> Optional[str]:
    """Why this process cannot see the job's GPUs, or None. With the Ray backend on a cluster it joins, the workers
    may land on other nodes; torchrun's ranks (backend=local) each see their own node."""
    from hybridrl.config.placement import joins_cluster

    t = run.cfg.trainer
    address = run.cfg.ray_kwargs.ray_init.get("address")
    if t.backend == "ray" and joins_cluster(address):
        where = f"ray_kwargs.ray_init.address={address}" if address else f"RAY_ADDRESS={os.environ.get('RAY_ADDRESS')}"
        return f"the job runs on a Ray cluster this process joins ({where}), whose GPUs it cannot see from here"
    return None


def _shapes(run: RunConfig) -> tuple[ModelShape, Optional[ModelShape], Optional[ModelShape]] | str:
    """(actor, critic or None, reward model or None) shapes from their model folders, or why not. The critic and the
    reward model are planned with their own config.json (`hybridrl plan` needs --critic-model-config for that)."""
    cfg, d = run.cfg, run.derived
    models = {"actor_rollout_ref.model.path": cfg.actor_rollout_ref.model,
              "critic.model.path": cfg.critic.model if d.use_critic else None,
              "reward_model.model.path": cfg.reward_model.model if d.reward.model else None}
    shapes = []
    for key, model in models.items():
        try:
            shapes.append(None if model is None else resolve(model.path, model.override_config))
        except ModelShapeError as e:
            return f"no model shape from {key}={model.path} ({e})"
    return shapes[0], shapes[1], shapes[2]
