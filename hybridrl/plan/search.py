"""`hybridrl plan --search`: every layout of the job's GPUs that the model divides into and that fits, ranked by
the predicted step time (step_time.py), the fastest first.

A candidate sets the training layout (tp within a node, pp, cp for sequences of 8k tokens and more, ep for a
mixture of experts, and dp from what is left), the rollout's tp_g (dp_g follows), the actor's optimizer_offload and
full recompute; everything else stays as the job says. Each candidate goes through the same validate(), shape
checks and memory plan as `hybridrl plan`, so a layout it ranks is one the trainer accepts, and a refused one says
why in `--json`. Up to 1,024 GPUs (whole nodes of 8); the network between nodes is step_time.Network.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from hybridrl.config import ConfigError, RunConfig

from .checks import fit_problems, shape_problems
from .estimate import estimate
from .model_shape import ModelShape
from .step_time import GPU, Costs, Network, step_seconds

ARA = "actor_rollout_ref"
KEYS = {"tp": f"{ARA}.actor.megatron.tensor_model_parallel_size", "pp": f"{ARA}.actor.megatron.pipeline_model_parallel_size",
        "cp": f"{ARA}.actor.megatron.context_parallel_size", "ep": f"{ARA}.actor.megatron.expert_model_parallel_size",
        "tp_g": f"{ARA}.rollout.tensor_model_parallel_size", "offload": f"{ARA}.actor.megatron.optimizer_offload",
        "recompute": f"{ARA}.model.enable_gradient_checkpointing"}
MAX_PP = 16
MAX_GPUS = 1024
LONG_SEQUENCE = 8192  # context parallelism is searched for sequences at least this long


@dataclass(frozen=True)
class Candidate:
    tp: int
    pp: int
    tp_g: int
    optimizer_offload: bool
    recompute: bool
    cp: int = 1
    ep: int = 1
    dp: int = 0
    dp_g: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    peak_bytes: int = 0
    peak_phase: str = ""
    refused: str = ""  # why it does not fit or does not validate (empty: it fits)

    def overrides(self) -> list[str]:
        return [f"{KEYS['tp']}={self.tp}", f"{KEYS['pp']}={self.pp}", f"{KEYS['cp']}={self.cp}", f"{KEYS['ep']}={self.ep}",
                f"{KEYS['tp_g']}={self.tp_g}",
                f"{KEYS['offload']}={str(self.optimizer_offload).lower()}",
                f"{KEYS['recompute']}={str(self.recompute).lower()}"]

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "cp": self.cp, "ep": self.ep, "dp": self.dp, "tp_g": self.tp_g, "dp_g": self.dp_g,
                "optimizer_offload": self.optimizer_offload, "recompute": self.recompute,
                "predicted_seconds": self.seconds, "peak_bytes": self.peak_bytes, "peak_phase": self.peak_phase,
                "refused": self.refused or None, "overrides": self.overrides()}


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def layouts(shape: ModelShape, gpus: int, per_node: int, sequence: int = 0) -> Iterator[Candidate]:
    """Layouts the shape's heads, layers and experts divide into (tp, tp_g, and tp x cp inside a node; ep x tp within
    what is left of a node or whole nodes)."""
    tps = [t for t in _divisors(per_node) if shape.num_attention_heads % t == 0 and shape.num_key_value_heads % t == 0]
    tp_gs = [t for t in _divisors(per_node) if shape.num_attention_heads % t == 0 and gpus % t == 0]
    pps = [p for p in _divisors(shape.num_layers) if p <= MAX_PP]
    cps = [c for c in _divisors(per_node) if c == 1 or sequence >= LONG_SEQUENCE]
    eps = [e for e in _divisors(shape.num_experts) if e <= gpus] if shape.is_moe else [1]
    for tp, pp, cp, ep in itertools.product(tps, pps, cps, eps):
        data = gpus // (tp * pp) if gpus % (tp * pp) == 0 else 0
        if not data or data % cp or tp * cp > per_node or (data // cp * tp * cp) % (ep * tp):
            continue
        for tp_g, offload, recompute in itertools.product(tp_gs, (False, True), (False, True)):
            yield Candidate(tp, pp, tp_g, offload, recompute, cp=cp, ep=ep)


def evaluate(candidate: Candidate, build: Callable[[list[str]], RunConfig], shape: ModelShape, gpu_bytes: int,
             overhead_bytes: int, gpu: GPU, costs: Costs, net: Network = Network()) -> Candidate:
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
    return replace(out, seconds={k: round(v, 3) for k, v in step_seconds(run, shape, gpu, costs, net).items()})


def search(build: Callable[[list[str]], RunConfig], shape: ModelShape, gpus: int, per_node: int, gpu_bytes: int,
           overhead_bytes: int, gpu: GPU, costs: Optional[Costs] = None, net: Network = Network(),
           sequence: int = 0) -> tuple[list[Candidate], list[Candidate]]:
    """(the layouts that fit, fastest first; the refused ones). `build(overrides)` validates the job with them;
    `sequence` (prompt + response tokens) decides whether context parallelism is worth searching."""
    costs = costs or Costs()
    done = [evaluate(c, build, shape, gpu_bytes, overhead_bytes, gpu, costs, net)
            for c in layouts(shape, gpus, per_node, sequence)]
    fits = sorted((c for c in done if not c.refused), key=lambda c: (c.seconds["step"], c.peak_bytes))
    return fits, [c for c in done if c.refused]


def table(fits: list[Candidate], top: int) -> str:
    lines = ["rank  tp pp cp ep  dp  tp_g x dp_g  opt-offload recompute  step s (gen / sync+check / log-probs / update / "
             "offload)  peak GiB"]
    for i, c in enumerate(fits[:top], 1):
        s = c.seconds
        lines.append(f"{i:4d}  {c.tp:2d} {c.pp:2d} {c.cp:2d} {c.ep:2d} {c.dp:3d}  {c.tp_g:4d} x {c.dp_g:<4d}  {str(c.optimizer_offload):11s} "
                     f"{str(c.recompute):9s}  {s['step']:6.2f} ({s['gen']:.2f} / {s['sync'] + s['sync_check']:.2f} / "
                     f"{s['log_probs']:.2f} / "
                     f"{s['update']:.2f} / {s['optimizer_offload']:.2f})  {c.peak_bytes / 2**30:6.1f} ({c.peak_phase})")
    return "\n".join(lines)
