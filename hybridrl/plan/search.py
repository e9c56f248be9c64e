"""`hybridrl plan --search`: every layout of the job's GPUs that the model divides into and that fits, ranked by
the predicted step time (step_time.py), the fastest first.

A candidate sets the training layout (tp within a node, pp, and dp from what is left), the rollout's tp_g (dp_g
follows), the actor's optimizer_offload and full recompute; everything else stays as the job says. Each candidate
goes through the same validate(), shape checks and memory plan as `hybridrl plan`, so a layout it ranks is one
the trainer accepts, and a refused one says why in `--json`. Mixture-of-experts layouts (ep) and context
parallelism are not searched yet: the job's own values are kept.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from hybridrl.config import ConfigError, RunConfig

from .checks import fit_problems, shape_problems
from .estimate import estimate
from .model_shape import ModelShape
from .step_time import GPU, Costs, step_seconds

ARA = "actor_rollout_ref"
KEYS = {"tp": f"{ARA}.actor.megatron.tensor_model_parallel_size", "pp": f"{ARA}.actor.megatron.pipeline_model_parallel_size",
        "tp_g": f"{ARA}.rollout.tensor_model_parallel_size", "offload": f"{ARA}.actor.megatron.optimizer_offload",
        "recompute": f"{ARA}.model.enable_gradient_checkpointing"}
MAX_PP = 16


@dataclass(frozen=True)
class Candidate:
    tp: int
    pp: int
    tp_g: int
    optimizer_offload: bool
    recompute: bool
    dp: int = 0
    dp_g: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    peak_bytes: int = 0
    peak_phase: str = ""
    refused: str = ""  # why it does not fit or does not validate (empty: it fits)

    def overrides(self) -> list[str]:
        return [f"{KEYS['tp']}={self.tp}", f"{KEYS['pp']}={self.pp}", f"{KEYS['tp_g']}={self.tp_g}",
                f"{KEYS['offload']}={str(self.optimizer_offload).lower()}",
                f"{KEYS['recompute']}={str(self.recompute).lower()}"]

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "tp_g": self.tp_g, "dp_g": self.dp_g,
                "optimizer_offload": self.optimizer_offload, "recompute": self.recompute,
                "predicted_seconds": self.seconds, "peak_bytes": self.peak_bytes, "peak_phase": self.peak_phase,
                "refused": self.refused or None, "overrides": self.overrides()}


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def layouts(shape: ModelShape, gpus: int, per_node: int) -> Iterator[Candidate]:
    """Layouts the shape's heads and layers divide into (tp and tp_g inside a node)."""
    tps = [t for t in _divisors(per_node) if shape.num_attention_heads % t == 0 and shape.num_key_value_heads % t == 0]
    tp_gs = [t for t in _divisors(per_node) if shape.num_attention_heads % t == 0 and gpus % t == 0]
    pps = [p for p in _divisors(shape.num_layers) if p <= MAX_PP]
    for tp, pp in itertools.product(tps, pps):
        if gpus % (tp * pp):
            continue
        for tp_g, offload, recompute in itertools.product(tp_gs, (False, True), (False, True)):
            yield Candidate(tp, pp, tp_g, offload, recompute)


def evaluate(candidate: Candidate, build: Callable[[list[str]], RunConfig], shape: ModelShape, gpu_bytes: int,
             overhead_bytes: int, gpu: GPU, costs: Costs) -> Candidate:
    """The candidate validated, planned and timed (refused: why not)."""
    from dataclasses import replace

    try:
        run = build(candidate.overrides())
    except ConfigError as e:
        return replace(candidate, refused=str(e).splitlines()[0])
    problems = shape_problems(run, shape)
    plan = estimate(run, shape, gpu_bytes, overhead_bytes)
    problems += fit_problems(plan, run, shape)
    d = run.derived
    out = replace(candidate, dp=d.actor.dp, dp_g=d.rollout.dp, peak_bytes=plan.peak.total, peak_phase=plan.peak.name)
    if problems:
        return replace(out, refused=problems[0].message)
    return replace(out, seconds={k: round(v, 3) for k, v in step_seconds(run, shape, gpu, costs).items()})


def search(build: Callable[[list[str]], RunConfig], shape: ModelShape, gpus: int, per_node: int, gpu_bytes: int,
           overhead_bytes: int, gpu: GPU, costs: Optional[Costs] = None) -> tuple[list[Candidate], list[Candidate]]:
    """(the layouts that fit, fastest first; the refused ones). `build(overrides)` validates the job with them."""
    costs = costs or Costs()
    done = [evaluate(c, build, shape, gpu_bytes, overhead_bytes, gpu, costs) for c in layouts(shape, gpus, per_node)]
    fits = sorted((c for c in done if not c.refused), key=lambda c: (c.seconds["step"], c.peak_bytes))
    return fits, [c for c in done if c.refused]


def table(fits: list[Candidate], top: int) -> str:
    lines = ["rank  tp pp dp  tp_g x dp_g  opt-offload recompute  step s (gen / log-probs / update / offload)  peak GiB"]
    for i, c in enumerate(fits[:top], 1):
        s = c.seconds
        lines.append(f"{i:4d}  {c.tp:2d} {c.pp:2d} {c.dp:2d}  {c.tp_g:4d} x {c.dp_g:<4d}  {str(c.optimizer_offload):11s} "
                     f"{str(c.recompute):9s}  {s['step']:6.2f} ({s['gen']:.2f} / {s['log_probs']:.2f} / "
                     f"{s['update']:.2f} / {s['optimizer_offload']:.2f})  {c.peak_bytes / 2**30:6.1f} ({c.peak_phase})")
    return "\n".join(lines)
