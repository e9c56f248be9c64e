"""From a validated job (RunConfig) and a model shape to the per-GPU memory plan of memory.py.

This module only maps config keys onto the formulas' inputs; every number it uses comes from the
frozen config or from `validate()`'s derived layout and batch plan (nothing is re-derived here).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from hybridrl.config import RunConfig
from hybridrl.config.lora_checks import VLLM_LORA_RANKS, base_resident_mode, lora_targets

from .memory import (
    DEFAULT_OVERHEAD_BYTES,
    DTYPE_BYTES,
    PHASES,
    ActivationSetup,
    GiB,
    KVCache,
    MemoryPlan,
    ModelState,
    Phase,
    RoleMemory,
    RolloutMemory,
    StageMemory,
    defers_optimizer,
    kv_bytes_per_token,
    model_state_bytes,
    onload_parts,
    onload_reserve,
    phase_parts,
    rollout_activation_bytes,
    rollout_lora_slot_bytes,
    rollout_weight_bytes,
    stage_activation_bytes,
    stage_activation_parts,
    stage_expert_params,
    stage_lora_params,
    stage_params,
)
from .model_shape import ModelShape


def sequence_length(run: RunConfig) -> int:
    return run.cfg.data.max_prompt_length + run.cfg.data.max_response_length


def recompute_enabled(model_cfg: Any, megatron_cfg: Any) -> bool:
    """Full recompute: enable_gradient_checkpointing, or recompute_granularity=full set directly."""
    granularity = (megatron_cfg.override_transformer_config or {}).get("recompute_granularity")
    return bool(model_cfg.enable_gradient_checkpointing) or granularity == "full"


def _tokens(micro: Optional[int], dynamic: bool, max_tokens: int, seq: int, cp: int) -> int:
    """Tokens of one micro-batch on one GPU: padded samples x sequence split over cp, or the dynamic cap."""
    if dynamic or micro is None:
        return max_tokens
    return math.ceil(micro * seq / cp)


def activation_setup(run: RunConfig, role: str) -> ActivationSetup:
    """ActivationSetup of `role` ("actor" or "critic") from its layout and batch plan."""
    d, cfg = run.derived, run.cfg
    layout = d.critic if role == "critic" else d.actor
    batch = d.critic_batch if role == "critic" else d.actor_batch
    assert layout is not None and batch is not None, f"{role} is not part of this job"
    seq = sequence_length(run)
    if role == "critic":
        recompute = recompute_enabled(cfg.critic.model, cfg.critic.megatron)
        forward_micro = batch.forward_micro_batch_per_gpu
    else:
        recompute = recompute_enabled(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor.megatron)
        candidates = [m for m in (batch.forward_micro_batch_per_gpu, d.ref_forward_micro_batch_per_gpu) if m]
        forward_micro = max(candidates) if candidates else None
    train = _tokens(batch.micro_batch_per_gpu, batch.use_dynamic_bsz, batch.max_token_len_per_gpu, seq, layout.cp)
    forward = _tokens(forward_micro, batch.use_dynamic_bsz, batch.forward_max_token_len_per_gpu, seq, layout.cp)
    return ActivationSetup(
        tp=layout.tp, pp=layout.pp, vpp=layout.vpp, sequence_parallel=layout.sequence_parallel, recompute=recompute,
        act_bytes=DTYPE_BYTES[layout.dtype], train_tokens=train, forward_tokens=forward,
        inflight=batch.grad_accum or layout.pp, logits=role != "critic", etp=layout.expert_tp,
    )


def _role_memory(run: RunConfig, role: str, shape: ModelShape, stage: int) -> RoleMemory:
    d, cfg = run.derived, run.cfg
    ara = cfg.actor_rollout_ref
    layout = d.critic if role == "critic" else d.actor
    assert layout is not None
    megatron = {"actor": ara.actor.megatron, "ref": ara.ref.megatron, "critic": cfg.critic.megatron}[role]
    gpu = d.device == "cuda"
    dtype_bytes = DTYPE_BYTES[megatron.dtype] if gpu else 4
    params = stage_params(shape, layout.tp, layout.pp, stage, lm_head=role != "critic", ep=layout.ep,
                          etp=layout.expert_tp)
    experts = stage_expert_params(shape, layout.pp, layout.ep, layout.expert_tp)  # MoE: sharded over expert dp
    optim = cfg.critic.optim if role == "critic" else ara.actor.optim
    distributed = megatron.use_distributed_optimizer
    grad_fp32 = bool((megatron.override_ddp_config or {}).get("grad_reduce_in_fp32", True))
    shards = layout.dp * layout.cp if distributed else 1
    lora = ara.model.lora_rank if role == "actor" else 0
    state = model_state_bytes(params - experts, dtype_bytes, grad_fp32=grad_fp32, optimizer=optim.optimizer,
                              optimizer_shards=shards, trainable=role != "ref" and not lora)
    if lora:  # a frozen base (params only) plus the adapters, which alone have grads and optimizer state
        targets = lora_targets(ara.model.target_modules, ara.model.exclude_modules)
        adapters = model_state_bytes(stage_lora_params(shape, lora, targets, layout.tp, layout.pp), dtype_bytes,
                                     grad_fp32=grad_fp32, optimizer=optim.optimizer, optimizer_shards=shards)
        state = ModelState(state.params + adapters.params, adapters.grads, adapters.optimizer, adapters.step)
    if experts:
        routed = model_state_bytes(experts, dtype_bytes, grad_fp32=grad_fp32, optimizer=optim.optimizer,
                                   optimizer_shards=layout.expert_dp if distributed else 1,
                                   trainable=role != "ref" and not lora)
        state = ModelState(state.params + routed.params, state.grads + routed.grads, state.optimizer + routed.optimizer,
                           state.step + routed.step)
    return RoleMemory(state, offload_params=gpu and megatron.param_offload, offload_grads=gpu and megatron.grad_offload,
                      offload_optimizer=gpu and megatron.optimizer_offload)


def _adapter_sync(run: RunConfig) -> bool:
    """The colocated engine takes LoRA adapters apart from the base (hybridrl.config.lora_checks.rollout_lora)."""
    model = run.cfg.actor_rollout_ref.model
    return model.lora_rank > 0 and not model.lora.merge and not run.derived.placement.split


def _can_keep_base(run: RunConfig) -> bool:
    """rollout.lora_base_resident applies: vLLM on GPUs, adapters synced alone, the engine asleep while training."""
    d = run.derived
    return (d.device == "cuda" and d.rollout.engine == "vllm" and _adapter_sync(run)
            and run.cfg.actor_rollout_ref.rollout.free_cache_engine)


def _rollout_memory(run: RunConfig, shape: ModelShape, gpu_memory_bytes: int,
                    base_resident: bool = False) -> tuple[RolloutMemory, Optional[KVCache]]:
    d, r = run.derived, run.cfg.actor_rollout_ref.rollout
    dtype_bytes = DTYPE_BYTES.get(r.dtype, 2) if d.device == "cuda" else 4
    weights = rollout_weight_bytes(shape, d.rollout.tp, dtype_bytes)
    max_model_len = r.max_model_len or sequence_length(run)
    if d.rollout.engine != "vllm":  # the torch engine: its own weights, a KV cache sized per batch (not planned)
        return RolloutMemory(weights, 0, 0, r.free_cache_engine), None
    if _adapter_sync(run):  # vLLM's LoRA slots, allocated with the base (memory.py)
        model = run.cfg.actor_rollout_ref.model
        max_rank = next((k for k in VLLM_LORA_RANKS if k >= model.lora_rank), model.lora_rank)
        weights += rollout_lora_slot_bytes(shape, max_rank, lora_targets(model.target_modules, model.exclude_modules),
                                           d.rollout.tp, dtype_bytes)
    activations = rollout_activation_bytes(shape, d.rollout.tp, dtype_bytes, r.max_num_batched_tokens, r.max_num_seqs,
                                           r.enforce_eager)
    kv_bytes = int(r.gpu_memory_utilization * gpu_memory_bytes) - weights - activations
    per_token = kv_bytes_per_token(shape, d.rollout.tp, dtype_bytes)
    kv = KVCache(kv_bytes, per_token, max(kv_bytes, 0) // per_token, max_model_len)
    return RolloutMemory(weights, activations, kv_bytes, r.free_cache_engine, weights if base_resident else 0), kv


def _reward_model(run: RunConfig, shape: ModelShape, stage: int) -> tuple[RoleMemory, int]:
    """The reward model's params on `stage` (params only, the scalar head) and its forward pass's activations."""
    d, rm = run.derived, run.cfg.reward_model
    layout, plan = d.reward.layout, d.reward
    gpu = d.device == "cuda"
    dtype_bytes = DTYPE_BYTES[rm.megatron.dtype] if gpu else 4
    params = stage_params(shape, layout.tp, layout.pp, stage, lm_head=False, ep=layout.ep, etp=layout.expert_tp)
    state = model_state_bytes(params, dtype_bytes, trainable=False)
    seq = (plan.max_length or sequence_length(run)) + 1  # + the scored column (adapters/megatron/reward_model.py)
    tokens = _tokens(plan.micro_batch_per_gpu, plan.max_token_len_per_gpu is not None,
                     plan.max_token_len_per_gpu or 0, seq, layout.cp)
    setup = ActivationSetup(tp=layout.tp, pp=layout.pp, vpp=layout.vpp, sequence_parallel=layout.sequence_parallel,
                            recompute=False, act_bytes=DTYPE_BYTES[layout.dtype], train_tokens=tokens,
                            forward_tokens=tokens, inflight=1, logits=False, etp=layout.expert_tp)
    return RoleMemory(state, offload_params=gpu and rm.megatron.param_offload), stage_activation_parts(shape, setup, stage)[1]


def estimate(run: RunConfig, shape: ModelShape, gpu_memory_bytes: int,
             overhead_bytes: int = DEFAULT_OVERHEAD_BYTES, critic_shape: Optional[ModelShape] = None,
             rm_shape: Optional[ModelShape] = None) -> MemoryPlan:
    """The per-GPU memory plan of `run` for a model of `shape` on GPUs of `gpu_memory_bytes` (`rm_shape`: the reward
    model's, when reward_model.enable; planned as the actor's shape, with a note, when not given).

    LoRA on vLLM (rollout.lora_base_resident): true plans the engine's base on the GPU in every phase; auto does so
    where every phase then fits, else plans vLLM's level-1 sleep (nothing kept); `rollout_base_resident` says which,
    and the engine is built accordingly (hybridrl.workers.common.build_rollout_engine)."""
    args = (run, shape, gpu_memory_bytes, overhead_bytes, critic_shape, rm_shape)
    mode = base_resident_mode(run.cfg.actor_rollout_ref.rollout.lora_base_resident)
    if mode is False or not _can_keep_base(run):
        return _estimate(*args, base_resident=False)
    kept = _estimate(*args, base_resident=True)
    too_big = [p for p in kept.phases.values() if p is not None and p.total > gpu_memory_bytes]
    base = kept.phases["rollout"].parts["rollout_weights"] / GiB
    if mode or not too_big:
        why = "true" if mode else "auto: every phase fits with it"
        note = (f"LoRA: the rollout engine keeps its base ({base:.1f} GiB) on the GPU while it sleeps, only its KV "
                f"cache is freed (rollout.lora_base_resident={why}; counted in every phase)")
        return dataclasses.replace(kept, notes=kept.notes + [note])
    plan = _estimate(*args, base_resident=False)
    worst = max(too_big, key=lambda p: p.total)
    note = (f"LoRA: the rollout engine's base ({base:.1f} GiB) goes to host memory at every sleep and back at every "
            f"wake (rollout.lora_base_resident=auto: kept on the GPU, {worst.name} would need {worst.total / GiB:.1f} "
            f"of {gpu_memory_bytes / GiB:.1f} GiB)")
    return dataclasses.replace(plan, notes=plan.notes + [note])


def _estimate(run: RunConfig, shape: ModelShape, gpu_memory_bytes: int, overhead_bytes: int,
              critic_shape: Optional[ModelShape], rm_shape: Optional[ModelShape], base_resident: bool) -> MemoryPlan:
    d = run.derived
    critic_shape = critic_shape or shape
    notes = []
    if d.reward.model and rm_shape is None:
        rm_shape = shape
        notes.append("the reward model is planned with the actor's shape (pass --reward-model-config for its own)")
    overhead = overhead_bytes if d.device == "cuda" else 0
    rollout, kv = _rollout_memory(run, shape, gpu_memory_bytes, base_resident)
    actor_act = activation_setup(run, "actor")
    critic_act = activation_setup(run, "critic") if d.use_critic else None
    best: dict[str, Optional[Phase]] = {name: None for name in PHASES}
    optimizer_bytes: dict[int, int] = {}  # the actor's whole optimizer state by stage (train_actor_onload's note)
    lora = run.cfg.actor_rollout_ref.model.lora_rank > 0
    for stage in range(d.actor.pp):
        actor_train, actor_forward = stage_activation_parts(shape, actor_act, stage)
        s = StageMemory(
            actor=_role_memory(run, "actor", shape, stage),
            # LoRA: the reference is the actor with its adapters off, no weights of its own
            ref=_role_memory(run, "ref", shape, stage) if d.use_reference and not lora else None,
            critic=_role_memory(run, "critic", critic_shape, stage) if d.use_critic else None,
            actor_activations=max(actor_train, actor_forward),
            critic_activations=stage_activation_bytes(critic_shape, critic_act, stage) if critic_act else 0,
            forward_activations=actor_forward,
            actor_steps_per_update=d.actor_batch.optimizer_steps_per_step,
        )
        if d.reward.model and stage < d.reward.layout.pp:
            rm, rm_act = _reward_model(run, rm_shape, stage)
            s = dataclasses.replace(s, rm=rm, rm_activations=rm_act)
        for name in PHASES:
            if name in ("train_critic", "critic_step") and not d.use_critic:
                continue
            if name == "ref_log_prob" and s.ref is None:
                continue
            if name == "reward" and s.rm is None:
                continue
            if name == "train_actor_onload":
                overlap = run.cfg.actor_rollout_ref.actor.megatron.optimizer_onload_overlap
                if d.device != "cuda" or not overlap or not defers_optimizer(s, d.placement.split):
                    continue
                # the update's own activations: the forward-only passes (folded into train_actor) are over by then
                train = {**phase_parts("train_actor", s, rollout, overhead, split=d.placement.split),
                         "activations": actor_train}
                parts = onload_parts(train, s.actor.state.optimizer, gpu_memory_bytes)
                optimizer_bytes[stage] = s.actor.state.optimizer
            else:
                parts = phase_parts(name, s, rollout, overhead, split=d.placement.split)
            phase = Phase(name, stage, parts)
            if best[name] is None or phase.total > best[name].total:
                best[name] = phase
    onload = best["train_actor_onload"]
    if onload is not None:
        notes.append(_onload_note(onload, optimizer_bytes[onload.stage], run))
    return MemoryPlan(gpu_memory_bytes, overhead, best, kv, notes, rollout_base_resident=base_resident)


def _onload_note(phase: Phase, whole: int, run: RunConfig) -> str:
    """How much of the actor's offloaded optimizer state (`whole` bytes) comes back during the forward/backward."""
    overlapped = phase.parts["actor_optimizer"]
    if overlapped >= whole:
        return (f"the actor's optimizer state ({whole / GiB:.1f} GiB) comes back from the host during the "
                "forward/backward (train_actor_onload): the optimizer step waits for none of it")
    batch = run.derived.actor_batch
    key = "ppo_max_token_len_per_gpu" if batch.use_dynamic_bsz else "ppo_micro_batch_size_per_gpu"
    return (f"{overlapped / GiB:.1f} of the actor's {whole / GiB:.1f} GiB of optimizer state comes back from the host "
            f"during the forward/backward (train_actor_onload); the optimizer step waits for the other "
            f"{(whole - overlapped) / GiB:.1f} GiB (smaller activations, e.g. a lower actor_rollout_ref.actor.{key}, "
            "let more of it overlap)")


def actor_onload_reserve(run: RunConfig, shape: ModelShape) -> int:
    """Device bytes the actor's forward/backward needs beyond what is resident when an update starts (its largest
    training activations over the pipeline stages, plus memory.onload_margin): MegatronRole's overlap budget keeps
    them free."""
    setup = activation_setup(run, "actor")
    return onload_reserve(max(stage_activation_parts(shape, setup, stage)[0] for stage in range(run.derived.actor.pp)))
