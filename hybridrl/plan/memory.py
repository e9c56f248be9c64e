"""Per-GPU memory of a job, phase by phase, from the validated layout and the model's shape.

Notation (per GPU unless said): P params of a pipeline stage after tp sharding; L layers, h hidden,
f MLP width, a heads, g KV heads, d head dim, q = a*d, kv = g*d, V vocab; tp, pp, vpp, cp, dp the
Megatron layout; tp_g the rollout tensor parallel size; b the bytes of the training dtype (bf16: 2);
T tokens of one micro-batch on one GPU; M micro-batches per optimizer step on one dp rank.

Model state (Megatron, mixed precision):
    params    = P * b
    grads     = P * 4                         (fp32 grad buffer, `grad_reduce_in_fp32`, verl's default;
                                               P * b when override_ddp_config.grad_reduce_in_fp32=false)
    optimizer = P * (8 + 4 [if b < 4]) / S    (Adam exp_avg + exp_avg_sq in fp32, fp32 master params when
                                               training in bf16/fp16; SGD keeps 4 for momentum;
                                               S = dp * cp with the distributed optimizer, else 1)
    optimizer_step = P * 4 / S                (bf16 grads only: the distributed optimizer's fp32 copy of each
                                               grad shard, alive during the step; torch's AdamW runs fused, which
                                               needs no temporary: benchmarks/results/adam_mem.md)
P of stage i = ceil(L/pp) * (W_layer/tp + 2h) + [i = 0] * Vp*h/tp + [i = pp-1] * (h + [untied or pp > 1] * Vp*h/tp),
W_layer = h*(q + 2kv) + q*h (+ q + 2kv of QKV bias) + 3*h*f (SwiGLU), Vp = V padded up to a multiple of
lcm(64, tp) as the Megatron adapter builds it (so any tp works; the padded rows are masked).
Mixture of experts (E experts of width fe, top-k, shared expert fs; ep x etp expert layout): a layer adds
E*3*h*fe/(ep*etp) routed-expert params and E*h (+ h) replicated router (+ shared gate); 3*h*fs takes the
MLP's place in W_layer. The distributed optimizer shards the experts' state over the expert data-parallel
ranks (tp*cp*dp/(ep*etp)), the rest over dp*cp. Activations of an MoE layer replace 5f/tp with
5fs/tp + k*(3fe/etp + h) (each token's k expert computations and its k dispatched copies; balanced
routing; the routed experts' 3fe is not measured, unlike the dense MLP's 5f) + 4E/b (fp32 router logits), plus one layer's all-to-all receive buffers in flight
(`alltoall_bytes`: dispatch and combine, T*k*h*b each).

Activations kept for the backward pass of one layer and one micro-batch (flash attention, no dropout):
    A_layer = T * (b * (4h/s + (2q + 2kv)/tp + 5f/tp) + 4a/tp)
      4h/s: the inputs and outputs of the two RMSNorms (s = tp with sequence parallelism, else 1);
      (q + 2kv)/tp: Q, K, V; q/tp: the attention output; 5f/tp: megatron's unfused SwiGLU,
      SiLU(gate) * (up + glu_linear_offset), keeps the gate+up output, SiLU(gate), up + offset (a new tensor
      even for offset 0) and the product (2f/tp for a plain MLP);
      4a/tp: fp32 log-sum-exp per head kept by flash attention.
    with full recompute (actor_rollout_ref.model.enable_gradient_checkpointing): T*b*h/s per layer (its input)
      plus one layer's A_layer while it is recomputed.
  A stage running 1F1B holds min(pp - i, M) micro-batches in flight on stage i (interleaved with vpp:
  times 1 + (pp-1)/(pp*vpp), Korthikanti et al. 2022), each over ceil(L/pp) layers.
  The last stage adds the logits: T * Vp/tp * (b + 4 + 4) (bf16 logits, their fp32 log-softmax and its
  fp32 gradient). A forward-only pass (old/ref log-probs, values) keeps one layer's A_layer plus
  T_fwd * Vp/tp * (b + 4); the phase counts the larger of the two.

Rollout engine (vLLM, colocated):
    vLLM takes gpu_memory_utilization * GPU for itself: its weights (P_g * b_g, the model split over tp_g),
    its profiling peak (max_num_batched_tokens * b_g * (2h + (q + 2kv + 2f)/tp_g) for a forward,
    max_num_seqs * V * 8 for fp32 logits and probabilities in the sampler, 0.5 GiB of CUDA graphs
    unless enforce_eager), and the rest as KV cache:
    KV per token = 2 * L * ceil(g/tp_g) * d * b_g   (K and V; KV heads are replicated when tp_g > g)
    With LoRA adapters synced alone (model.lora_rank > 0, lora.merge=false) its weights add the adapter slots vLLM
    allocates beside the base: A [R, in] and B [out, R] per wrapped module (q/k/v and gate/up wrapped as packs), split
    over tp_g as the actor's adapters are over tp, R = vLLM's max_lora_rank (the smallest of its ranks >= r).
    While asleep (free_cache_engine=true) it holds nothing, except a LoRA base kept resident
    (rollout.lora_base_resident; auto: where every phase fits with it, estimate.py): then its weights (base and
    slots) stay in every phase, only the KV cache and activations go. Otherwise its whole share stays.

Phases (each component is 0 when absent; totals are for the busiest pipeline stage):
    train_actor   the actor's forward/backward: actor params+grads + activations, plus whatever idle roles keep;
                  with the hybrid engine, optimizer_offload and one optimizer step per update the optimizer state
                  is still on the host (weight_sync.py, step 9: it comes back for the step), else it is counted
                  here too
    train_actor_onload  (the case train_actor leaves the optimizer state on the host) the update's forward/backward
                  while the state comes back beside it (adapters/megatron/overlap.py): train_actor with the training
                  activations only (the forward-only passes are over), + as much of the actor's optimizer state as fits
                  in the GPU less that less `onload_margin`; the rest comes back after the backward, while the step
                  waits (none of it fits: today's serial path). The update sends for what the device has free at its
                  start beyond `onload_reserve` (activations + margin).
    actor_step    the actor's optimizer step: its whole state + optimizer_step, no activations (freed by then)
    train_critic  the critic's update (PPO with GAE): its whole state (the critic's idle offload brings all of it
                  back for its calls) + activations
    critic_step   the critic's optimizer step: its whole state + optimizer_step, no activations
    ref_log_prob  the reference's log-prob pass (every job with a reference of its own; memory/ref_peak_bytes is
                  measured against it): the reference's params (onloaded for the pass with ref.megatron.param_offload)
                  beside the actor's params and grads (and its optimizer state unless optimizer_offload left it on
                  the host), plus a forward-only pass's activations. Without param_offload it never exceeds
                  train_actor, which counts the same state and the larger of the two passes' activations
    rollout       generation: vLLM's share + what the training roles keep after offload (a split placement,
                  actor_rollout_ref.hybrid_engine=false: one of the rollout's own GPUs, vLLM's share only)
    reward        the reward model's forward pass (reward_model.enable): its params (params only: it never trains;
                  P counted with the scalar head, in reward_model.megatron.dtype) beside what the idle training
                  roles keep, plus one forward-only micro-batch of its activations (no logits); the rollout engine
                  is asleep by then. An idle reward model keeps its params unless reward_model.megatron.param_offload
                  (on by default)
An idle role keeps params/grads/optimizer unless its megatron.{param,grad,optimizer}_offload is set (the
reference has params only). During rollout the hybrid engine releases the actor's grads before vLLM wakes
(hybridrl/hybrid/weight_sync.py, step 1); its optimizer state goes to the host only with optimizer_offload, its
params only with param_offload. Every phase adds `overhead` (CUDA context, NCCL communicators, allocator
slack), a flat estimate. On CPU (trainer.device=cpu) the same numbers are host memory per process:
float32, offload has no effect and the torch rollout engine keeps no preallocated KV cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from .model_shape import ModelShape

GiB = 1024 ** 3
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
CUDA_GRAPH_BYTES = GiB // 2
# The Megatron adapter pads the vocabulary to a multiple of lcm(this, tp) (adapters/megatron/hf_config.py,
# VOCAB_PAD_MULTIPLE; a test keeps the two equal).
MEGATRON_VOCAB_MULTIPLE = 64
DEFAULT_OVERHEAD_BYTES = 3 * GiB

COMPONENTS = (
    "actor_params", "actor_grads", "actor_optimizer", "ref_params",
    "critic_params", "critic_grads", "critic_optimizer", "rm_params", "activations",
    "rollout_weights", "rollout_activations", "rollout_kv_cache", "optimizer_step", "overhead",
)
PHASES = ("train_actor", "train_actor_onload", "actor_step", "train_critic", "critic_step", "ref_log_prob", "rollout",
          "reward")
ONLOAD_MARGIN_BYTES = 2 * GiB  # kept free beside an overlapped onload: allocator slack (plus a tenth of the activations)


# ------------------------------------------------------------------------------------------- model state
def padded_vocab(vocab_size: int, tp: int) -> int:
    """Vp: the vocabulary rows Megatron allocates (a multiple of lcm(64, tp))."""
    multiple = math.lcm(MEGATRON_VOCAB_MULTIPLE, tp)
    return -(-vocab_size // multiple) * multiple


def stage_expert_params(shape: ModelShape, pp: int, ep: int = 1, etp: int = 1) -> int:
    """Routed-expert parameters held by one GPU of a pipeline stage (0 for a dense model)."""
    return math.ceil(shape.num_layers / pp) * math.ceil(shape.layer_expert_params() / (ep * etp))


def stage_params(shape: ModelShape, tp: int, pp: int, stage: int, lm_head: bool = True, ep: int = 1,
                 etp: Optional[int] = None) -> int:
    """Parameters held by one GPU of pipeline stage `stage` (see the module docstring).

    `lm_head=False` is the critic: a scalar value head (h weights) replaces the output layer.
    """
    layers = math.ceil(shape.num_layers / pp)
    n = layers * (math.ceil(shape.layer_sharded_params() / tp) + shape.layer_replicated_params())
    n += stage_expert_params(shape, pp, ep, etp or tp)
    vocab_shard = padded_vocab(shape.vocab_size, tp) // tp * shape.hidden_size
    if stage == 0:
        n += vocab_shard
    if stage == pp - 1:
        n += shape.hidden_size  # final norm
        if not lm_head:
            n += shape.hidden_size
        elif not shape.tie_word_embeddings or pp > 1:  # tied + pp>1: the last stage keeps a copy to compute logits
            n += vocab_shard
    return n


def stage_lora_params(shape: ModelShape, rank: int, targets: tuple[str, ...], tp: int, pp: int) -> int:
    """LoRA adapter parameters on one GPU of a pipeline stage (adapters/megatron/lora.py): A [r, in] and B [out, r]
    per targeted module; column-parallel modules (q, k, v, gate, up) split B over tp, row-parallel ones (o, down) A."""
    h, q, kv, f = shape.hidden_size, shape.q_width, shape.kv_width, shape.ffn_hidden_size
    dims = {"q_proj": (h, q, "column"), "k_proj": (h, kv, "column"), "v_proj": (h, kv, "column"),
            "o_proj": (q, h, "row"), "gate_proj": (h, f, "column"), "up_proj": (h, f, "column"),
            "down_proj": (f, h, "row")}
    per_layer = 0
    for module in targets:
        fan_in, fan_out, style = dims[module]
        per_layer += rank * (fan_in + fan_out // tp if style == "column" else fan_in // tp + fan_out)
    return math.ceil(shape.num_layers / pp) * per_layer


@dataclass(frozen=True)
class ModelState:
    params: int
    grads: int
    optimizer: int
    step: int = 0  # what the optimizer step adds for its duration (not in `total`): fp32 copies of bf16 grads

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def model_state_bytes(params: int, dtype_bytes: int, *, grad_fp32: bool = True, optimizer: str = "adam",
                      optimizer_shards: int = 1, trainable: bool = True) -> ModelState:
    """Bytes of params, grads and optimizer state for `params` parameters (module docstring formulas)."""
    if not trainable:
        return ModelState(params * dtype_bytes, 0, 0)
    per_param = (8 if optimizer == "adam" else 4) + (4 if dtype_bytes < 4 else 0)
    grad_bytes = 4 if grad_fp32 else dtype_bytes
    return ModelState(
        params=params * dtype_bytes,
        grads=params * grad_bytes,
        optimizer=math.ceil(params * per_param / max(optimizer_shards, 1)),
        step=math.ceil(params * 4 / max(optimizer_shards, 1)) if grad_bytes < 4 else 0,
    )


# ------------------------------------------------------------------------------------------- activations
def mlp_kept_per_token(gated: bool) -> int:
    """Values per token and unit of MLP width that megatron's MLP keeps for its backward (bias_activation_fusion
    off). Gated: the fc1 output (gate and up: 2), SiLU(gate), up + glu_linear_offset (megatron adds the offset
    out of place, even 0) and the product, fc2's input; plain: fc1's output and the activation's. Measured on
    megatron-core 0.16.1's MLP in tests/dist/test_megatron_memory_knobs.py (the 1.5B and 3B H200 scale rows ran
    18% above the plan while it counted 3)."""
    return 5 if gated else 2


def layer_activation_bytes(shape: ModelShape, tokens: int, tp: int, sequence_parallel: bool, act_bytes: int,
                           etp: Optional[int] = None) -> int:
    """A_layer: what one layer keeps for its backward pass for `tokens` tokens."""
    s = tp if sequence_parallel else 1
    mlp = mlp_kept_per_token(shape.gated_mlp) * (shape.shared_expert_ffn_hidden_size if shape.is_moe else shape.ffn_hidden_size)
    per_token = (act_bytes * (4 * shape.hidden_size / s + (2 * shape.q_width + 2 * shape.kv_width + mlp) / tp)
                 + 4 * shape.num_attention_heads / tp)
    if shape.is_moe:
        routed = shape.moe_topk * (3 * shape.moe_ffn_hidden_size / (etp or tp) + shape.hidden_size)
        per_token += act_bytes * routed + 4 * shape.num_experts
    return math.ceil(tokens * per_token)


def alltoall_bytes(shape: ModelShape, tokens: int, act_bytes: int) -> int:
    """One MoE layer's all-to-all receive buffers in flight: the dispatched and the combined token copies."""
    return 2 * tokens * shape.moe_topk * shape.hidden_size * act_bytes if shape.is_moe else 0


