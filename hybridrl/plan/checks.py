"""What the plan refuses: layouts the model's shape does not divide into, and phases that do not fit.

Each Problem names the config key to turn first (`knob`) and says in its message what else would do.
Layout checks that need no model (world % (tp*pp*cp), batch sizes) are validate()'s; these need the shape.
The vocabulary needs no check: the Megatron adapter pads it to a multiple of lcm(64, tp) (memory.padded_vocab).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hybridrl.config import RunConfig

from .memory import GiB, MemoryPlan, Phase
from .model_shape import ModelShape

ARA = "actor_rollout_ref"
TP = f"{ARA}.actor.megatron.tensor_model_parallel_size"
PP = f"{ARA}.actor.megatron.pipeline_model_parallel_size"
VPP = f"{ARA}.actor.megatron.virtual_pipeline_model_parallel_size"
ROLLOUT_TP = f"{ARA}.rollout.tensor_model_parallel_size"
EP = f"{ARA}.actor.megatron.expert_model_parallel_size"
ETP = f"{ARA}.actor.megatron.expert_tensor_parallel_size"
ROLLOUT_EP = f"{ARA}.rollout.expert_parallel_size"
UTIL = f"{ARA}.rollout.gpu_memory_utilization"
RESIDENT = f"{ARA}.rollout.lora_base_resident"


@dataclass(frozen=True)
class Problem:
    knob: Optional[str]  # the config key to change first (None: not a single key)
    message: str

    def to_dict(self) -> dict[str, Optional[str]]:
        return {"knob": self.knob, "message": self.message}


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def valid_tps(shape: ModelShape, run: RunConfig) -> list[int]:
    """Training tp sizes the shape allows within one node (heads and KV heads divide; tp*pp*cp divides world)."""
    a, cfg = run.derived.actor, run.cfg
    per_node = cfg.trainer.n_gpus_per_node
    return [t for t in _divisors(per_node)
            if shape.num_attention_heads % t == 0 and shape.num_key_value_heads % t == 0
            and a.world_size % (t * a.pp * a.cp) == 0]


def valid_pps(shape: ModelShape, run: RunConfig) -> list[int]:
    a = run.derived.actor
    return [p for p in _divisors(shape.num_layers) if a.world_size % (a.tp * p * a.cp) == 0 and p <= a.world_size]


# ------------------------------------------------------------------------------------------------ shape
def shape_problems(run: RunConfig, shape: ModelShape) -> list[Problem]:
    """Divisibility the model imposes on the training and rollout layouts."""
    a, r = run.derived.actor, run.derived.rollout
    out: list[Problem] = []
    tps = ", ".join(map(str, valid_tps(shape, run))) or "none on one node"
    name = f"({shape.name})"
    if shape.num_attention_heads % a.tp:
        out.append(Problem(TP, f"num_attention_heads={shape.num_attention_heads} {name} is not divisible by {TP}={a.tp}: "
                               f"each tp rank holds whole heads; tp sizes that fit this model: {tps}"))
    if shape.num_key_value_heads % a.tp:
        out.append(Problem(TP, f"num_key_value_heads={shape.num_key_value_heads} {name} is not divisible by {TP}={a.tp}: "
                               f"Megatron splits the KV heads over tp ranks; tp sizes that fit this model: {tps}"))
    stages = a.pp * (a.vpp or 1)
    if shape.num_layers % stages:
        pps = ", ".join(map(str, valid_pps(shape, run)))
        what = f"{PP} * {VPP} = {a.pp}*{a.vpp}" if a.vpp else f"{PP}={a.pp}"
        out.append(Problem(PP if not a.vpp else VPP,
                           f"num_hidden_layers={shape.num_layers} {name} is not divisible by {what}: every pipeline "
                           f"(virtual) stage needs the same number of layers; pipeline sizes that fit: {pps}"))
    if shape.num_attention_heads % r.tp:
        out.append(Problem(ROLLOUT_TP, f"num_attention_heads={shape.num_attention_heads} {name} is not divisible by "
                                       f"{ROLLOUT_TP}={r.tp}: vLLM shards whole heads; use a divisor of {shape.num_attention_heads}"))
    g = shape.num_key_value_heads
    if g % r.tp and r.tp % g:
        out.append(Problem(ROLLOUT_TP, f"num_key_value_heads={g} {name} and {ROLLOUT_TP}={r.tp}: vLLM needs one to divide "
                                       f"the other (KV heads are split, or replicated when tp_g > {g})"))
    return out + _expert_problems(run, shape)


def _expert_problems(run: RunConfig, shape: ModelShape) -> list[Problem]:
    a, r, name = run.derived.actor, run.derived.rollout, f"({shape.name})"
    if not shape.is_moe:
        dense = [Problem(EP, f"{EP}={a.ep} / {ETP}={a.etp}: {name} is a dense model without experts; leave them unset")
                 ] if a.ep > 1 or a.etp not in (None, a.tp) else []
        return dense + ([Problem(ROLLOUT_EP, f"{ROLLOUT_EP}={r.ep}: {name} is a dense model without experts; set it "
                                             "to 1")] if r.ep > 1 else [])
    out = []
    if shape.num_experts % r.ep:
        out.append(Problem(ROLLOUT_EP, f"num_experts={shape.num_experts} {name} is not divisible by {ROLLOUT_EP}={r.ep}: "
                                       "vLLM gives every rank of a replica the same number of whole experts; set it "
                                       "to 1 (each expert split over the replica)"))
    if shape.num_experts % a.ep:
        eps = ", ".join(str(e) for e in _divisors(shape.num_experts) if (a.world_size // a.pp) % (e * a.expert_tp) == 0)
        out.append(Problem(EP, f"num_experts={shape.num_experts} {name} is not divisible by {EP}={a.ep}: every ep rank "
                               f"holds the same number of experts; ep sizes that fit: {eps}"))
    if shape.moe_ffn_hidden_size % a.expert_tp:
        out.append(Problem(ETP, f"moe_intermediate_size={shape.moe_ffn_hidden_size} {name} is not divisible by "
                                f"{ETP}={a.expert_tp}: each etp rank holds a slice of every expert's ffn"))
    if a.tp > 1 and not a.sequence_parallel:
        out.append(Problem(f"{ARA}.actor.megatron.sequence_parallel", f"{name}: megatron-core trains mixture-of-experts "
                                                                     f"layers with tp={a.tp} only under sequence parallelism"))
    return out


def shape_notes(run: RunConfig, shape: ModelShape) -> list[str]:
    a, b, cfg = run.derived.actor, run.derived.actor_batch, run.cfg
    notes = []
    if a.tp > cfg.trainer.n_gpus_per_node:
        notes.append(f"{TP}={a.tp} spans nodes (n_gpus_per_node={cfg.trainer.n_gpus_per_node}): tp traffic crosses the "
                     "network every layer; prefer pipeline parallelism across nodes")
    if a.pp > 1 and b.grad_accum is not None and b.grad_accum < a.pp:
        notes.append(f"pipeline of {a.pp} stages with only {b.grad_accum} micro-batch(es) per optimizer step: most of the "
                     f"pipeline idles; lower {ARA}.actor.ppo_micro_batch_size_per_gpu or raise ppo_mini_batch_size")
    if a.tp > 1 and not a.sequence_parallel:
        notes.append(f"{ARA}.actor.megatron.sequence_parallel=false with tp={a.tp}: norm activations are kept whole on "
                     "every tp rank; sequence_parallel=true divides them by tp")
    if run.derived.placement.split:
        notes.append("split placement: the rollout column is one of the rollout's own GPUs (engine only); the training "
                     "columns are the actor's GPUs, which never hold the engine")
    return notes


# ------------------------------------------------------------------------------------------------ fit
@dataclass(frozen=True)
class _Fix:
    knob: str
    text: str
    frees: int  # estimated bytes saved (for ordering)


MEGATRON_KEY = {"actor": f"{ARA}.actor.megatron", "critic": "critic.megatron"}
OFFLOAD_FLAGS = (("params", "param_offload"), ("grads", "grad_offload"), ("optimizer", "optimizer_offload"))


def _offload_fixes(p: dict[str, int], roles: tuple[str, ...], why: str) -> list[_Fix]:
    """Offload flags for what idle roles (and the reference) keep on the GPU in this phase."""
    fixes = [_Fix(f"{MEGATRON_KEY[role]}.{flag}", f"{MEGATRON_KEY[role]}.{flag}=true ({why} {role}'s {part}, "
                  f"{_gib(p[f'{role}_{part}'])})", p[f"{role}_{part}"])
             for role in roles for part, flag in OFFLOAD_FLAGS if p[f"{role}_{part}"]]
    if p["ref_params"]:
        fixes.append(_Fix(f"{ARA}.ref.megatron.param_offload", f"{ARA}.ref.megatron.param_offload=true "
                          f"(the reference, {_gib(p['ref_params'])})", p["ref_params"]))
    if p.get("rm_params"):  # an idle reward model's weights (phases other than reward)
        fixes.append(_Fix("reward_model.megatron.param_offload", "reward_model.megatron.param_offload=true (the "
                          f"reward model, {_gib(p['rm_params'])})", p["rm_params"]))
    return fixes


def _activation_fixes(p: dict[str, int], run: RunConfig, role: str) -> list[_Fix]:
    cfg, act = run.cfg, p["activations"]
    model_key, model = ("critic.model", cfg.critic.model) if role == "critic" else (f"{ARA}.model", cfg.actor_rollout_ref.model)
    batch = run.derived.critic_batch if role == "critic" else run.derived.actor_batch
    fixes = []
    if not model.enable_gradient_checkpointing:
        key = f"{model_key}.enable_gradient_checkpointing"
        fixes.append(_Fix(key, f"{key}=true (full activation recompute; activations are {_gib(act)})", int(act * 0.6)))
    role_key = "critic" if role == "critic" else f"{ARA}.actor"
    if batch.use_dynamic_bsz:
        key, now = f"{role_key}.ppo_max_token_len_per_gpu", batch.max_token_len_per_gpu
    else:
        key, now = f"{role_key}.ppo_micro_batch_size_per_gpu", batch.micro_batch_per_gpu
    fixes.append(_Fix(key, f"a lower {key} (now {now}; activations are {_gib(act)})", act // 2))
    return fixes


def _layout_fixes(p: dict[str, int], run: RunConfig, shape: ModelShape, role: str) -> list[_Fix]:
    a = run.derived.actor
    key = MEGATRON_KEY[role]
    opt = p[f"{role}_optimizer"]
    fixes = []
    shards = a.dp * a.cp
    if not (run.cfg.critic.megatron if role == "critic" else run.cfg.actor_rollout_ref.actor.megatron).use_distributed_optimizer \
            and shards > 1:
        fixes.append(_Fix(f"{key}.use_distributed_optimizer", f"{key}.use_distributed_optimizer=true (shards the "
                          f"{_gib(opt)} of optimizer state over dp*cp={shards})", opt - opt // shards))
    state = p[f"{role}_params"] + p[f"{role}_grads"] + opt
    bigger_tp = [t for t in valid_tps(shape, run) if t > a.tp]
    if bigger_tp:  # the critic follows the actor's layout, so these are always the actor's keys
        fixes.append(_Fix(TP, f"a larger {TP} (now {a.tp}; {', '.join(map(str, bigger_tp))} fit this model and node)",
                          state - state * a.tp // bigger_tp[0]))
    bigger_pp = [q for q in valid_pps(shape, run) if q > a.pp]
    if bigger_pp:
        fixes.append(_Fix(PP, f"a larger {PP} (now {a.pp}; {', '.join(map(str, bigger_pp[:4]))} divide the layers)",
                          state - state * a.pp // bigger_pp[0]))
    fixes.append(_Fix("trainer.nnodes", "more GPUs (trainer.nnodes), so the state splits further", 0))
    return fixes


def _fixes_for_training(phase: Phase, run: RunConfig, shape: ModelShape) -> list[_Fix]:
    p = phase.parts
    role, idle = ("critic", "actor") if phase.name == "train_critic" else ("actor", "critic")
    return (_engine_fixes(p, run) + _offload_fixes(p, (idle,), "the idle") + _activation_fixes(p, run, role)
            + _layout_fixes(p, run, shape, role))


def _engine_fixes(p: dict[str, int], run: RunConfig) -> list[_Fix]:
    engine = p["rollout_weights"] + p["rollout_kv_cache"] + p["rollout_activations"]
    if not engine:
        return []
    if run.cfg.actor_rollout_ref.rollout.free_cache_engine:  # asleep: what stays is a LoRA base kept resident
        return [_Fix(RESIDENT, f"{RESIDENT}=false (the LoRA base goes to host memory while the engine sleeps, frees "
                               f"{_gib(engine)}; a host round trip of it every step)", engine)]
    return [_Fix(f"{ARA}.rollout.free_cache_engine", f"{ARA}.rollout.free_cache_engine=true (vLLM sleeps "
                 f"while training, frees {_gib(engine)})", engine)]


def _fixes_for_step(phase: Phase, run: RunConfig, shape: ModelShape) -> list[_Fix]:
    """An optimizer step (actor_step, critic_step): the role's whole state and no activations (recompute or
    smaller micro-batches do not help here); bf16 grads add their fp32 copies."""
    p = phase.parts
    role, idle = ("critic", "actor") if phase.name == "critic_step" else ("actor", "critic")
    fixes = _engine_fixes(p, run) + _offload_fixes(p, (idle,), "the idle")
    if p["optimizer_step"]:
        key = f"+{MEGATRON_KEY[role]}.override_ddp_config.grad_reduce_in_fp32"
        fixes.append(_Fix(key, f"{key}=true (fp32 grads: +{_gib(p[f'{role}_grads'])} of grads, but the step's "
                               f"fp32 copy of the bf16 grads, {_gib(p['optimizer_step'])}, goes)",
                          p["optimizer_step"] - p[f"{role}_grads"]))
    return fixes + _layout_fixes(p, run, shape, role)


def _fixes_for_ref_pass(phase: Phase, run: RunConfig, shape: ModelShape) -> list[_Fix]:
    """The reference's pass with its params onloaded (its param_offload is already on) beside the actor's state."""
    p, batch = phase.parts, run.derived.actor_batch
    if batch.use_dynamic_bsz:
        key, now = f"{ARA}.ref.log_prob_max_token_len_per_gpu", batch.forward_max_token_len_per_gpu
    else:
        key, now = f"{ARA}.ref.log_prob_micro_batch_size_per_gpu", run.derived.ref_forward_micro_batch_per_gpu
    act = p["activations"]
    fixes = [_Fix(key, f"a lower {key} (now {now}; the forward pass's activations are {_gib(act)})", act // 2),
             _Fix(f"{ARA}.actor.use_kl_loss", f"no reference: {ARA}.actor.use_kl_loss=false and "
                  f"algorithm.use_kl_in_reward=false (frees its {_gib(p['ref_params'])})", p["ref_params"])]
    offload = [f for f in _offload_fixes(p, ("critic",), "the idle") if not f.knob.startswith(f"{ARA}.ref.")]
    return fixes + _engine_fixes(p, run) + offload + _layout_fixes(p, run, shape, "actor")


def _fixes_for_reward(phase: Phase, run: RunConfig) -> list[_Fix]:
    """The reward model's forward pass beside what the idle training roles keep."""
    p, plan = phase.parts, run.derived.reward
    if plan.max_token_len_per_gpu is not None:
        key, now = "reward_model.forward_max_token_len_per_gpu", plan.max_token_len_per_gpu
    else:
        key, now = "reward_model.micro_batch_size_per_gpu", plan.micro_batch_per_gpu
    act = p["activations"]
    fixes = [_Fix(key, f"a lower {key} (now {now}; its forward pass's activations are {_gib(act)})", act // 2)]
    fixes += _engine_fixes(p, run)
    return fixes + [f for f in _offload_fixes(p, ("actor", "critic"), "the idle") if not f.knob.startswith("reward_")]


def _fixes_for_rollout(phase: Phase, run: RunConfig, gpu: int) -> list[_Fix]:
    p = phase.parts
    engine = p["rollout_weights"] + p["rollout_kv_cache"] + p["rollout_activations"]
    kept = phase.total - engine  # what training keeps on the GPU during generation, overhead included
    util = run.cfg.actor_rollout_ref.rollout.gpu_memory_utilization
    max_util = max(gpu - kept, 0) / gpu
    lower = _Fix(UTIL, f"a lower {UTIL} (now {util}; at most {max_util:.2f} fits next to the {_gib(kept)} training "
                       "keeps; the KV cache shrinks with it)", 0)
    return _offload_fixes(p, ("actor", "critic"), "the") + [lower]


def _explain(phase: Phase, gpu: int, fixes: list[_Fix]) -> Problem:
    parts = sorted(((v, k) for k, v in phase.parts.items() if v), reverse=True)[:4]
    biggest = ", ".join(f"{k} {_gib(v)}" for v, k in parts)
    fixes = sorted(fixes, key=lambda f: -f.frees)
    where = f" (pipeline stage {phase.stage})" if phase.stage else ""
    msg = (f"does not fit: the {phase.name} phase needs {_gib(phase.total)} per GPU{where} of {_gib(gpu)} "
           f"(largest: {biggest}); turn one of: " + "; ".join(f.text for f in fixes))
    return Problem(fixes[0].knob if fixes else None, msg)


def fit_problems(plan: MemoryPlan, run: RunConfig, shape: ModelShape) -> list[Problem]:
    """Phases over the GPU's memory, and a KV cache vLLM would refuse to start with."""
    if run.derived.device != "cuda":
        return []
    gpu, out = plan.gpu_memory_bytes, []
    for name in ("train_actor", "actor_step", "train_critic", "critic_step"):
        phase = plan.phases.get(name)
        if phase is not None and phase.total > gpu:
            fixes = _fixes_for_step if name.endswith("_step") else _fixes_for_training
            out.append(_explain(phase, gpu, fixes(phase, run, shape)))
    ref_pass = plan.phases.get("ref_log_prob")
    # a resident reference's pass never exceeds train_actor (memory.py), which already names the fixes
    offloaded = run.cfg.actor_rollout_ref.ref.megatron.param_offload
    if ref_pass is not None and offloaded and ref_pass.total > gpu:
        out.append(_explain(ref_pass, gpu, _fixes_for_ref_pass(ref_pass, run, shape)))
    reward = plan.phases.get("reward")
    if reward is not None and reward.total > gpu:
        out.append(_explain(reward, gpu, _fixes_for_reward(reward, run)))
    rollout = plan.phases["rollout"]
    if rollout is not None and rollout.total > gpu:
        out.append(_explain(rollout, gpu, _fixes_for_rollout(rollout, run, gpu)))
    kv = plan.kv_cache
    r = run.derived.rollout
    util = run.cfg.actor_rollout_ref.rollout.gpu_memory_utilization
    if kv is not None and kv.tokens < kv.max_model_len:
        out.append(Problem(UTIL, f"does not fit: vLLM's share ({UTIL}={util} of {_gib(gpu)}) leaves "
                                 f"{_gib(max(kv.bytes, 0))} for the KV cache = {kv.tokens} tokens, below one sequence of "
                                 f"{kv.max_model_len}; raise {UTIL} or {ROLLOUT_TP} (now {r.tp})"))
    return out
