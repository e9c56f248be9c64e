"""The plan as a table for people and as JSON for benchmarks.

JSON (`hybridrl plan ... --json`), format "hybridrl.plan/1"; every key below is always present (null when it
does not apply, e.g. `phases.train_critic` without a critic, or everything but `ok`/`problems` when the
config itself was refused). All memory values are bytes per GPU.

    format              "hybridrl.plan/1"
    ok                  true when nothing was refused (exit status 0), false otherwise (exit status 2)
    gpu_memory_bytes    --gpu-mem-gb in bytes (GiB = 2**30)
    overhead_bytes      the flat per-GPU allowance (--overhead-gb; 0 on CPU)
    model               name, source, num_layers, hidden_size, ffn_hidden_size, num_attention_heads,
                        num_key_value_heads, head_dim, vocab_size, tie_word_embeddings, params, num_experts,
                        moe_topk, moe_ffn_hidden_size, shared_expert_ffn_hidden_size, expert_params,
                        active_params (the parameters one token runs through; = params for a dense model)
    layout              device, world_size, nnodes, n_gpus_per_node, tp, pp, vpp, cp, dp, sequence_parallel, dtype,
                        use_distributed_optimizer, recompute, train_tokens_per_micro_batch,
                        forward_tokens_per_micro_batch, micro_batches_in_flight, rollout_engine, rollout_tp,
                        rollout_dp, gpu_memory_utilization, free_cache_engine, use_reference, use_critic,
                        ep, etp, expert_dp, alltoall_bytes_per_layer (MoE: one layer's all-to-all receive
                        buffers of a training micro-batch, included in phases.train_actor.activations),
                        rollout_base_resident (LoRA on vLLM: the engine keeps its base on the GPU while asleep,
                        counted as rollout_weights in every phase; rollout.lora_base_resident)
    phases              {train_actor, train_actor_onload, actor_step, train_critic, critic_step, ref_log_prob, rollout,
                        reward}: each {<component>: bytes, ..., total, stage} or null where the job has no such phase
                        (train_actor_onload: the forward/backward while the offloaded optimizer state comes back beside
                        it, only where train_actor leaves that state on the host; memory.py);
                        components: actor_params actor_grads actor_optimizer ref_params critic_params
                        critic_grads critic_optimizer rm_params activations rollout_weights rollout_activations
                        rollout_kv_cache optimizer_step overhead; `stage` is the pipeline stage the numbers are for (the
                        busiest one of that phase)
    peak                {phase, bytes, stage}: the largest phase total
    kv_cache            {bytes, bytes_per_token, tokens, max_model_len, full_length_sequences} (vLLM only)
    problems            [{knob, message}]: why the plan refuses; knob is the config key to change first
    notes               advice that does not refuse (pipeline bubbles, tp across nodes, ...)
    summary             validate()'s RunConfig.summary() text

To compare with a measured run: `phases.<phase>.total - overhead` against torch.cuda.max_memory_allocated()
in that phase (the allocator's view), or `total` against the device's used memory (nvidia-smi / NVML). The trainer's
metrics pair up as memory/train_peak_bytes ~ the largest of train_actor, train_actor_onload and actor_step;
memory/ref_peak_bytes ~ ref_log_prob; memory/reward_peak_bytes ~ reward; memory/rollout_used_bytes ~ rollout. Each
measured peak includes memory/<phase>_cache_held_bytes (cache the allocator cannot return), which only `overhead`
covers.
"""
from __future__ import annotations

from typing import Any, Optional

from hybridrl.config import RunConfig

from .checks import Problem
from .estimate import activation_setup, recompute_enabled
from .memory import COMPONENTS, PHASES, GiB, MemoryPlan, alltoall_bytes
from .model_shape import ModelShape
from .step_time import grouped_experts

FORMAT = "hybridrl.plan/1"
KEYS = ("format", "ok", "gpu_memory_bytes", "overhead_bytes", "model", "layout", "phases", "peak", "kv_cache",
        "problems", "notes", "summary")


def update_peak_total(phases: dict[str, Any]) -> Optional[int]:
    """The plan's bytes for one actor update call, from a `--json` plan's `phases`: the largest of its forward/backward
    (train_actor, train_actor_onload with the optimizer state coming back beside it) and its optimizer step
    (actor_step; older plans lack the later two)."""
    keys = ("train_actor", "train_actor_onload", "actor_step")
    return max((p["total"] for p in (phases.get(k) for k in keys) if p), default=None)


def layout_dict(run: RunConfig, shape: Optional[ModelShape] = None) -> dict[str, Any]:
    d, cfg = run.derived, run.cfg
    a, r = d.actor, cfg.actor_rollout_ref.rollout
    act = activation_setup(run, "actor")
    return {
        "device": d.device, "world_size": d.world_size, "nnodes": cfg.trainer.nnodes,
        "n_gpus_per_node": cfg.trainer.n_gpus_per_node, "tp": a.tp, "pp": a.pp, "vpp": a.vpp, "cp": a.cp, "dp": a.dp,
        "sequence_parallel": a.sequence_parallel, "dtype": a.dtype,
        "use_distributed_optimizer": cfg.actor_rollout_ref.actor.megatron.use_distributed_optimizer,
        "recompute": recompute_enabled(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor.megatron),
        "train_tokens_per_micro_batch": act.train_tokens, "forward_tokens_per_micro_batch": act.forward_tokens,
        "micro_batches_in_flight": min(act.inflight, a.pp), "rollout_engine": d.rollout.engine,
        "rollout_tp": d.rollout.tp, "rollout_dp": d.rollout.dp, "gpu_memory_utilization": r.gpu_memory_utilization,
        "free_cache_engine": r.free_cache_engine, "use_reference": d.use_reference, "use_critic": d.use_critic,
        "ep": a.ep, "etp": a.expert_tp, "expert_dp": a.expert_dp,
        "alltoall_bytes_per_layer": alltoall_bytes(shape, act.train_tokens, act.act_bytes) if shape else 0,
    }