def layer_input_bytes(shape: ModelShape, tokens: int, tp: int, sequence_parallel: bool, act_bytes: int) -> int:
    """What a fully recomputed layer keeps: its input."""
    s = tp if sequence_parallel else 1
    return math.ceil(tokens * act_bytes * shape.hidden_size / s)


def logits_bytes(shape: ModelShape, tokens: int, tp: int, act_bytes: int, backward: bool = True) -> int:
    """Logits of the last stage: activation-dtype logits + fp32 log-softmax (+ its fp32 grad when training)."""
    return tokens * (padded_vocab(shape.vocab_size, tp) // tp) * (act_bytes + 4 + (4 if backward else 0))


@dataclass(frozen=True)
class ActivationSetup:
    """What the activation estimate needs from the layout and batch plan of one role."""

    tp: int
    pp: int
    vpp: Optional[int]
    sequence_parallel: bool
    recompute: bool
    act_bytes: int
    train_tokens: int  # T: tokens of one training micro-batch on one GPU
    forward_tokens: int  # T_fwd: tokens of one forward-only micro-batch (log-probs, values)
    inflight: int  # M: micro-batches per optimizer step on one dp rank
    logits: bool = True  # False for the critic (a scalar value head)
    etp: Optional[int] = None  # MoE: expert tensor parallel size (None: tp)


def stage_activation_bytes(shape: ModelShape, a: ActivationSetup, stage: int) -> int:
    """Peak activation bytes on pipeline stage `stage`: max(training micro-batches in flight, forward-only)."""
    return max(stage_activation_parts(shape, a, stage))


def stage_activation_parts(shape: ModelShape, a: ActivationSetup, stage: int) -> tuple[int, int]:
    """(training, forward-only) activation bytes on pipeline stage `stage`."""
    layers = math.ceil(shape.num_layers / a.pp)
    full = layer_activation_bytes(shape, a.train_tokens, a.tp, a.sequence_parallel, a.act_bytes, a.etp)
    held = min(a.pp - stage, max(a.inflight, 1))
    factor = 1 + (a.pp - 1) / (a.pp * a.vpp) if a.vpp and a.pp > 1 else 1.0
    if a.recompute:
        kept = layer_input_bytes(shape, a.train_tokens, a.tp, a.sequence_parallel, a.act_bytes)
        train = math.ceil(layers * held * factor * kept) + full
    else:
        train = math.ceil(layers * held * factor * full)
    last = stage == a.pp - 1
    train += alltoall_bytes(shape, a.train_tokens, a.act_bytes)
    if last and a.logits:
        train += logits_bytes(shape, a.train_tokens, a.tp, a.act_bytes, backward=True)
    forward = layer_activation_bytes(shape, a.forward_tokens, a.tp, a.sequence_parallel, a.act_bytes, a.etp)
    forward += alltoall_bytes(shape, a.forward_tokens, a.act_bytes)
    if last and a.logits:
        forward += logits_bytes(shape, a.forward_tokens, a.tp, a.act_bytes, backward=False)
    return train, forward


# ------------------------------------------------------------------------------------------- rollout
def kv_bytes_per_token(shape: ModelShape, tp_g: int, dtype_bytes: int) -> int:
    """KV cache bytes of one token on one GPU: K and V of every layer, this GPU's KV heads."""
    return 2 * shape.num_layers * math.ceil(shape.num_key_value_heads / tp_g) * shape.head_dim * dtype_bytes


def rollout_weight_bytes(shape: ModelShape, tp_g: int, dtype_bytes: int) -> int:
    """The rollout engine's copy of the weights on one GPU (tensor parallel over tp_g, no pipeline)."""
    n = shape.num_layers * (math.ceil((shape.layer_sharded_params() + shape.layer_expert_params()) / tp_g)
                            + shape.layer_replicated_params())  # vLLM splits every expert's ffn over tp_g
    heads = 1 if shape.tie_word_embeddings else 2
    n += heads * math.ceil(shape.vocab_size / tp_g) * shape.hidden_size + shape.hidden_size
    return n * dtype_bytes


def rollout_lora_slot_bytes(shape: ModelShape, max_rank: int, targets: tuple[str, ...], tp_g: int,
                            dtype_bytes: int) -> int:
    """vLLM's LoRA slot buffers on one GPU (max_loras 1): every member of a wrapped pack (qkv_proj, gate_up_proj)
    gets a slot when any member is targeted."""
    packs = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("o_proj",), ("down_proj",))
    wrapped = tuple(m for pack in packs if set(pack) & set(targets) for m in pack)
    return stage_lora_params(shape, max_rank, wrapped, tp_g, 1) * dtype_bytes


