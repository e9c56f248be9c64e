"""A GRPO/PPO step's seconds for a validated job on a given GPU type: the ranking half of `hybridrl plan --search`.

Phases, per step (every rank takes the same time in a balanced layout; T tokens of the step, S samples, R response
tokens, N matmul weights, L layers, dp/tp/pp the actor's layout, tp_g/dp_g the rollout's):
    generation     R decode steps of one replica: per_sequence_s x S/dp_g + weights/tp_g / HBM bandwidth
                   (+ 2 L tp all-reduces a step when tp_g > 1), plus the engine's wake/sleep
    log-prob pass  2 N T/dp / (tp pp) FLOPs at forward_mfu x tp_efficiency x pipeline fill, once for the old
                   log-probs and once more for the reference
    update         6 N T/dp / (tp pp) FLOPs at train_mfu x tp_efficiency x pipeline fill (8 N with full recompute),
                   the gradients' reduce-scatter over dp, and with optimizer_offload the optimizer state's round trip
                   to the host (out before generation, back for the step)
MFU grows with the model's width (bigger GEMMs): it is interpolated in log2(hidden_size) between the calibration
points below and held beyond them. The constants come from the runs in CALIBRATION (benchmarks/results/, dated);
tests/unit/test_plan_search.py checks the model against each of them. tp_efficiency and the all-reduce latency are
not measured yet (issue 33): they are the guesses marked below.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hybridrl.config import RunConfig

from .estimate import recompute_enabled
from .model_shape import ModelShape


@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float  # dense bf16
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # all-gather bus bandwidth between GPUs of one node
    host_bytes_per_s: float  # pinned host <-> device copies


GPUS = {
    # H200: 4.8 TB/s HBM; NVLink all-gather 248 GB/s bus (four_gpu.json, 2026-11-27); host copies ~50 GB/s
    # (85 GB of Adam state in 1.72 s, megatron_speed.md)
    "H200": GPU("H200", 989e12, 4.8e12, 248e9, 50e9),
    # H100 SXM: 3.35 TB/s HBM (datasheet); the rest taken as the H200's (the same NVLink and host link)
    "H100": GPU("H100", 989e12, 3.35e12, 248e9, 50e9),
}


@dataclass(frozen=True)
class Costs:
    """Efficiencies measured on H200s (sources in the comments); see the module docstring for where they enter."""

    # forward+backward MFU at hidden 1536 (four_gpu.json 1p5b_1gpu: 0.336) and 3584 (megatron_speed.json 7B: 0.502)
    train_mfu: tuple[tuple[int, float], ...] = ((1536, 0.336), (3584, 0.502))
    # log-prob forward MFU, the old log-probs with entropy (four_gpu 1.5B: 0.92 s for 68.6k tokens -> 0.23;
    # megatron_scale 7B: 1.07 s for 34.3k tokens -> 0.49)
    forward_mfu: tuple[tuple[int, float], ...] = ((1536, 0.23), (3584, 0.49))
    # vLLM decode: seconds per sequence per step (megatron_scale 1.5B: 128 sequences, 3.9 ms a step)
    per_sequence_s: float = 3.0e-5
    engine_wake_sleep_s: float = 0.15
    # guesses (not measured yet): tensor-parallel efficiency of the training GEMMs and the per-layer all-reduces
    tp_efficiency: tuple[tuple[int, float], ...] = ((1, 1.0), (2, 0.85), (4, 0.75), (8, 0.6))
    allreduce_latency_s: float = 2.0e-5
    other_s: float = 0.1  # reward, advantages, dispatch


def _interpolate(points: tuple[tuple[int, float], ...], hidden: int) -> float:
    (h0, v0), (h1, v1) = points[0], points[-1]
    x = (math.log2(hidden) - math.log2(h0)) / (math.log2(h1) - math.log2(h0))
    return v0 + min(max(x, 0.0), 1.0) * (v1 - v0)


def _tp_efficiency(costs: Costs, tp: int) -> float:
    return dict(costs.tp_efficiency).get(tp, costs.tp_efficiency[-1][1])


def _matmul_params(shape: ModelShape) -> int:
    """Weights a token runs through in matmuls (active experts only; the LM head, not the embedding lookup)."""
    return shape.active_params - shape.embedding_params() + (shape.embedding_params() if shape.tie_word_embeddings else 0)


def step_seconds(run: RunConfig, shape: ModelShape, gpu: GPU, costs: Costs = Costs()) -> dict[str, float]:
    """Predicted seconds of each phase of one step and their sum under "step"."""
    d, cfg = run.derived, run.cfg
    a, r, batch = d.actor, d.rollout, d.actor_batch
    samples = batch.samples_per_step
    response = cfg.data.max_response_length
    tokens = samples * (cfg.data.max_prompt_length // 2 + response)  # prompts are mostly shorter than their cap
    n = _matmul_params(shape)
    model_parallel = a.tp * a.pp
    per_gpu_tokens = tokens / (a.dp * a.cp)
    micro = max(1, math.ceil(per_gpu_tokens / max(batch.max_token_len_per_gpu, 1)))
    fill = micro / (micro + a.pp - 1)  # the pipeline's bubble
    eff = _tp_efficiency(costs, a.tp) * fill

    per_step = costs.per_sequence_s * samples / r.dp + 2 * shape.params / r.tp / gpu.hbm_bytes_per_s
    if r.tp > 1:
        per_step += 2 * shape.num_layers * costs.allreduce_latency_s
    gen = response * per_step + costs.engine_wake_sleep_s

    forward = 2 * n * per_gpu_tokens / model_parallel / (gpu.peak_flops * _interpolate(costs.forward_mfu, shape.hidden_size) * eff)
    log_probs = forward * (2 if d.use_reference else 1)

    recompute = recompute_enabled(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor.megatron)
    train_flops = (8 if recompute else 6) * n * per_gpu_tokens / model_parallel * batch.ppo_epochs
    update = train_flops / (gpu.peak_flops * _interpolate(costs.train_mfu, shape.hidden_size) * eff)
    grads = 4 * shape.params / model_parallel  # fp32 gradients of this rank's shard
    if a.dp > 1:
        update += grads * (a.dp - 1) / a.dp / gpu.nvlink_bytes_per_s * batch.optimizer_steps_per_step
    optimizer_bytes = 12 * shape.params / model_parallel / (a.dp * a.cp)
    offload = 0.0
    if cfg.actor_rollout_ref.actor.megatron.optimizer_offload:
        offload = 2 * optimizer_bytes / gpu.host_bytes_per_s
    sync = 2 * shape.params / r.tp / gpu.hbm_bytes_per_s
    out = {"gen": gen, "sync": sync, "log_probs": log_probs, "update": update, "optimizer_offload": offload,
           "other": costs.other_s}
    out["step"] = sum(out.values())
    return out


def gpu_named(name: str) -> GPU:
    for key in sorted(GPUS, key=len, reverse=True):
        if key in name.upper():
            return GPUS[key]
    raise ValueError(f"no step-time figures for GPU {name!r}; one of: {', '.join(GPUS)}")
