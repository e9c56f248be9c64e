"""A GRPO/PPO step's seconds for a validated job on a given GPU type: the ranking half of `hybridrl plan --search`.

Phases, per step (every rank takes the same time in a balanced layout; T tokens of the step, S samples, R response
tokens, N matmul weights, L layers, dp/tp/pp/cp/ep the actor's layout, tp_g/dp_g the rollout's):
    generation     R decode steps of one replica, each: a fixed cost (the engine's scheduler, sampling, the captured
                   graph's launch) + per_sequence_s x B (B = S/dp_g sequences a replica) + the roofline of its GEMMs
                   (the replica's weights/tp_g read from HBM against 2 N B/tp_g FLOPs) + its KV cache's read + with
                   tp_g > 1, 2 L all-reduces of allreduce_latency_s x log2(tp_g) (vLLM's NCCL all-reduce; custom
                   all-reduce is off) + where B is above vLLM's largest captured CUDA graph (512) or the engine is
                   eager, uncaptured_layer_s a layer; plus the engine's wake/sleep: a fixed part, its weights woken
                   (per GB of its shard), more with each doubling of the GPUs (their KV caches woken at once, the
                   driver's wait for the slowest worker), and with optimizer_offload the optimizer state's way to the host
    sync           the weights into the engine: each GPU copies its engine shard (2 N / tp_g bytes) in HBM, and
                   receives from other GPUs the part of it that its training shard does not hold (the cross-GPU
                   direct copy, hybrid/remote.py): the other pipeline stages' layers (over the network where the
                   pipeline spans nodes) and, where the tp_g shard is not inside the tp shard, the tp peers' pieces
                   (receive_fraction), at sync_copy_efficiency of the link
    sync_check     the per-step weight check (rollout.sync_check): sync_check_s_per_gb for every GB of the engine's
                   shard and of the received bytes, times sample_fraction (a separate term, to be re-fitted once
                   cheaper checksums are measured)
    log-prob pass  2 N T/dp / (tp pp cp) FLOPs at forward_mfu x tp_efficiency x pipeline fill, once for the old
                   log-probs and once more for the reference; MoE: the tokens' all-to-all over ep
    update         6 N T/dp / (tp pp cp) FLOPs at train_mfu x tp_efficiency x pipeline fill (8 N with full recompute;
                   MoE: N counts the active weights, and the routed experts' share runs at train_mfu x
                   expert_efficiency: one grouped GEMM a layer on the transformer-engine spec, one GEMM per expert on
                   the local one),
                   the gradients' reduce-scatter + all-gather over dp (NVLink inside a node, the network when the dp
                   group spans nodes), pipeline sends, cp's KV exchange, MoE all-to-all; with optimizer_offload the
                   optimizer state's copy back from the host (its way out is part of generation)
Interconnect: NVLink inside a node of GPU.per_node GPUs; between nodes each GPU gets Network.bytes_per_s (its share of
the node's NICs: an assumption, `hybridrl plan --search --net-gbps`). A group of Megatron ranks (order tp-cp-ep-dp-pp)
spans nodes when its stride times its size exceeds a node.
MFU grows with the model's width (bigger GEMMs): it is interpolated in log2(hidden_size) between the calibration
points below and held beyond them. The constants come from the runs in benchmarks/results/plan_calibration.json
(dated), fitted by benchmarks/plan_calibration.py (plan_accuracy.json + .md: every row's error, and each lease's
error with the constants fitted on the other leases); tests/unit/test_plan_accuracy.py fails past 20% on any row.
tp_efficiency is a guess (not measured apart from the step times it is checked against), and so are the experts'
efficiencies (grouped_experts_efficiency, sequential_experts_efficiency) until issue 38's MoE rows calibrate them.
A GPU's training state counts its own experts: dense weights over tp x pp, routed experts over pp x ep x etp; their
optimizer state is sharded over dp x cp and over the experts' data parallel (expert_dp) respectively.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hybridrl.config import RunConfig

from .estimate import recompute_enabled
from .memory import stage_expert_params
from .model_shape import ModelShape


@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float  # dense bf16
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # all-gather bus bandwidth between GPUs of one node
    host_bytes_per_s: float  # pinned host <-> device copies
    per_node: int = 8  # GPUs a node holds (NVLink reaches these)


GPUS = {
    # H200: 4.8 TB/s HBM; NVLink all-gather 248 GB/s bus (four_gpu_h200x2.json, 2 x H200, 2026-11-27; 316 GB/s over 4: four_gpu.json); host copies ~50 GB/s
    # (85 GB of Adam state in 1.72 s, megatron_speed.md)
    "H200": GPU("H200", 989e12, 4.8e12, 248e9, 50e9),
    # H100 SXM: 3.35 TB/s HBM (datasheet); the rest taken as the H200's (the same NVLink and host link)
    "H100": GPU("H100", 989e12, 3.35e12, 248e9, 50e9),
}


@dataclass(frozen=True)
class Network:
    """Between nodes (an assumption, not measured here): each GPU's share of its node's NICs, and a message's latency.
    The default: 400 Gb/s a GPU (one 400G InfiniBand NDR NIC per GPU, the usual H100/H200 node), 50 GB/s at best;
    collectives over it reach ~80% of that."""

    gbps_per_gpu: float = 400.0
    efficiency: float = 0.8
    latency_s: float = 10e-6

    @property
    def bytes_per_s(self) -> float:
        return self.gbps_per_gpu * 1e9 / 8 * self.efficiency


@dataclass(frozen=True)
class Costs:
    """Efficiencies measured on H200s (sources in the comments); see the module docstring for where they enter."""

    # Fitted (benchmarks/plan_calibration.py accuracy, 2026-11-28): the constants marked FITTED there, by Nelder-Mead on
    # the squared log error of the step (and half that of generate, gen, update and the log-prob passes) over the 23
    # rows of benchmarks/results/plan_calibration.json (1-4 H200s, 0.5B-14B dense); leave-one-lease-out errors are in
    # benchmarks/results/plan_accuracy.md. Rounded to 3 figures.
    # forward+backward MFU at hidden 1536 and 3584 (the 1.5B and 7B rows), interpolated in log2(hidden) between
    train_mfu: tuple[tuple[int, float], ...] = ((1536, 0.296), (3584, 0.515))
    # log-prob forward MFU (the old log-probs with entropy, the reference's)
    forward_mfu: tuple[tuple[int, float], ...] = ((1536, 0.253), (3584, 0.410))
    # vLLM decode, a step of one replica: a fixed part (scheduler, sampling, launches of the captured graph), a cost a
    # sequence (its sampling and bookkeeping on the host), the roofline of its GEMMs (the weights' read from HBM
    # against 2 N FLOPs a sequence at decode_mfu) and the KV cache's read; tp_g > 1: 2 L NCCL all-reduces of
    # allreduce_latency_s x log2(tp_g)
    decode_step_s: float = 1.85e-3
    per_sequence_s: float = 1.70e-5
    allreduce_latency_s: float = 2.50e-5
    # not fitted: left free the fit ran it to 1.05 (the rows, at most 512 sequences a replica, do not show decode
    # compute); held at the peak, so large batches of large models still pay their FLOPs (an assumption)
    decode_mfu: float = 1.0
    # vLLM captures CUDA graphs up to 512 sequences (vllm_engine.VLLM_CAPTURE_MAX); a larger batch a replica, or
    # rollout.enforce_eager, runs uncaptured: each layer's kernels launched from the host every step. Fitted; its
    # rows: 1.5B x 1024 sequences on one GPU (four_gpu_h200x4_2) and 7B tp_g4 eager (four_gpu_h200x4)
    cuda_graph_max_batch: int = 512
    uncaptured_layer_s: float = 8.17e-4
    # the rest of gen (gen less generate, the sync, the check and, with optimizer_offload, the optimizer state's way
    # to the host at host_bytes_per_s): a fixed part (the engine's sleep and wake calls, the training state's offload
    # and onload; fitted), per GB of the engine's shard (its weights woken: not fitted, the engine_wake_weights timer
    # itself: 0.08 s for 3.1 GB, 0.34 s for 29.5 GB), and per doubling of the job's GPUs (fitted; the KV caches woken
    # at once and the driver's wait for the slowest worker: 0.19 s against 0.05 s on one GPU; beyond four GPUs an
    # extrapolation)
    engine_wake_sleep_s: float = 0.108
    engine_wake_s_per_gb: float = 0.011
    wake_s_per_gpu_doubling: float = 0.389
    # guesses (not measured apart from the step times): tensor-parallel efficiency of the training GEMMs
    tp_efficiency: tuple[tuple[int, float], ...] = ((1, 1.0), (2, 0.85), (4, 0.75), (8, 0.6))
    # guesses until issue 38's rows (benchmarks/results/moe_scale.json) calibrate them: the routed experts' GEMMs
    # against a dense layer's at the same width, as TE's one grouped GEMM a layer, or one GEMM per expert
    # (SequentialMLP, the local spec: moe_grpo.json measured an active-parameter MFU of 0.008 over a whole update
    # of a 1.28B MoE with 32 experts, small micro-batches included)
    grouped_experts_efficiency: float = 1.0
    sequential_experts_efficiency: float = 0.1
    # the cross-GPU direct copy against the model's NVLink figure (nvlink_bytes_per_s): the received bytes over the
    # measured reshard_stream less the local copy, on the third 4 x H200 lease's rows (2026-11-27, double-buffered
    # rounds, plan_calibration.json h200x4_3_*): 14B tp4 -> tp_g1 0.56 (22.2 GB a GPU in 0.165 s), 7B tp2 -> tp_g1
    # 0.47 (7.6 GB, 0.068 s), 7B pp2 -> tp_g2 0.54 (3.8 GB, 0.030 s); their geometric mean
    sync_copy_efficiency: float = 0.52
    # the weight check (timing_s/sync_check), per GB of the engine's shard plus the received bytes: 6.7-8.8 ms/GB on
    # the eight rows of the second and third 4 x H200 leases (2026-11-27, plan_calibration.json h200x4_2_*, h200x4_3_*:
    # 0.027 s for 1.5B's 3.1 GB on one GPU, 0.106 s for 7B's 15.2 GB, 0.392 s for 14B's 29.5 + 22.2 GB), the median.
    # Measured before 5f711d7 (float32 block sums): re-fit from the next lease's rows
    sync_check_s_per_gb: float = 7.0e-3
    other_s: float = 6.7e-4  # reward, advantages, dispatch (fitted: what the rows leave is inside the phases above)


def _interpolate(points: tuple[tuple[int, float], ...], hidden: int) -> float:
    (h0, v0), (h1, v1) = points[0], points[-1]
    x = (math.log2(hidden) - math.log2(h0)) / (math.log2(h1) - math.log2(h0))
    return v0 + min(max(x, 0.0), 1.0) * (v1 - v0)


def _tp_efficiency(costs: Costs, tp: int) -> float:
    return dict(costs.tp_efficiency).get(tp, costs.tp_efficiency[-1][1])


def _matmul_params(shape: ModelShape) -> int:
    """Weights a token runs through in matmuls (active experts only; the LM head, not the embedding lookup)."""
    return shape.active_params - shape.embedding_params() + (shape.embedding_params() if shape.tie_word_embeddings else 0)


def grouped_experts(run: RunConfig) -> bool:
    """The actor's routed experts run as one grouped GEMM a layer: the transformer-engine spec (the default where
    it imports on a GPU; `transformer_impl: null` is taken as TE) unless override_transformer_config turns it off."""
    m = run.cfg.actor_rollout_ref.actor.megatron
    te = m.transformer_impl != "local" and run.derived.device == "cuda"
    return te and (m.override_transformer_config or {}).get("moe_grouped_gemm", True) is not False


def _gpu_params(shape: ModelShape, a) -> tuple[float, float]:
    """(dense, routed-expert) parameters one GPU holds: the dense ones over tp x pp, the experts over pp x ep x etp."""
    experts = float(stage_expert_params(shape, a.pp, a.ep, a.expert_tp)) if shape.is_moe else 0.0
    dense = (shape.params - (shape.num_layers * shape.layer_expert_params() if shape.is_moe else 0)) / (a.tp * a.pp)
    return dense, experts


def _link(gpu: GPU, net: Network, stride: int, size: int) -> float:
    """Bytes/s of a group of `size` ranks `stride` apart: NVLink inside a node, the network once it spans nodes."""
    return gpu.nvlink_bytes_per_s if stride * size <= gpu.per_node else min(gpu.nvlink_bytes_per_s, net.bytes_per_s)


def _ring(nbytes: float, size: int, bandwidth: float) -> float:
    """A reduce-scatter or all-gather of `nbytes` over `size` ranks."""
    return nbytes * (size - 1) / size / bandwidth if size > 1 else 0.0


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _slices(i: int, n: int, j: int, m: int) -> float:
    """How much of a tensor slice i of n and slice j of m have in common."""
    return _overlap(i / n, (i + 1) / n, j / m, (j + 1) / m)


def receive_fraction(tp: int, pp: int, tp_g: int) -> float:
    """The share of a dense model the busiest GPU receives from other GPUs for its engine shard: the engine holds
    slice rank % tp_g of every layer, the actor slice rank % tp of its stage's layers (hybrid/plan.py's rank
    orders). Where the two nest (tp_g = 1, tp = 1 or tp = tp_g: every measured row) this is benchmarks/four_gpu.py's
    receive_fraction, 1/tp_g - 1/(pp max(tp, tp_g)); where they do not it is more (tp4 -> tp_g2: rank 1 trains
    quarter 1 and serves half 1, so it receives all of its half)."""
    own = min(_slices(k % tp_g, tp_g, k % tp, tp) for k in range(math.lcm(tp, tp_g)))
    return 1 / tp_g - own / pp


def received_bytes(shape: ModelShape, a, r) -> tuple[float, float, float]:
    """Bytes the busiest GPU receives for its engine shard: (from the other pipeline stages, from its stage's tp
    peers, routed experts from its stage's ep peers). Dense weights as in receive_fraction; the engine holds 1/tp_g
    of every expert, or whole experts (vLLM's expert parallel, rollout ep = tp_g: block rank % tp_g), the actor its
    stage's experts in block (rank / etp) % ep of ep, slice rank % etp of etp."""
    expert = 2.0 * shape.num_layers * shape.layer_expert_params() if shape.is_moe else 0.0
    dense = 2.0 * shape.params - expert
    tp_g, etp, ep = r.tp, a.expert_tp, a.ep
    from_stages = (dense + expert) / tp_g * (1 - 1 / a.pp)  # the tp_g slice of the other stages' layers

    def in_stage(k: int) -> tuple[float, float]:
        g = k % tp_g
        if r.ep > 1:  # whole experts: the engine's block against the actor's, of which the actor holds 1/etp
            experts = _slices(g, tp_g, k // etp % ep, ep) / etp
        else:  # 1/tp_g of every expert against the actor's slice of its 1/ep of them
            experts = _slices(g, tp_g, k % etp, etp) / ep
        return (dense * (1 / tp_g - _slices(g, tp_g, k % a.tp, a.tp)) / a.pp,
                expert * (1 / tp_g - experts) / a.pp)

    busiest = max((in_stage(k) for k in range(math.lcm(tp_g, a.tp, etp * ep))), key=sum)  # the orders' period
    return from_stages, busiest[0], busiest[1]


def step_seconds(run: RunConfig, shape: ModelShape, gpu: GPU, costs: Costs = Costs(),
                 net: Network = Network()) -> dict[str, float]:
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
    layers = shape.num_layers / a.pp
    dense_params, expert_params = _gpu_params(shape, a)
    recompute = recompute_enabled(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor.megatron)
    passes = 4 if recompute else 3  # forward (again with recompute), backward's two

    # generation: one replica's decode steps, the engine's wake/sleep
    batch_g = samples / r.dp  # sequences a replica decodes at once (ignore_eos: all of them for every step)
    context = cfg.data.max_prompt_length // 2 + response / 2  # a sequence's mean context over its decode steps
    kv_bytes = batch_g * context * shape.num_layers * 2 * shape.kv_width * 2 / max(1, min(r.tp, shape.num_key_value_heads))
    # a decode step's GEMMs read the replica's weights once and do 2 N FLOPs a sequence: the slower of the two
    # (roofline), plus the KV cache's read
    gemms = max(2 * shape.active_params / r.tp / gpu.hbm_bytes_per_s,
                2 * _matmul_params(shape) * batch_g / r.tp / (gpu.peak_flops * costs.decode_mfu))
    per_step = costs.decode_step_s + costs.per_sequence_s * batch_g + gemms + kv_bytes / gpu.hbm_bytes_per_s
    if r.tp > 1:
        per_step += 2 * shape.num_layers * costs.allreduce_latency_s * math.log2(r.tp)
    # vLLM runs a batch above its largest captured graph (or every batch with enforce_eager) uncaptured
    if batch_g > costs.cuda_graph_max_batch or cfg.actor_rollout_ref.rollout.enforce_eager:
        per_step += costs.uncaptured_layer_s * shape.num_layers
    generate = response * per_step
    engine_bytes = 2 * shape.params / r.tp  # the engine's shard on a GPU
    optimizer_bytes = 12 * (dense_params / (a.dp * a.cp) + expert_params / a.expert_dp)
    # with optimizer_offload the optimizer state goes to the host during generation (and comes back for the update)
    offload = optimizer_bytes / gpu.host_bytes_per_s if cfg.actor_rollout_ref.actor.megatron.optimizer_offload else 0.0
    gen = (generate + costs.engine_wake_sleep_s + costs.engine_wake_s_per_gb * engine_bytes / 1e9
           + costs.wake_s_per_gpu_doubling * math.log2(a.world_size) + offload)

    # the weights into the engine: the local copy, what other GPUs send, and the check of both
    from_stages, in_stage, in_stage_experts = received_bytes(shape, a, r)
    sync = engine_bytes / gpu.hbm_bytes_per_s + (
        from_stages / _link(gpu, net, a.tp * a.cp * a.dp, a.pp) + in_stage / gpu.nvlink_bytes_per_s
        + in_stage_experts / _link(gpu, net, a.expert_tp, a.ep)) / costs.sync_copy_efficiency
    check = cfg.actor_rollout_ref.rollout.sync_check  # all tensors unless sampled; none when off
    sync_check = costs.sync_check_s_per_gb * check.sample_fraction * (
        engine_bytes + from_stages + in_stage + in_stage_experts) / 1e9 if check.enable else 0.0

    # the tokens' exchanges: MoE all-to-all over ep, cp's KV ring, pipeline sends (bf16 activations)
    act = per_gpu_tokens * shape.hidden_size * 2
    moe = 0.0
    if shape.is_moe and a.ep > 1:
        moe = layers * 2 * _ring(act * shape.moe_topk, a.ep, _link(gpu, net, a.expert_tp, a.ep))
    cp_kv = layers * _ring(per_gpu_tokens * 2 * shape.kv_width * 2 * a.cp, a.cp, _link(gpu, net, a.tp, a.cp))
    pp_send = 2 * act / a.tp / _link(gpu, net, a.tp * a.cp * a.dp, a.pp) if a.pp > 1 else 0.0

    # the routed experts' share of the active weights runs at its own efficiency (grouped GEMM or one per expert)
    active_experts = shape.num_layers * shape.moe_topk * 3 * shape.hidden_size * shape.moe_ffn_hidden_size \
        if shape.is_moe else 0
    expert_eff = (costs.grouped_experts_efficiency if grouped_experts(run) else costs.sequential_experts_efficiency) \
        if shape.is_moe else 1.0
    weighted = n - active_experts + active_experts / expert_eff
    forward = 2 * weighted * per_gpu_tokens / model_parallel / (gpu.peak_flops * _interpolate(costs.forward_mfu, shape.hidden_size) * eff)
    log_probs = (forward + moe + cp_kv + pp_send) * (2 if d.use_reference else 1)

    train_flops = (passes * 2) * weighted * per_gpu_tokens / model_parallel * batch.ppo_epochs
    update = train_flops / (gpu.peak_flops * _interpolate(costs.train_mfu, shape.hidden_size) * eff)
    update += (moe + cp_kv + pp_send) * passes * batch.ppo_epochs
    dense = shape.params - (shape.num_layers * shape.layer_expert_params() if shape.is_moe else 0)
    grads = _ring(4 * dense / model_parallel, a.dp * a.cp, _link(gpu, net, a.tp, a.dp * a.cp))
    if shape.is_moe:
        experts = 4 * shape.num_layers * shape.layer_expert_params() / (a.pp * a.ep * a.expert_tp)
        grads += _ring(experts, a.expert_dp, _link(gpu, net, a.expert_tp * a.ep, a.expert_dp))
    update += 2 * grads * batch.optimizer_steps_per_step  # reduce-scatter, then the parameters' all-gather
    out = {"gen": gen, "sync": sync, "sync_check": sync_check, "log_probs": log_probs, "update": update,
           "optimizer_offload": offload, "other": costs.other_s}
    out["step"] = sum(out.values())
    out["generate"] = generate  # part of gen (the decode alone), not added again
    return out


def gpu_named(name: str) -> GPU:
    for key in sorted(GPUS, key=len, reverse=True):
        if key in name.upper():
            return GPUS[key]
    raise ValueError(f"no step-time figures for GPU {name!r}; one of: {', '.join(GPUS)}")