def rollout_activation_bytes(shape: ModelShape, tp_g: int, dtype_bytes: int, max_num_batched_tokens: int,
                             max_num_seqs: int, enforce_eager: bool) -> int:
    """vLLM's profiling peak outside weights and KV cache (forward of a full batch, sampler, CUDA graphs)."""
    ffn = (shape.moe_topk * shape.moe_ffn_hidden_size + shape.shared_expert_ffn_hidden_size if shape.is_moe
           else shape.ffn_hidden_size)  # MoE: each token's k experts (the fused kernel's intermediate)
    width = 2 * shape.hidden_size + (shape.q_width + 2 * shape.kv_width + 2 * ffn) / tp_g
    forward = math.ceil(max_num_batched_tokens * dtype_bytes * width)
    sampler = max_num_seqs * shape.vocab_size * 8
    return forward + sampler + (0 if enforce_eager else CUDA_GRAPH_BYTES)


@dataclass(frozen=True)
class KVCache:
    bytes: int
    bytes_per_token: int
    tokens: int
    max_model_len: int

    @property
    def full_length_sequences(self) -> int:
        return self.tokens // max(self.max_model_len, 1)

    def to_dict(self) -> dict[str, int]:
        return {"bytes": self.bytes, "bytes_per_token": self.bytes_per_token, "tokens": self.tokens,
                "max_model_len": self.max_model_len, "full_length_sequences": self.full_length_sequences}


