"""Memory plan: per-GPU memory of a job, phase by phase, and the layouts a model cannot take.

    shape = resolve("Qwen2.5-7B")                 # model_shape.py: config.json or the built-in table
    plan = estimate(validate(cfg), shape, 80 * GiB)  # estimate.py -> memory.py formulas
    shape_problems(run, shape) + fit_problems(plan, run, shape)   # checks.py

`hybridrl plan ...` (cli.py) prints it; `--json` gives the keys documented in report.py. The trainer makes the same
plan for the GPUs it runs on before it starts anything (device_check.check_memory, trainer.memory_check).
"""
from .checks import Problem, fit_problems, shape_problems
from .estimate import estimate
from .memory import COMPONENTS, PHASES, GiB, MemoryPlan
from .model_shape import KNOWN_CONFIGS, ModelShape, ModelShapeError, resolve

__all__ = [
    "COMPONENTS", "GiB", "KNOWN_CONFIGS", "MemoryPlan", "ModelShape", "ModelShapeError", "PHASES", "Problem",
    "estimate", "fit_problems", "resolve", "shape_problems",
]
