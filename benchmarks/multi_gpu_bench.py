"""Layouts across GPUs (issues 8 and 9): training parity of tp/pp/dp against one GPU, the NVLink all-gather
floor, and a summary of GRPO runs of the real trainer on 1 and N GPUs.

Subcommands (the rows of benchmarks/rows_two_gpu.py string them together on the GPU host):
    model      random Qwen2-shaped model (+ the demo's tokenizer and arithmetic data) in HF format
    parity     under torchrun: one layout's log-probs, one update's loss and grad norm, log-probs after it
    allgather  under torchrun: NCCL all-gather bandwidth (bytes each rank receives per second)
    report     the results JSON (DEVELOPERS.md format) from the parity files, the all-gather file and the
               trainers' metrics.jsonl

--cpu runs every subcommand on gloo with a tiny model (the dry run of the same code: no numbers kept).
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

SHAPES = {  # Qwen2.5 shapes; weights are random
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
               num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
    "14b": dict(vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                num_attention_heads=40, num_key_value_heads=8, tie_word_embeddings=False),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=True),
}
# Qwen3-MoE shapes (issue 20): Qwen3-30B-A3B's layer (head_dim 128, q/k norms, normalised top-k, untied head)
# scaled down. moe_1b: 1.28B total, 0.49B active per token (printed by `model`); moe_tiny: the CPU dry run's.
# moe_8b (issue 38's four-GPU shape): Qwen3-30B-A3B's width, expert width and 64 experts top-8 over 24 layers:
# 8.12B total, 1.16B active per token outside the two embedding tables (1.78B with them).
MOE_SHAPES = {
    "moe_8b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                   num_experts=64, num_experts_per_tok=8, num_hidden_layers=24, num_attention_heads=16,
                   num_key_value_heads=4, head_dim=128, tie_word_embeddings=False),
    "moe_1b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, moe_intermediate_size=768,
                   num_experts=32, num_experts_per_tok=4, num_hidden_layers=12, num_attention_heads=16,
                   num_key_value_heads=4, head_dim=128, tie_word_embeddings=False),
    "moe_tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=16,
                     num_experts_per_tok=4, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, tie_word_embeddings=False),
}
MOE_COMMON = dict(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001)
COMMON = dict(max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6)
# The GRPO timing keys reported per run (verl's names), averaged over steps after the first.
TIMING = ["timing_s/step", "timing_s/gen", "timing_s/reshard", "timing_s/reward", "timing_s/old_log_prob",
          "timing_s/ref", "timing_s/adv", "timing_s/update_actor"]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("--dir", required=True)
    m.add_argument("--shape", default="1.5b", choices=sorted(SHAPES) + sorted(MOE_SHAPES))
    m.add_argument("--no-weights", action="store_true",
                   help="config, tokenizer and data only: for jobs with actor_rollout_ref.actor.load_weight=false")
    for name in ("parity", "allgather"):
        s = sub.add_parser(name)
        s.add_argument("--out", required=True)
        s.add_argument("--cpu", action="store_true")
    par = sub.choices["parity"]
    par.add_argument("--dir", required=True)
    par.add_argument("--tp", type=int, default=1)
    par.add_argument("--pp", type=int, default=1)
    par.add_argument("--samples", type=int, default=16)
    par.add_argument("--prompt", type=int, default=64)
    par.add_argument("--response", type=int, default=192)
    ag = sub.choices["allgather"]
    ag.add_argument("--mib", type=int, default=512, help="bytes each rank receives per all-gather, MiB")
    ag.add_argument("--ipc", action="store_true", help="also time a pull of the peer's buffer over CUDA IPC (copy engine)")
    r = sub.add_parser("report")
    r.add_argument("--in-dir", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--command", default="python3 benchmarks/runs.py run multi_report")
    r.add_argument("--name", default="two_gpu")
    return p.parse_args()


# ------------------------------------------------------------------------------------------ model
def make_model(folder: str, shape: str, weights: bool = True) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from hybridrl.data.tokenizer import build_tiny_tokenizer
    from hybridrl.trainer.demo import DEMO_ALPHABET, write_data

    cuda = torch.cuda.is_available() and "tiny" not in shape
    torch.manual_seed(0)
    with torch.device("meta" if not weights else "cuda" if cuda else "cpu"):
        if shape in MOE_SHAPES:
            model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**MOE_SHAPES[shape], **MOE_COMMON, **COMMON))
        else:
            model = Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape], **COMMON))
    model = model.to(torch.bfloat16 if cuda or not weights else torch.float32)
    # the demo's character tokenizer (a random model's extra ids decode to ""), plus the newline ChatML writes after
    # each turn, twice: "\n" for the tokenizer as saved, and "Ċ", its byte-level spelling, because transformers 5
    # loads any qwen2 folder with Qwen2Tokenizer (byte-level BPE over the same vocabulary), which drops an unknown
    # "\n"; verl's Qwen agent loop needs it to be one token (benchmarks/peer_verl's 1.5B job)
    tok = build_tiny_tokenizer(alphabet=DEMO_ALPHABET + "\n\u010a")
    tok.save_pretrained(folder)
    model.config.update(dict(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                             bos_token_id=tok.bos_token_id))
    if weights:
        model.save_pretrained(folder)
    else:  # the job starts from random weights: a 7B folder without its 15 GB file
        model.config.dtype = model.dtype
        model.config.save_pretrained(folder)
    write_data(os.path.join(folder, "data"), n_train=4096, n_test=64, seed=0)
    n = sum(p.numel() for p in model.parameters())
    if shape in MOE_SHAPES:
        from hybridrl.plan.model_shape import from_hf_config

        counted = from_hf_config(model.config.to_dict(), name=shape)
        assert counted.params == n, f"plan's parameter count {counted.params} != the model's {n}"
        c = model.config
        print(f"model: Qwen3-MoE {shape} shape, {n / 1e9:.2f}B total parameters, {counted.active_params / 1e9:.3f}B "
              f"active per token ({c.num_experts} experts, top-{c.num_experts_per_tok}), {model.dtype}, in {folder}",
              flush=True)
    else:
        print(f"model: Qwen2 {shape} shape, {n / 1e9:.2f}B parameters, {model.dtype}, in {folder}", flush=True)


# ------------------------------------------------------------------------------------------ parity
def parity(args: argparse.Namespace) -> None:
    """Log-probs, one PPO update and log-probs after it, for the layout (tp, pp, dp = world / (tp*pp))."""
    import torch.distributed as dist

    from hybridrl.adapters.megatron import compat, parallel
    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.config.layout import BatchPlan
    from hybridrl.config.schema.actor import ActorConfig, ModelConfig
    from hybridrl.config.schema.common import MegatronConfig, OptimConfig
    from hybridrl.protocol import DataProto

    if args.cpu:
        compat.apply()
    parallel.ensure_process_group(timeout_s=600)
    world, rank = dist.get_world_size(), dist.get_rank()
    layout = parallel.layout_for(world, args.tp, args.pp, dtype="float32" if args.cpu else "bfloat16")
    parallel.init_megatron(layout, seed=1)
    n, dp = args.samples, layout.dp
    cfg = ActorConfig(ppo_mini_batch_size=n, ppo_micro_batch_size_per_gpu=2, loss_agg_mode="token-mean",
                      clip_ratio=0.2, optim=OptimConfig(lr=1e-5, clip_grad=1.0, total_training_steps=10),
                      megatron=MegatronConfig(use_distributed_optimizer=True, sequence_parallel=False, seed=1))
    plan = BatchPlan(samples_per_step=n, mini_batch_samples=n, mini_batches_per_epoch=1, ppo_epochs=1,
                     mini_batch_per_dp=n // dp, micro_batch_per_gpu=2, grad_accum=n // dp // 2, use_dynamic_bsz=False,
                     max_token_len_per_gpu=16384, forward_micro_batch_per_gpu=4, forward_max_token_len_per_gpu=16384)
    start = time.perf_counter()
    actor = MegatronActor(ModelConfig(path=args.dir), cfg, layout, plan)
    build_s = time.perf_counter() - start
    from train_bench import random_rollout_batch  # benchmarks/ is this script's folder

    full = random_rollout_batch(n, args.prompt, args.response, actor.arch.vocab_size, min_keep=args.response // 2,
                                max_id=30000)
    info = actor.dispatch_info()
    rows = slice(info.dp_rank * n // dp, (info.dp_rank + 1) * n // dp)  # this rank's dp slice, as the dispatcher cuts
    mine = DataProto.from_dict({k: v[rows] for k, v in full.items()}, meta_info={"temperature": 1.0})

    before = actor.compute_log_prob(mine).batch["log_probs"]
    g = torch.Generator().manual_seed(7)
    noise, adv = torch.randn(n, args.response, generator=g), torch.randn(n, args.response, generator=g)
    # old log-probs off the current ones by fixed noise: the ratio is not 1, so the loss depends on the model
    mine.batch["old_log_probs"] = before + 0.05 * noise[rows]
    mine.batch["advantages"] = adv[rows] * mine.batch["response_mask"]
    start = time.perf_counter()
    metrics = actor.update_policy(mine)
    update_s = time.perf_counter() - start
    after = actor.compute_log_prob(mine).batch["log_probs"]

    pieces = [None] * world
    dist.all_gather_object(pieces, (info.dp_rank, info.is_collect, before, after))
    if rank == 0:
        got = {d: (b, a) for d, c, b, a in pieces if c}
        record = {
            "layout": {"tp": layout.tp, "pp": layout.pp, "dp": dp, "world": world},
            "pg_loss": metrics["actor/pg_loss"], "grad_norm": metrics["actor/grad_norm"],
            "pg_clipfrac": metrics["actor/pg_clipfrac"], "update_applied": metrics["actor/update_applied"],
            "build_and_import_seconds": build_s, "update_seconds": update_s,
            "device": torch.cuda.get_device_name() if compat.cuda_in_use() else "cpu",
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        from safetensors.torch import save_file

        save_file({"before": torch.cat([got[d][0] for d in range(dp)]).contiguous(),
                   "after": torch.cat([got[d][1] for d in range(dp)]).contiguous(),
                   "mask": full["response_mask"].contiguous()}, args.out.replace(".json", ".safetensors"))
        print(f"parity {record['layout']}: pg_loss {record['pg_loss']:.6f} grad_norm {record['grad_norm']:.6f} "
              f"(build {build_s:.0f}s, update {update_s:.1f}s)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------ all-gather
def allgather(args: argparse.Namespace) -> None:
    """Bandwidth of all_gather_into_tensor: bytes each rank ends up receiving from the others per second."""
    import torch.distributed as dist

    # plain torch (NCCL, or gloo with --cpu): the probe runs on a bare GPU host, before any bundle is unpacked
    cuda = not args.cpu and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    world = dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    total = (args.mib if not args.cpu else 8) << 20
    shard = torch.ones(total // 2 // world, dtype=torch.bfloat16, device=dev)
    out = torch.empty(shard.numel() * world, dtype=torch.bfloat16, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(3):
        dist.all_gather_into_tensor(out, shard)
    sync()
    reps = 10
    start = time.perf_counter()
    for _ in range(reps):
        dist.all_gather_into_tensor(out, shard)
    sync()
    seconds = (time.perf_counter() - start) / reps
    received = shard.numel() * 2 * (world - 1)
    from bench_common import d2d_bandwidth  # benchmarks/ is this script's folder

    d2d = d2d_bandwidth(dev.type, out.numel() * 2)  # the floor for bytes written into the engine on this GPU
    pairs = pair_exchange(dev, shard.numel() * 2 * (world - 1), sync, args.ipc) if world % 2 == 0 else {}
    if dist.get_rank() == 0:
        record = {"world": world, "output_bytes": out.numel() * 2, "seconds": seconds,
                  "algbw_bytes_per_s": out.numel() * 2 / seconds, "busbw_bytes_per_s": received / seconds,
                  "d2d_bytes_per_s": d2d, **pairs}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        print(f"all-gather over {world} ranks: {record['busbw_bytes_per_s'] / 1e9:.1f} GB/s bus bandwidth, "
              f"{record['algbw_bytes_per_s'] / 1e9:.1f} GB/s algorithm bandwidth", flush=True)
    dist.destroy_process_group()


def pair_exchange(dev: torch.device, nbytes: int, sync, ipc: bool = False) -> dict[str, float]:
    """What the cross-GPU weight copy moves (hybrid/remote.py): rank r and its neighbour r ^ 1 swap `nbytes` at once,
    as one message and as rounds of 256 MiB (batch_isend_irecv, NCCL point-to-point on GPU), beside an all-gather
    of the same bytes in a group of the two. Bytes each rank receives per second; every pair runs at once."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    peer = rank ^ 1
    groups = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]
    pair = groups[rank // 2]
    send = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    recv = torch.empty_like(send)

    def exchange(chunk: int) -> None:
        for lo in range(0, nbytes, chunk):
            n = min(chunk, nbytes - lo)
            ops = [dist.P2POp(dist.isend, send.narrow(0, lo, n), peer), dist.P2POp(dist.irecv, recv.narrow(0, lo, n), peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    gathered = torch.empty(2 * nbytes, dtype=torch.uint8, device=dev)
    ways = {"p2p_one_message": lambda: exchange(nbytes), "p2p_rounds_256mib": lambda: exchange(256 << 20),
            "pair_all_gather": lambda: dist.all_gather_into_tensor(gathered, send, group=pair)}
    if world > 2:  # tp2 x dp2 -> tp_g1 x dp_g4: a rank's missing half is held by its tp peer and that peer's dp copy
        ring = sorted({(rank - 1) % world, (rank + 1) % world})

        def two_peers() -> None:
            half = nbytes // 2
            ops = []
            for k, p in enumerate(ring):
                ops += [dist.P2POp(dist.isend, send.narrow(0, k * half, half), p),
                        dist.P2POp(dist.irecv, recv.narrow(0, k * half, half), p)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        ways["p2p_two_peers"] = two_peers
    if ipc and dev.type == "cuda":
        ways["ipc_copy_engine"] = _ipc_pull(send, recv, peer, sync)
    out = {"pair_bytes": float(nbytes)}
    for name, fn in ways.items():
        fn()  # warm-up: NCCL connects a new peer on first use
        sync()
        start = time.perf_counter()
        for _ in range(5):
            fn()
        sync()
        out[f"{name}_bytes_per_s"] = nbytes * 5 / (time.perf_counter() - start)
    if rank == 0:
        print("pairs swapping " + f"{nbytes / 2**20:.0f} MiB: " + ", ".join(
            f"{k[:-len('_bytes_per_s')]} {v / 1e9:.1f} GB/s" for k, v in out.items() if k.endswith("_per_s")), flush=True)
    return out


def _ipc_pull(send: torch.Tensor, recv: torch.Tensor, peer: int, sync):
    """The peer's send buffer opened through CUDA IPC and copied into `recv` by this process (a device-to-device
    copy across NVLink by the copy engines, no NCCL): the transport a pull-based cross-GPU copy would use. Each
    timed pass ends in a barrier, so no rank reads a buffer its peer has not finished writing (here: never rewritten)."""
    import torch.distributed as dist
    from torch.multiprocessing.reductions import reduce_tensor

    handles: list = [None] * dist.get_world_size()
    dist.all_gather_object(handles, reduce_tensor(send))
    rebuild, rebuild_args = handles[peer]
    peer_send = rebuild(*rebuild_args)

    def pull() -> None:
        recv.copy_(peer_send, non_blocking=True)
        sync()
        dist.barrier()
    return pull


# ------------------------------------------------------------------------------------------ report
def parity_metrics(in_dir: str) -> dict:
    from safetensors.torch import load_file

    ref_path = os.path.join(in_dir, "parity_tp1_pp1_dp1.json")
    if not os.path.exists(ref_path):
        return {}
    ref, ref_t = json.load(open(ref_path)), load_file(ref_path.replace(".json", ".safetensors"))
    out = {}
    for path in sorted(glob.glob(os.path.join(in_dir, "parity_*.json"))):
        if path == ref_path:
            continue
        rec, t = json.load(open(path)), load_file(path.replace(".json", ".safetensors"))
        lay = rec["layout"]
        name = "dp2" if lay["dp"] > 1 and lay["tp"] == lay["pp"] == 1 else ("tp2" if lay["tp"] > 1 else "pp2")
        mask = ref_t["mask"].bool()
        for when in ("before", "after"):
            gap = (t[when] - ref_t[when]).abs()[mask]
            out[f"{name}_logprob_abs_diff_mean_{when}_update"] = float(gap.mean())
            out[f"{name}_logprob_abs_diff_max_{when}_update"] = float(gap.max())
        out[f"{name}_pg_loss"] = rec["pg_loss"]
        out[f"{name}_pg_loss_rel_gap"] = abs(rec["pg_loss"] - ref["pg_loss"]) / abs(ref["pg_loss"])
        out[f"{name}_grad_norm"] = rec["grad_norm"]
        out[f"{name}_grad_norm_rel_gap"] = abs(rec["grad_norm"] - ref["grad_norm"]) / ref["grad_norm"]
    out["one_gpu_pg_loss"], out["one_gpu_grad_norm"] = ref["pg_loss"], ref["grad_norm"]
    return out


def grpo_summary(metrics_file: str) -> dict:
    rows = [json.loads(line) for line in open(metrics_file)]
    steps = [r for r in rows if "timing_s/step" in r]
    if not steps:
        return {"error": f"no training steps in {metrics_file}"}
    timed = steps[1:] or steps  # the first step carries start-up (compilation, allocator growth)
    mean = lambda key: statistics.mean(r[key] for r in timed if key in r) if any(key in r for r in timed) else None  # noqa: E731
    out = {k.split("/")[-1] + "_s": mean(k) for k in TIMING if mean(k) is not None}
    out.update({
        "steps": len(steps), "steps_timed": len(timed),
        "tokens_per_s_per_gpu": mean("perf/throughput"),
        "mfu_update": mean("perf/mfu/actor"),
        "logprob_abs_diff_mean": mean("rollout_vs_actor/logprob_abs_diff_mean"),
        "logprob_abs_diff_max": max(r.get("rollout_vs_actor/logprob_abs_diff_max", 0.0) for r in steps),
        "reshard_bytes": mean("reshard/bytes"),
        "reshard_direct_bytes": mean("reshard/direct_bytes") or 0.0,
        "reshard_stream_s": mean("timing_s/reshard_stream"),
        "reshard_wait_s": mean("timing_s/reshard_wait"),
        "reshard_stream_s_per_step": [r.get("timing_s/reshard_stream") for r in steps],
        "rollout_peak_used_bytes": max(r.get("memory/rollout_used_bytes", 0.0) for r in steps),
        "train_peak_bytes": max(r.get("memory/train_peak_bytes", 0.0) for r in steps),
        "score_mean": mean("critic/score/mean"), "response_length_mean": mean("response_length/mean"),
    })
    return out


def sync_floor(run: dict, ag: dict) -> dict:
    """The least time a sync of this run can take, from bandwidths measured in the same lease:
      nvlink: bytes that went through the export cross GPUs in the tp all-gather (actor tp > 1) at the
              measured all-gather algorithm bandwidth (output bytes per second);
      local:  every byte the engine ends up holding on this GPU is written once, at the device copy bandwidth.
    The two could overlap, so the floor is the larger one."""
    streamed = run["reshard_bytes"] - run.get("reshard_direct_bytes", 0.0)
    nvlink = streamed / ag["algbw_bytes_per_s"] if run.get("actor_tp", 1) > 1 else 0.0
    local = run["reshard_bytes"] / ag["d2d_bytes_per_s"] if ag.get("d2d_bytes_per_s") else 0.0
    return {"sync_floor_nvlink_seconds": nvlink, "sync_floor_local_seconds": local,
            "sync_floor_seconds": max(nvlink, local)}


def report(args: argparse.Namespace) -> None:
    metrics = parity_metrics(args.in_dir)
    extra: dict = {}
    ag_file = os.path.join(args.in_dir, "allgather.json")
    ag = json.load(open(ag_file)) if os.path.exists(ag_file) else None
    if ag:
        metrics["allgather_busbw_bytes_per_s"] = ag["busbw_bytes_per_s"]
        metrics["allgather_algbw_bytes_per_s"] = ag["algbw_bytes_per_s"]
        if "d2d_bytes_per_s" in ag:
            metrics["d2d_bytes_per_s"] = ag["d2d_bytes_per_s"]
    runs = {}
    for path in sorted(glob.glob(os.path.join(args.in_dir, "grpo_*", "logs", "metrics.jsonl"))):
        name = os.path.basename(os.path.dirname(os.path.dirname(path)))[len("grpo_"):]
        runs[name] = grpo_summary(path)
        info = os.path.join(os.path.dirname(os.path.dirname(path)), "run.json")
        if os.path.exists(info):
            runs[name].update(json.load(open(info)))
    for name, r in runs.items():
        if "error" in r:
            continue
        metrics[f"{name}_logprob_abs_diff_mean"] = r["logprob_abs_diff_mean"]
        metrics[f"{name}_tokens_per_s_per_gpu"] = r["tokens_per_s_per_gpu"]
        metrics[f"{name}_step_s"] = r.get("step_s")
        reshard = r.get("reshard_stream_s") or r.get("reshard_s")
        if reshard and r.get("reshard_bytes"):
            metrics[f"{name}_sync_seconds"] = reshard
            if ag:
                metrics.update({f"{name}_{k}": v for k, v in sync_floor(r, ag).items()})
                metrics[f"{name}_sync_time_over_floor"] = reshard / metrics[f"{name}_sync_floor_seconds"]
    one = runs.get("1gpu", {})
    for name, r in runs.items():
        if name != "1gpu" and one.get("tokens_per_s_per_gpu") and r.get("tokens_per_s_per_gpu"):
            metrics[f"{name}_scaling_per_gpu_vs_1gpu"] = r["tokens_per_s_per_gpu"] / one["tokens_per_s_per_gpu"]
    extra["grpo_runs"] = runs
    device = next((json.load(open(p)).get("device") for p in glob.glob(os.path.join(args.in_dir, "parity_*.json"))),
                  None) or (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    record = {"command": args.command, "device": device, "date": datetime.date.today().isoformat(),
              "metrics": metrics, **extra}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(record, indent=1))


def main() -> None:
    args = parse()
    {"model": lambda: make_model(args.dir, args.shape, weights=not args.no_weights), "parity": lambda: parity(args),
     "allgather": lambda: allgather(args), "report": lambda: report(args)}[args.cmd]()


if __name__ == "__main__":
    main()