# ------------------------------------------------------------------------------------------- phases
@dataclass(frozen=True)
class Phase:
    """Per-GPU bytes of each component on the busiest pipeline stage of one phase."""

    name: str
    stage: int
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def to_dict(self) -> dict[str, int]:
        return {**{c: self.parts.get(c, 0) for c in COMPONENTS}, "total": self.total, "stage": self.stage}


@dataclass(frozen=True)
class RoleMemory:
    """One training role's state on one stage, and what it keeps while idle."""

    state: ModelState
    offload_params: bool = False
    offload_grads: bool = False
    offload_optimizer: bool = False

    def idle(self) -> ModelState:
        s = self.state
        return ModelState(0 if self.offload_params else s.params, 0 if self.offload_grads else s.grads,
                          0 if self.offload_optimizer else s.optimizer)


def _role_parts(prefix: str, state: ModelState) -> dict[str, int]:
    return {f"{prefix}_params": state.params, f"{prefix}_grads": state.grads, f"{prefix}_optimizer": state.optimizer}


@dataclass(frozen=True)
class StageMemory:
    """Everything a phase needs to know about one pipeline stage."""

    actor: RoleMemory
    ref: Optional[RoleMemory]
    critic: Optional[RoleMemory]
    actor_activations: int
    critic_activations: int
    forward_activations: int = 0  # the actor's forward-only pass (the reference runs the same shapes)
    actor_steps_per_update: int = 1  # optimizer steps of one update call (mini-batches x ppo_epochs)
    rm: Optional[RoleMemory] = None  # the reward model (params only)
    rm_activations: int = 0  # its forward-only pass