def to_json_dict(run: Optional[RunConfig], shape: Optional[ModelShape], plan: Optional[MemoryPlan],
                 problems: list[Problem], notes: list[str], gpu_memory_bytes: int) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(KEYS)
    out.update(format=FORMAT, ok=not problems, gpu_memory_bytes=gpu_memory_bytes,
               problems=[p.to_dict() for p in problems], notes=list(notes))
    if run is not None:
        out.update(layout=layout_dict(run, shape), summary=run.summary())
    if shape is not None:
        out["model"] = shape.to_dict()
    if plan is not None:
        out.update(overhead_bytes=plan.overhead_bytes, **plan.to_dict())
        if out["layout"] is not None:
            out["layout"]["rollout_base_resident"] = plan.rollout_base_resident
    return out


def table(run: RunConfig, shape: ModelShape, plan: MemoryPlan) -> str:
    """The human-readable plan: model, validate()'s layout summary, and a per-GPU table for each phase."""
    phases = [(n, plan.phases[n]) for n in PHASES if plan.phases.get(n) is not None]
    used = [c for c in COMPONENTS if any(p.parts.get(c) for _, p in phases)]
    where = "host memory per process" if run.derived.device == "cpu" else f"per GPU of {plan.gpu_memory_bytes / GiB:.1f} GiB"
    unit, scale = ("GiB", GiB) if plan.peak.total >= GiB else ("MiB", 1024 ** 2)

    width = max([14] + [len(n) + 2 for n, _ in phases])

    def _g(n: int) -> str:
        return f"{n / scale:{width}.2f}"

    lines = [
        f"model: {shape.name} ({shape.source}): {shape.params / 1e9:.2f}B params, {shape.num_layers} layers, "
        f"hidden {shape.hidden_size}, {shape.num_attention_heads} heads / {shape.num_key_value_heads} KV heads, "
        f"vocab {shape.vocab_size}",
        *([_experts_line(run, shape)] if shape.is_moe else []),
        run.summary(),
        "",
        f"memory, {unit}, {where} (busiest pipeline stage of each phase):",
        f"{'':<22}" + "".join(f"{n:>{width}}" for n, _ in phases),
    ]
    for c in used:
        lines.append(f"{c:<22}" + "".join(_g(p.parts.get(c, 0)) for _, p in phases))
    lines.append(f"{'total':<22}" + "".join(_g(p.total) for _, p in phases))
    lines.append(f"{'pipeline stage':<22}" + "".join(f"{p.stage:>{width}}" for _, p in phases))
    kv = plan.kv_cache
    if kv is not None:
        lines.append(f"KV cache: {max(kv.bytes, 0) / GiB:.2f} GiB = {kv.tokens:,} tokens ({kv.bytes_per_token / 1024:.0f} KiB "
                     f"per token) = {kv.full_length_sequences} sequences of {kv.max_model_len} tokens")
    return "\n".join(lines)


def _experts_line(run: RunConfig, shape: ModelShape) -> str:
    a, act = run.derived.actor, activation_setup(run, "actor")
    buffers = alltoall_bytes(shape, act.train_tokens, act.act_bytes)
    return (f"experts: {shape.num_experts} x top-{shape.moe_topk} of width {shape.moe_ffn_hidden_size}: "
            f"{shape.expert_params / 1e9:.2f}B expert params, {shape.active_params / 1e9:.2f}B active per token; "
            f"{shape.num_experts // max(a.ep, 1)} experts per GPU (ep={a.ep}, etp={a.expert_tp}, expert dp={a.expert_dp}); "
            f"all-to-all buffers {buffers / 2**20:.0f} MiB per MoE layer and micro-batch; "
            + ("one grouped GEMM a layer (transformer-engine)" if grouped_experts(run)
               else "one GEMM per expert (local spec or moe_grouped_gemm=false)"))


def verdict(plan: MemoryPlan, problems: list[Problem], notes: list[str], device: str) -> str:
    lines = [f"note: {n}" for n in notes]
    if problems:
        head = "refused" if len(problems) == 1 else f"refused ({len(problems)} problems)"
        lines.append(f"hybridrl plan: {head}:")
        lines += [f"  - {p.message}" for p in problems]
    elif device == "cuda":
        peak = plan.peak
        lines.append(f"fits: peak {peak.name} {peak.total / GiB:.1f} GiB of {plan.gpu_memory_bytes / GiB:.1f} GiB "
                     f"({(plan.gpu_memory_bytes - peak.total) / GiB:.1f} GiB spare)")
    else:
        lines.append("device=cpu: memory is host RAM per process; no fit check")
    return "\n".join(lines)
