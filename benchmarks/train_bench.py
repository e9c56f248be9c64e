"""Training throughput of the megatron-core actor on one GPU: PPO update tokens/s, MFU, peak memory,
offload/onload seconds and bytes, on a Qwen2.5-shaped random model (0.5B by default) imported from HF format (bf16).

    PYTHONPATH=$PWD:/tmp/site python benchmarks/train_bench.py --out benchmarks/results/train_bench.json
    ... --shape 7b --transformer-impl transformer_engine --packed --lengths gsm8k --recompute --skip-offload
    ... --peer OTHER.json   # ratios against a run of this script in the same lease (te_vs_local_tokens_per_s,
                            # packed_vs_padded_tokens_per_s where exactly that option differs)
    ... --shape 7b --offload-optimizer [--onload-overlap plan|off]   # issue 39's train_mfu_7b_whole_update
    python benchmarks/train_bench.py --cpu-dry-run   # the same code path on a tiny model on the CPU (no timings)

MFU = model FLOPs / (seconds * peak), peak = 989 TFLOP/s (H100 SXM dense bf16), with
    model FLOPs = 6 * N * tokens + 6 * L * d_attn * sum_i(s_i^2)
N counts the weights used in matmuls (transformer layers + the vocab projection; the input embedding is a
lookup; for a mixture of experts --model-dir the active ones: router, the top-k routed experts, a shared expert,
hybridrl.trainer.metrics.matmul_params, reported as moe_mfu_active), tokens the valid (unpadded) tokens of the
update, s_i the valid length of sample i, L layers,
d_attn = heads * head_dim; the second term is causal attention (QK^T and AV, forward + backward = 3x the
forward's 2 * s^2 * d_attn per layer). Padding the micro-batches costs real time but counts as no work.

With --offload-optimizer each update runs as in the hybrid engine: the optimizer state waits on the host, the update
sends for as much of it as the plan's onload reserve leaves room for at its start (--onload-overlap plan; off: all of
it after the backward, the path before issue 39), the rest before the step; after the update the state starts back
to the host (begin_offload) and the next update's offload waits for the rest (nothing runs between them here, so
that wait is the whole copy: the exposed offload of a real step is what the trainer does meanwhile).
train_mfu (train_mfu_7b_whole_update on the 7B shape) is over the whole update: forward/backward, the onload's
exposed part, the optimizer step. Where the whole update's time goes (update_split.py): update_policy's phases
(phase_*_seconds), what the bench's clock saw outside them (update_outside_role_seconds, of which
update_drain_seconds is the device-wide wait after it returned) and the caching allocator's retries, cudaMallocs and
cudaFrees before the forward, during the forward/backward and after it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import update_split  # noqa: E402  (benchmarks/, beside this script)

PEAK_FLOPS = 989e12  # H100 SXM, dense bf16 (H200: the same compute)
COMMON = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6)
SHAPES = {  # Qwen2.5 shapes, random weights
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, tie_word_embeddings=True),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
               num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
    "tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=True),
}
SHAPE = {**SHAPES["0.5b"], **COMMON}
GSM8K = dict(prompt=(64, 256), response=(50, 512))  # token lengths of a GSM8K-like rollout (min, max)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "train_bench.json"))
    p.add_argument("--samples", type=int, default=64, help="samples per update (one optimizer step)")
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--response", type=int, default=768)
    p.add_argument("--micro", type=int, default=4, help="samples per micro-batch")
    p.add_argument("--updates", type=int, default=3, help="timed updates (after one warm-up update)")
    p.add_argument("--model-dir", default=None, help="existing HF folder to use instead of a random Qwen2-0.5B shape")
    p.add_argument("--attention-backend", default="auto",
                   help="override_transformer_config.attention_backend: auto (torch SDPA / TE's choice) or local "
                        "(megatron's unfused)")
    p.add_argument("--shape", default="0.5b", choices=sorted(SHAPES), help="Qwen2.5 shape of the random model")
    p.add_argument("--transformer-impl", default=None, choices=["transformer_engine", "local"],
                   help="*.megatron.transformer_impl (default: transformer_engine where it imports)")
    p.add_argument("--packed", action="store_true", help="use_remove_padding: each micro-batch one THD sequence")
    p.add_argument("--dynamic-tokens", type=int, default=None,
                   help="use_dynamic_bsz with this ppo_max_token_len_per_gpu instead of --micro samples per micro-batch")
    p.add_argument("--lengths", default="uniform", choices=["uniform", "gsm8k"],
                   help="uniform: prompts <= --prompt with up to 1/4 padding, responses 3/4..1 of --response; "
                        f"gsm8k: prompts {GSM8K['prompt']} and responses {GSM8K['response']} tokens, uniform")
    p.add_argument("--recompute", action="store_true", help="full activation recomputation (enable_gradient_checkpointing)")
    p.add_argument("--fp8", default=None, choices=["e4m3", "hybrid"], help="override_transformer_config.fp8 (TE only)")
    p.add_argument("--fp8-recipe", default=None, choices=["delayed", "tensorwise", "mxfp8", "blockwise"])
    p.add_argument("--override-transformer-config", default="{}",
                   help="JSON merged into megatron.override_transformer_config (e.g. {\"apply_rope_fusion\": true, "
                        "\"gradient_accumulation_fusion\": true} with TE, the candidates for the MFU gap)")
    p.add_argument("--skip-offload", action="store_true", help="do not measure offload/onload (big shapes)")
    p.add_argument("--random-init", action="store_true",
                   help="megatron's random init instead of the folder's weights (actor.load_weight=false): a "
                        "config-only folder, e.g. `multi_gpu_bench.py model --no-weights`")
    p.add_argument("--offload-optimizer", action="store_true",
                   help="the optimizer state waits in host memory before each update and comes back for its step, "
                        "as in the hybrid engine (how the 7B shape fits one H200)")
    p.add_argument("--onload-overlap", default="plan", choices=["plan", "off"],
                   help="with --offload-optimizer: plan: the state comes back beside the forward/backward as far as the "
                        "plan's activations and margin leave room (hybridrl.plan.memory.onload_reserve); off: after it")
    p.add_argument("--onload-reserve-gb", type=float, default=None,
                   help="with --onload-overlap plan: keep this many GiB free for the forward/backward instead of the "
                        "plan's figure (to find how far the plan's margin could go)")
    p.add_argument("--logprob-between", action="store_true",
                   help="a log-prob pass between the offload and each update, as the trainer's old_log_prob: the "
                        "update then starts with the allocator's cache warm instead of just emptied")
    p.add_argument("--override-optimizer-config", default="{}",
                   help="JSON merged into actor.optim.override_optimizer_config (e.g. megatron's optimizer CPU offload)")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="run every option's code path once on a tiny model on the CPU (gloo, fp32); no timings")
    p.add_argument("--profile", type=int, default=0, metavar="ROWS",
                   help="after the timed updates, profile one more and print its ROWS costliest kernels")
    p.add_argument("--peer", default=None,
                   help="an earlier result JSON of this script (e.g. --attention-backend local, same lease): ratios against it")
    args = p.parse_args()
    if args.cpu_dry_run:
        args.shape, args.samples, args.micro, args.updates, args.skip_offload = "tiny", 8, 2, 1, True
        args.prompt, args.response = min(args.prompt, 32), min(args.response, 48)
    if args.lengths == "gsm8k":
        args.prompt, args.response = (min(args.prompt, 32), min(args.response, 48)) if args.cpu_dry_run else \
            (GSM8K["prompt"][1], GSM8K["response"][1])
    return args


def make_model(folder: str, shape: str = "0.5b") -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cuda = torch.cuda.is_available() and shape != "tiny"
    with torch.device("cuda" if cuda else "cpu"):
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape], **COMMON)).to(torch.bfloat16 if cuda else torch.float32)
    model.save_pretrained(folder)
    del model
    if cuda:
        torch.cuda.empty_cache()
    return folder


def random_rollout_batch(n: int, prompt: int, response: int, vocab: int, min_keep: int | None = None,
                         max_id: int | None = None) -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded responses of seeded random ids and lengths, as a rollout returns:
    up to a quarter of each prompt is padding, and responses keep `min_keep` (default 3/4) to all tokens.
    The same on every rank (fixed seed); ids below `max_id` (default the vocab size)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, min(vocab, max_id or vocab) - 10, (n, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    resp_mask = torch.ones(n, response)
    lo = 3 * response // 4 if min_keep is None else min_keep
    for i in range(n):
        pad = int(torch.randint(0, prompt // 4 + 1, (1,), generator=g))
        keep = int(torch.randint(lo, response + 1, (1,), generator=g))
        mask[i, :pad] = 0
        mask[i, prompt + keep:] = 0
        resp_mask[i, keep:] = 0
    ids = ids * mask
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": ids[:, prompt:].clone(), "response_mask": resp_mask}


def spread_rollout_batch(n: int, prompt: tuple[int, int], response: tuple[int, int], vocab: int) -> dict[str, torch.Tensor]:
    """Like random_rollout_batch, with prompt and response lengths drawn uniformly from (min, max) ranges (a
    GSM8K-like spread: most padding of a padded micro-batch comes from the spread of response lengths)."""
    g = torch.Generator().manual_seed(0)
    P, R = prompt[1], response[1]
    ids = torch.randint(10, vocab - 10, (n, P + R), generator=g)
    mask = torch.zeros_like(ids)
    resp_mask = torch.zeros(n, R)
    for i in range(n):
        p = int(torch.randint(prompt[0], P + 1, (1,), generator=g))
        r = int(torch.randint(response[0], R + 1, (1,), generator=g))
        mask[i, P - p:P + r] = 1
        resp_mask[i, :r] = 1
    ids = ids * mask
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": ids[:, P:].clone(), "response_mask": resp_mask}


def model_flops(arch, lengths: torch.Tensor, hf_config: dict | None = None) -> tuple[float, int]:
    """(FLOPs of one forward+backward, N); a mixture of experts counts its active weights (hf_config needed)."""
    if arch.is_moe:
        from hybridrl.trainer.metrics import causal_training_flops, matmul_params

        return causal_training_flops(hf_config, lengths.tolist()), matmul_params(hf_config)
    h, f, L = arch.hidden_size, arch.ffn_hidden_size, arch.num_layers
    d_q, d_kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    per_layer = h * (d_q + 2 * d_kv) + d_q * h + 3 * h * f  # qkv, out proj, gate/up/down
    n_matmul = L * per_layer + h * arch.vocab_size
    tokens = float(lengths.sum())
    attention = 6.0 * L * d_q * float((lengths.double() ** 2).sum())
    return 6.0 * n_matmul * tokens + attention, n_matmul


def build_actor(hf_dir: str, args: argparse.Namespace):
    from hybridrl.adapters.megatron import compat, parallel
    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.config.layout import BatchPlan, ParallelLayout
    from hybridrl.config.schema.actor import ActorConfig, ModelConfig
    from hybridrl.config.schema.common import MegatronConfig, OptimConfig

    if args.cpu_dry_run:
        compat.apply(force_cpu=True)
    parallel.ensure_process_group(timeout_s=600)
    layout = ParallelLayout(world_size=1, tp=1, pp=1, cp=1, vpp=None, dp=1, sequence_parallel=False,
                            dtype="float32" if args.cpu_dry_run else "bfloat16")
    parallel.init_megatron(layout, seed=1)
    overrides = {"attention_backend": args.attention_backend}
    overrides.update({k: v for k, v in (("fp8", args.fp8), ("fp8_recipe", args.fp8_recipe)) if v})
    overrides.update(json.loads(args.override_transformer_config))
    dynamic = args.dynamic_tokens is not None
    cfg = ActorConfig(ppo_mini_batch_size=args.samples, ppo_micro_batch_size_per_gpu=None if dynamic else args.micro,
                      use_dynamic_bsz=dynamic, ppo_max_token_len_per_gpu=args.dynamic_tokens or 16384,
                      loss_agg_mode="token-mean", load_weight=not args.random_init,
                      optim=OptimConfig(lr=1e-6, clip_grad=1.0, total_training_steps=100,
                                        override_optimizer_config=json.loads(args.override_optimizer_config)),
                      megatron=MegatronConfig(use_distributed_optimizer=True, sequence_parallel=False, seed=1,
                                              transformer_impl=args.transformer_impl,
                                              override_transformer_config=overrides))
    tokens = args.dynamic_tokens or 16384
    plan = BatchPlan(samples_per_step=args.samples, mini_batch_samples=args.samples, mini_batches_per_epoch=1,
                     ppo_epochs=1, mini_batch_per_dp=args.samples, micro_batch_per_gpu=None if dynamic else args.micro,
                     grad_accum=None if dynamic else args.samples // args.micro, use_dynamic_bsz=dynamic,
                     max_token_len_per_gpu=tokens, forward_micro_batch_per_gpu=None if dynamic else args.micro * 2,
                     forward_max_token_len_per_gpu=2 * tokens)
    model = ModelConfig(path=hf_dir, use_remove_padding=args.packed, enable_gradient_checkpointing=args.recompute)
    return MegatronActor(model, cfg, layout, plan)


def bench_onload_reserve(actor, args: argparse.Namespace) -> tuple[int, int]:
    """(bytes the update keeps free for its forward/backward, the plan's training activations): what the trainer's
    worker gives MegatronRole.prepare_offload, from the same formulas (hybridrl/plan/memory.py) for this bench's
    micro-batches (a token budget, or --micro padded samples of prompt + response tokens)."""
    from hybridrl.plan.memory import ActivationSetup, onload_reserve, stage_activation_parts
    from hybridrl.plan.model_shape import from_hf_config

    shape = from_hf_config(actor.hf_config.to_dict())
    tokens = args.dynamic_tokens or args.micro * (args.prompt + args.response)
    setup = ActivationSetup(tp=1, pp=1, vpp=None, sequence_parallel=False, recompute=args.recompute,
                            act_bytes=4 if args.cpu_dry_run else 2, train_tokens=tokens, forward_tokens=tokens,
                            inflight=1)
    activations = stage_activation_parts(shape, setup, 0)[0]
    if args.onload_reserve_gb is not None:
        return int(args.onload_reserve_gb * 2**30), activations
    return onload_reserve(activations), activations


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn):
    synchronize()
    start = time.perf_counter()
    out = fn()
    synchronize()
    return out, time.perf_counter() - start


def profile_update(update, rows: int) -> None:
    """One more update under torch.profiler: the `rows` kernels / ops that took the most device time, and the
    share of the update the GPU was busy (what MFU cannot say: idle gaps are launch and host overhead)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        _, s = update()
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    print(f"[profile] update {s:.3f} s under the profiler; GPU busy {device_us / 1e6:.3f} s "
          f"({device_us / 1e6 / s:.0%})", flush=True)
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    print(events.table(sort_by=sort, row_limit=rows, max_name_column_width=70), flush=True)


def main() -> None:
    args = parse()
    from hybridrl.protocol import DataProto

    workdir = tempfile.mkdtemp(prefix="train_bench_")
    hf_dir = args.model_dir or make_model(workdir, args.shape)
    (actor, build_s) = timed(lambda: build_actor(hf_dir, args))
    reserve, plan_activations = bench_onload_reserve(actor, args)
    if args.offload_optimizer:  # as the hybrid worker: host memory pinned in the background, the overlap's budget
        actor.prepare_offload(params=False, grads=False, optimizer=True,
                              onload_reserve=reserve if args.onload_overlap == "plan" else None)
    if args.lengths == "gsm8k":
        lo = (8, 8) if args.cpu_dry_run else (GSM8K["prompt"][0], GSM8K["response"][0])
        batch = spread_rollout_batch(args.samples, (lo[0], args.prompt), (lo[1], args.response), actor.arch.vocab_size)
    else:
        batch = random_rollout_batch(args.samples, args.prompt, args.response, actor.arch.vocab_size)
    data = DataProto.from_dict(batch, meta_info={"temperature": 1.0})
    actor.compute_log_prob(data)  # warm-up: the first call loads kernels (lazily loaded CUDA modules)
    out, logprob_s = timed(lambda: actor.compute_log_prob(data))
    data.batch["old_log_probs"] = out.batch["log_probs"]
    data.batch["advantages"] = torch.randn(batch["responses"].shape) * batch["response_mask"]
    parts: dict[str, list[float]] = {k: [] for k in (
        "forward_backward", "optimizer_step", "optimizer_onload", "optimizer_onload_exposed", "optimizer_onload_overlap",
        "optimizer_offload", "optimizer_offload_exposed", "activations_measured", "peak_reserved")}
    state_bytes = [0]
    splits: list[dict[str, float]] = []  # update_split.per_update of each timed update

    def update() -> tuple[dict, float]:
        if args.offload_optimizer:  # the push's offload: finishes the one begun after the previous (warm-up) update
            off = actor.offload(params=False, grads=False, optimizer=True)
            parts["optimizer_offload"].append(off.optimizer_seconds)
            parts["optimizer_offload_exposed"].append(off.optimizer_exposed_seconds)
            state_bytes[0] = off.optimizer_bytes
        if args.logprob_between:  # as the trainer: old_log_prob between the push and the update (a warm allocator)
            actor.compute_log_prob(data)
        base = 0
        if torch.cuda.is_available():  # the forward/backward's own rise: peak after the backward, less what was
            torch.cuda.reset_peak_memory_stats()  # resident and the optimizer state sent for at the start
            base = torch.cuda.memory_allocated()
        synchronize()  # timed(), with the device-wide wait after update_policy returned apart (update_split.py)
        start = time.perf_counter()
        metrics = actor.update_policy(data)
        returned = time.perf_counter()
        synchronize()
        s = time.perf_counter() - start
        splits.append(update_split.per_update(metrics, s, time.perf_counter() - returned))
        if torch.cuda.is_available():
            parts["peak_reserved"].append(torch.cuda.max_memory_reserved())
        early = metrics.get("offload/optimizer_onload_overlap", 0.0) * state_bytes[0]
        parts["activations_measured"].append(max(0.0, actor.engine.backward_peak_bytes - base - early))
        if args.offload_optimizer:  # WeightSync.after_update
            actor.begin_offload(params=False, optimizer=True)
        for part, key in (("forward_backward", "timing_s/actor_forward_backward"),
                          ("optimizer_step", "timing_s/actor_optimizer_step"),
                          ("optimizer_onload", "timing_s/optimizer_onload"),
                          ("optimizer_onload_exposed", "timing_s/optimizer_onload_exposed"),
                          ("optimizer_onload_overlap", "offload/optimizer_onload_overlap")):
            parts[part].append(metrics.get(key, 0.0))
        return metrics, s

    update()  # warm-up (allocator, first-call kernels, Adam's state, the host arena when offloading)
    for timed_parts in parts.values():
        timed_parts.clear()
    splits.clear()
    seconds, peaks = [], []
    for _ in range(args.updates):
        metrics, s = update()
        seconds.append(s)
        peaks.append(torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0)
    peak = max(peaks)
    off = on = None
    if not args.skip_offload:
        off = actor.offload(params=True, grads=True, optimizer=True)
        on = actor.onload(params=True, grads=True, optimizer=True)

    lengths = batch["attention_mask"].sum(1)
    flops, n_matmul = model_flops(actor.arch, lengths, actor.hf_config.to_dict())
    update_s = sum(seconds) / len(seconds)
    mean = {k: sum(v) / len(v) if v else 0.0 for k, v in parts.items()}
    tokens = int(lengths.sum())
    impl = "transformer_engine" if _uses_te(actor) else "local"
    result = {
        "command": "python " + " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (dry run)",
        "date": datetime.date.today().isoformat(),
        "metrics": {
            "train_mfu": flops / update_s / PEAK_FLOPS,
            "train_mfu_forward_backward": flops / mean["forward_backward"] / PEAK_FLOPS,
            "forward_backward_seconds": mean["forward_backward"],
            "optimizer_step_seconds": mean["optimizer_step"],
            "optimizer_onload_seconds": mean["optimizer_onload"],
            "optimizer_onload_exposed_seconds": mean["optimizer_onload_exposed"],
            "optimizer_onload_overlap": mean["optimizer_onload_overlap"],
            "optimizer_offload_seconds": mean["optimizer_offload"],
            "optimizer_offload_exposed_seconds": mean["optimizer_offload_exposed"],
            "onload_reserve_gib": reserve / 2**30,
            "plan_train_activations_gib": plan_activations / 2**30,
            "measured_train_activations_gib": max(parts["activations_measured"]) / 2**30,
            "update_tokens_per_s": tokens / update_s,
            "update_seconds": update_s,
            "logprob_tokens_per_s": tokens / logprob_s,
            "peak_memory_gib": peak / 2**30,
            "peak_reserved_gib": max(parts["peak_reserved"], default=0) / 2**30,
            "build_and_import_seconds": build_s,
            "tokens_per_update": tokens,
            "matmul_params": n_matmul,
            "last_grad_norm": metrics["actor/grad_norm"],
            **update_split.mean(splits),
        },
        "setup": {"samples": args.samples, "prompt": args.prompt, "response": args.response, "micro": args.micro,
                  "shape": args.shape, "lengths": args.lengths, "packed": args.packed, "transformer_impl": impl,
                  "dynamic_tokens": args.dynamic_tokens, "recompute": args.recompute, "fp8": args.fp8,
                  "offload_optimizer": args.offload_optimizer, "logprob_between": args.logprob_between,
                  "onload_overlap": args.onload_overlap if args.offload_optimizer else None,
                  "onload_reserve_gb": args.onload_reserve_gb,
                  "fp8_recipe": args.fp8_recipe, "override_transformer_config": json.loads(args.override_transformer_config),
                  "model": f"Qwen2.5-{args.shape} shape, random bf16" if not args.model_dir else args.model_dir,
                  "layout": f"tp=1 pp=1 dp=1, distributed optimizer, {impl} layer spec",
                  "attention_backend": args.attention_backend,
                  "mfu_formula": "(6*N*tokens + 6*L*d_attn*sum(s_i^2)) / (update_seconds * 989e12); "
                                 "train_mfu_forward_backward (and train_mfu_7b, issue 19's measure) over the forward and "
                                 "backward passes only: no optimizer step, no optimizer-state onload; train_mfu (and "
                                 "train_mfu_7b_whole_update, issue 39's) over the whole update"},
    }
    if actor.arch.is_moe:  # issue 38's measure: active-parameter FLOPs over the forward and backward
        result["metrics"]["moe_mfu_active"] = result["metrics"]["train_mfu_forward_backward"]
        result["setup"]["experts"] = _experts(actor)
    if args.shape == "7b":
        result["metrics"]["train_mfu_7b"] = result["metrics"]["train_mfu_forward_backward"]
        if args.offload_optimizer:  # issue 39: the optimizer state's onload and the step included
            result["metrics"]["train_mfu_7b_whole_update"] = result["metrics"]["train_mfu"]
    if off is not None:
        result["metrics"].update(offload_seconds=off.seconds, offload_bytes=off.total_bytes,
                                 offload_params_bytes=off.params_bytes, offload_grads_bytes=off.grads_bytes,
                                 offload_optimizer_bytes=off.optimizer_bytes, onload_seconds=on.seconds,
                                 onload_bytes=on.total_bytes)
    if args.peer:
        with open(args.peer) as f:
            peer = json.load(f)
        m, p = result["metrics"], peer["metrics"]
        m["update_tokens_per_s_vs_peer"] = m["update_tokens_per_s"] / p["update_tokens_per_s"]
        m["logprob_tokens_per_s_vs_peer"] = m["logprob_tokens_per_s"] / p["logprob_tokens_per_s"]
        m["peak_memory_vs_peer"] = m["peak_memory_gib"] / p["peak_memory_gib"] if p["peak_memory_gib"] else None
        m.update(named_ratios(result["setup"], peer["setup"], m["update_tokens_per_s_vs_peer"]))
        result["setup"]["peer"] = {"attention_backend": peer["setup"].get("attention_backend", "local"),
                                   "command": peer["command"], "metrics": p}
    print(json.dumps(result, indent=2))
    print("MFU = (6 * N * tokens + 6 * L * d_attn * sum_i s_i^2) / (seconds * 989e12); "
          f"N={n_matmul:,}, tokens={tokens:,}, seconds={update_s:.3f}")
    if not args.cpu_dry_run:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        write_summary(os.path.splitext(args.out)[0] + ".md", result)
    if args.profile:  # after the result is out, so the profiled update is not in it; through update(), which moves
        profile_update(update, args.profile)  # the optimizer state off first with --offload-optimizer (7B: OOM)
    torch.distributed.destroy_process_group()


def _experts(actor) -> str:
    from hybridrl.adapters.megatron.weights import topology

    a = actor.arch
    grouped = topology(actor.engine.chunks, actor.layout, value_head=False).grouped_experts
    return (f"{a.num_experts} experts, top-{a.moe_topk}, width {a.moe_ffn_hidden_size}: "
            + ("one grouped GEMM a layer (TE)" if grouped else "one GEMM per expert"))


def _uses_te(actor) -> bool:
    from hybridrl.adapters.megatron.weights import topology

    return topology(actor.engine.chunks, actor.layout, value_head=False).te_names


# The ratio names: this run over a peer that differs in exactly that setting (same lease).
RATIOS = {"te_vs_local_tokens_per_s": ("transformer_impl", "transformer_engine", "local"),
          "packed_vs_padded_tokens_per_s": ("packed", True, False)}


def named_ratios(mine: dict, peer: dict, ratio: float) -> dict[str, float]:
    compared = ("transformer_impl", "packed", "shape", "lengths", "samples", "dynamic_tokens", "recompute", "fp8",
                "offload_optimizer", "onload_overlap", "logprob_between")
    differ = {k for k in compared if mine.get(k) != peer.get(k)}
    return {name: ratio for name, (key, this, other) in RATIOS.items()
            if differ == {key} and mine.get(key) == this and peer.get(key) == other}


def write_summary(path: str, result: dict) -> None:
    """The short NAME.md that DEVELOPERS.md asks for next to each result."""
    m, s = result["metrics"], result["setup"]
    lines = [
        "# train_bench: megatron-core PPO update on one GPU",
        "",
        f"`{result['command']}` on {result['device']}, {result['date']}.",
        "",
        f"Model: {s['model']}; {s['layout']}. One update = {s['samples']} samples (prompt <= {s['prompt']}, "
        f"response <= {s['response']} tokens, random lengths), micro-batches of {s['micro']}, one optimizer step.",
        "",
        f"- update: {m['update_tokens_per_s']:,.0f} tokens/s ({m['update_seconds']:.2f} s for {m['tokens_per_update']:,} "
        f"valid tokens); log-prob forward: {m['logprob_tokens_per_s']:,.0f} tokens/s",
        f"- train_mfu: {m['train_mfu']:.3f} = {s['mfu_formula']} (N = {m['matmul_params']:,} matmul weights)",
        f"- of the update: forward+backward {m['forward_backward_seconds']:.2f} s (MFU "
        f"{m['train_mfu_forward_backward']:.3f}), optimizer step {m['optimizer_step_seconds']:.2f} s, optimizer-state "
        f"onload waited for {m.get('optimizer_onload_exposed_seconds', m['optimizer_onload_seconds']):.2f} s",
        f"- peak memory during updates: {m['peak_memory_gib']:.2f} GiB",
        *update_split.describe(m),
    ]
    if s.get("offload_optimizer"):
        lines.append(
            f"- optimizer state (--onload-overlap {s['onload_overlap']}, {m['onload_reserve_gib']:.1f} GiB kept free for "
            f"the forward/backward; its activations: {m['plan_train_activations_gib']:.1f} GiB planned, "
            f"{m['measured_train_activations_gib']:.1f} GiB measured): back from the host "
            f"in {m['optimizer_onload_seconds']:.2f} s of copies, {m['optimizer_onload_overlap']:.0%} of the bytes sent "
            f"for at the update's start, {m['optimizer_onload_exposed_seconds']:.2f} s waited for by the step; to the "
            f"host in {m['optimizer_offload_seconds']:.2f} s ({m['optimizer_offload_exposed_seconds']:.2f} s waited for, "
            "with nothing between the updates here)")
    if "offload_bytes" in m:
        lines.append(
            f"- offload: {m['offload_bytes'] / 2**30:.2f} GiB in {m['offload_seconds']:.3f} s "
            f"(params {m['offload_params_bytes'] / 2**30:.2f}, grads {m['offload_grads_bytes'] / 2**30:.2f} released, "
            f"optimizer {m['offload_optimizer_bytes'] / 2**30:.2f}); onload {m['onload_bytes'] / 2**30:.2f} GiB in "
            f"{m['onload_seconds']:.3f} s")
    lines += [
        "",
        f"Layer spec: {s.get('transformer_impl', 'local')}; attention backend {s['attention_backend']} (auto = TE's "
        "choice, or torch SDPA on the local spec, adapters/megatron/attention.py; local = megatron's unfused "
        f"DotProductAttention); packed micro-batches: {s.get('packed', False)}; lengths: {s.get('lengths', 'uniform')}.",
    ]
    for name in RATIOS:
        if name in m:
            lines.append(f"- {name}: {m[name]:.2f} (against the peer run below, same lease)")
    if "peer" in s:
        lines += ["", f"Against the same run with attention_backend={s['peer']['attention_backend']} (same lease): update "
                  f"{m['update_tokens_per_s_vs_peer']:.2f}x tokens/s, log-prob forward {m['logprob_tokens_per_s_vs_peer']:.2f}x, "
                  f"peak memory {m['peak_memory_vs_peer']:.2f}x."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