@dataclass(frozen=True)
class RolloutMemory:
    weights: int
    activations: int
    kv_cache: int
    asleep_when_training: bool
    resident_asleep: int = 0  # what the engine keeps while asleep (a LoRA base kept on the GPU: its weights)


def phase_parts(name: str, s: StageMemory, r: RolloutMemory, overhead: int, split: bool = False) -> dict[str, int]:
    """The components of phase `name` on one stage (see "Phases" in the module docstring). `split`: the rollout
    has GPUs of its own (actor_rollout_ref.hybrid_engine=false): "rollout" is one of those, holding the engine
    only, and the training GPUs never hold the engine."""
    parts = {c: 0 for c in COMPONENTS}
    if split and name == "rollout":
        parts.update(rollout_weights=r.weights, rollout_activations=r.activations, rollout_kv_cache=max(r.kv_cache, 0),
                     overhead=overhead)
        return parts
    actor = s.actor.state if name in ("train_actor", "actor_step", "ref_log_prob") else s.actor.idle()
    if name == "rollout":  # WeightSync.push releases the grads whatever the flags say
        actor = ModelState(actor.params, 0, actor.optimizer)
    # ...and brings them back after generation; an offloaded optimizer state comes back at the update's first step
    deferred = not split and s.actor.offload_optimizer and (
        name == "ref_log_prob" or (name == "train_actor" and defers_optimizer(s, split)))
    if deferred:
        actor = ModelState(actor.params, actor.grads, 0)
    critic = None if s.critic is None else (s.critic.state if name in ("train_critic", "critic_step")
                                            else s.critic.idle())
    ref = s.ref.idle() if s.ref is not None else None  # the reference never trains: params only
    parts.update(_role_parts("actor", actor))
    if critic is not None:
        parts.update(_role_parts("critic", critic))
    parts["ref_params"] = ref.params if ref is not None else 0
    if s.rm is not None:
        parts["rm_params"] = s.rm.state.params if name == "reward" else s.rm.idle().params
    if name == "ref_log_prob" and s.ref is not None:
        parts["ref_params"] = s.ref.state.params  # onloaded for its pass
    parts["activations"] = {"train_actor": s.actor_activations, "train_critic": s.critic_activations,
                            "ref_log_prob": s.forward_activations, "reward": s.rm_activations}.get(name, 0)
    if name == "actor_step":
        parts["optimizer_step"] = s.actor.state.step
    if name == "critic_step" and s.critic is not None:
        parts["optimizer_step"] = s.critic.state.step
    if not split and (name == "rollout" or not r.asleep_when_training):
        parts.update(rollout_weights=r.weights, rollout_activations=r.activations, rollout_kv_cache=max(r.kv_cache, 0))
    elif not split:  # asleep: only what stays resident
        parts["rollout_weights"] = r.resident_asleep
    parts["overhead"] = overhead
    return parts


def onload_margin(activations: int) -> int:
    """What an overlapped onload leaves free beyond the activations' estimate: allocator slack, and a tenth of the
    activations for the estimate's error (TE's layers keep somewhat other tensors than memory.py counts)."""
    return ONLOAD_MARGIN_BYTES + activations // 10


def onload_reserve(activations: int) -> int:
    """Device bytes the forward/backward needs above what is resident at the update's start: the runtime's
    overlap budget is the device's free memory less this (MegatronRole.overlap_onload)."""
    return activations + onload_margin(activations)


def defers_optimizer(s: StageMemory, split: bool = False) -> bool:
    """The actor's forward/backward runs with its optimizer state on the host: the hybrid engine offloaded it for
    generation and one optimizer step per update brings it back only for that step."""
    return not split and s.actor.offload_optimizer and s.actor_steps_per_update == 1


def onload_parts(train: dict[str, int], optimizer: int, gpu: int) -> dict[str, int]:
    """train_actor_onload: the forward/backward's parts (`train`, the state on the host) with the part of the
    `optimizer` state bytes that comes back beside them."""
    room = gpu - sum(train.values()) - onload_margin(train["activations"])
    return {**train, "actor_optimizer": min(optimizer, max(0, room))}


@dataclass(frozen=True)
class MemoryPlan:
    gpu_memory_bytes: int
    overhead_bytes: int
    phases: dict[str, Optional[Phase]]
    kv_cache: Optional[KVCache]
    notes: list[str] = field(default_factory=list)
    rollout_base_resident: bool = False  # LoRA: the engine keeps its base on the GPU while asleep (counted in phases)

    @property
    def peak(self) -> Phase:
        return max((p for p in self.phases.values() if p is not None), key=lambda p: p.total)

    def to_dict(self) -> dict[str, Any]:
        return {
            "phases": {n: (p.to_dict() if p is not None else None) for n, p in self.phases.items()},
            "peak": {"phase": self.peak.name, "bytes": self.peak.total, "stage": self.peak.stage},
            "kv_cache": self.kv_cache.to_dict() if self.kv_cache is not None else None,
        }
