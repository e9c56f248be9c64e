"""The 3D-HybridEngine on one GPU: a Megatron actor and a colocated vLLM engine, Qwen2.5-0.5B shape, bf16,
CUDA graphs on (vLLM's default; --eager measures eager on purpose).

Runs the real role worker (hybridrl.workers.ActorRolloutRefWorker) in this process and measures
  rollout_tokens_per_s        generation inside the hybrid engine, alternated rep by rep (--reps, >= 5) with
                              standalone vllm.LLM peers kept alive in their own processes (standalone_vllm.py):
                              "plain" (vLLM's defaults) and "sleep" (enable_sleep_mode, isolates the sleep-mode
                              allocator the hybrid engine needs); same prompts, sampling, capture sizes, memory
                              share: rollout_tokens_per_s_vs_standalone is the median of the per-rep ratios
  logprob gap table           on the unchanged random model: vLLM's token log-probs vs the actor (SDPA and
                              megatron's unfused attention), transformers bf16 and a float32 reference
                              (gap_bench.py's method); gap_over_bf16_floor = actor-vs-vLLM / transformers-bf16-vs-vLLM
  follow check                every actor weight changed (+0.02 over two syncs): the engine's own parameters equal
                              a fresh export, and its log-probs on new samples follow the changed actor
                              (follow gap) instead of the old one (stale gap)
  sleep_freed_fraction        (used with the engine awake - used asleep) / (awake - before the engine started)
  sync_seconds                median wall time of moving the weights actor -> engine (the direct copy), against
  sync_floor_seconds          bytes / measured device-to-device copy bandwidth; sync_streamed_seconds: the same
                              sync through export + load_weights
  peak memory per phase       against `hybridrl plan --json` for the same config (issue 7)
and writes reshard_bench.json, rollout_bench.json and plan_vs_measured_0.5b_1gpu.json (DEVELOPERS.md format).

    PYTHONPATH=$PWD:/tmp/site python benchmarks/hybrid_bench.py --out-dir benchmarks/results
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import (  # noqa: E402  (benchmarks/: this script's folder)
    d2d_bandwidth,
    hf_log_probs,
    make_prompts,
    prompt_ids,
    start_worker,
    swap_attention,
    vocab_of,
)
from bench_common import gap_table as engine_gaps  # noqa: E402

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

SHAPE = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
             num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
             tie_word_embeddings=True)
TINY = dict(SHAPE, vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)
PEERS = {"plain": False, "sleep": True}  # standalone peer name -> enable_sleep_mode
CHANGE = 0.01  # added to every actor weight before each of the two follow-check syncs


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--model-dir", default=None, help="HF folder to use instead of a random Qwen2.5-0.5B shape")
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--syncs", type=int, default=8)
    p.add_argument("--reps", type=int, default=5, help="timed generations per engine, alternating")
    p.add_argument("--peers", default="plain,sleep", help="standalone peers: plain, sleep (comma list; '' for none)")
    p.add_argument("--gpu-util", type=float, default=0.25,
                   help="gpu_memory_utilization of every engine (the peers and the hybrid engine are alive together)")
    p.add_argument("--eager", action="store_true", help="vLLM enforce_eager on every engine (measures eager on purpose)")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="exercise the script on CPU (tiny model, torch engine, no standalone peers); writes nothing")
    return p.parse_args()


# ------------------------------------------------------------------------------------------ inputs
def make_model(folder: str, cpu: bool = False) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hybridrl.data.tokenizer import build_tiny_tokenizer

    torch.manual_seed(0)
    shape = TINY if cpu else SHAPE
    with torch.device("cpu" if cpu else "cuda"):
        model = Qwen2ForCausalLM(Qwen2Config(**shape)).to(torch.float32 if cpu else torch.bfloat16)
    model.save_pretrained(folder)
    del model
    if not cpu:
        torch.cuda.empty_cache()
    # the worker wants a tokenizer with a chat template; prompts here are random token ids, so any will do
    build_tiny_tokenizer().save_pretrained(folder)
    return folder


def engine_kwargs(args: argparse.Namespace) -> dict:
    """What the hybrid engine is built with, for the standalone peers (equal, so the comparison is fair)."""
    from hybridrl.rollout.vllm_engine import capture_sizes

    kw = dict(gpu_memory_utilization=args.gpu_util, enforce_eager=args.eager, max_num_seqs=1024,
              max_num_batched_tokens=8192, seed=0, max_model_len=args.prompt_len + args.max_tokens,
              enable_chunked_prefill=True, enable_prefix_caching=True)
    if not args.eager:  # the sizes the hybrid engine fits to its batch (max_rollout_rows = the prompts)
        kw["compilation_config"] = {"cudagraph_capture_sizes": capture_sizes(args.prompts, 1024)}
    return kw


def start_peers(args: argparse.Namespace, model_dir: str, log_dir: str) -> dict:
    """The standalone peers, started one after another (each profiles memory on its own)."""
    from standalone_vllm import StandalonePeer

    prompts_file = os.path.join(log_dir, "prompts.json")
    with open(prompts_file, "w") as f:
        json.dump(prompt_ids(args.prompts, args.prompt_len, vocab_of(model_dir)), f)
    peers = {}
    for name in [p for p in args.peers.split(",") if p]:
        start = time.perf_counter()
        peers[name] = StandalonePeer(name, model_dir, prompts_file, args.max_tokens, engine_kwargs(args),
                                     sleep_mode=PEERS[name], log_path=os.path.join(log_dir, f"peer_{name}.log"))
        print(f"peer {name}: ready in {time.perf_counter() - start:.0f}s {json.dumps(peers[name].info)}", flush=True)
    return peers


# ------------------------------------------------------------------------------------------ hybrid
def alternate(worker, peers: dict, prompts, reps: int) -> dict:
    """`reps` timed generations per engine, the order rotated every rep; per-rep hybrid/peer ratios."""
    engines = ["hybrid", *peers]
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for rep in range(reps):
        for name in engines[rep % len(engines):] + engines[:rep % len(engines)]:
            if name == "hybrid":
                out = worker.generate_sequences(prompts)
                runs[name].append({"tokens": float(out.batch["response_mask"].sum()),
                                   "seconds": out.meta_info["metrics"]["timing_s/generate"]})
            else:
                runs[name].append(peers[name].run())
        print(f"rep {rep}: " + ", ".join(f"{n} {r[-1]['tokens'] / r[-1]['seconds']:.0f} tok/s" for n, r in runs.items()),
              flush=True)
    tps = {name: [r["tokens"] / r["seconds"] for r in rs] for name, rs in runs.items()}
    ratios = {name: [h / p for h, p in zip(tps["hybrid"], tps[name])] for name in peers}
    return {"tokens_per_s": tps, "ratios": ratios}


def gap_table(worker, out, model_dir: str, cuda: bool) -> dict:
    """gap_bench's table on `out` (tokens generated by the hybrid engine): every engine's log-probs against
    vLLM's and against a float32 transformers reference."""
    import torch

    mask = out.batch["response_mask"]
    lps = {"vllm": out.batch["rollout_log_probs"], "megatron_sdpa": worker.compute_log_prob(out).batch["old_log_probs"]}
    if swap_attention(worker, to_local=True):
        lps["megatron_local"] = worker.compute_log_prob(out).batch["old_log_probs"]
        swap_attention(worker, to_local=False)
    prompt_len = out.batch["prompts"].shape[1]
    device = "cuda" if cuda else "cpu"
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # a float32 reference must not run its matmuls in TF32
    if cuda:
        lps["hf_bf16"] = hf_log_probs(model_dir, torch.bfloat16, device, out.batch["input_ids"], prompt_len, 8)
    lps["hf_fp32"] = hf_log_probs(model_dir, torch.float32, device, out.batch["input_ids"], prompt_len, 8)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    table = engine_gaps(lps, mask)
    for k, v in table.items():
        print(f"gap {k:32s} mean {v['mean']:.5f}  max {v['max']:.4f}", flush=True)
    return table


def follow_check(worker, prompts) -> dict:
    """Change every actor weight (+CHANGE before each of two syncs) and check that the engine follows: its own
    parameters equal a fresh export (weights_follow_the_actor), and on samples generated after the change its
    log-probs match the changed actor (follow) far better than the unchanged one (stale). Restores the weights."""
    import torch

    from hybridrl.adapters.megatron.builder import unwrap
    from hybridrl.hybrid.checks import logprob_gap

    params = [p for chunk in worker.actor.engine.chunks for p in unwrap(chunk).parameters()]
    saved = [p.detach().clone() for p in params]
    mismatches = weights_follow_the_actor(worker)
    out = worker.generate_sequences(prompts)
    out.meta_info["temperature"] = 1.0
    key = "rollout_vs_actor/logprob_abs_diff_mean"
    follow = logprob_gap(out.batch["rollout_log_probs"], worker.compute_log_prob(out).batch["old_log_probs"],
                         out.batch["response_mask"])[key]
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    stale = logprob_gap(out.batch["rollout_log_probs"], worker.compute_log_prob(out).batch["old_log_probs"],
                        out.batch["response_mask"])[key]
    print(f"follow check: engine-vs-actor weight mismatches {len(mismatches)}; log-prob gap to the changed actor "
          f"{follow:.5f}, to the unchanged one {stale:.5f}", flush=True)
    return {"fresh_mismatches": mismatches, "follow_gap": follow, "stale_gap": stale}


def weights_follow_the_actor(worker, steps: int = 2) -> list[str]:
    """Change every actor parameter, sync, and compare the engine's own parameters (read by the engine,
    not through the copy plan's views) with a fresh export: the weights that differ, over `steps` syncs."""
    import torch

    from hybridrl.adapters.megatron.builder import unwrap

    bad: list[str] = []
    offloaded = worker.sync.options.param_offload
    for step in range(steps):
        with torch.no_grad():
            for chunk in worker.actor.engine.chunks:
                for p in unwrap(chunk).parameters():
                    p.add_(CHANGE)
        with worker.sync.rollout_phase(1000 + step):
            if offloaded:  # the sync offloads the params once it is done: bring them back to export
                worker.actor.onload(params=True, grads=False, optimizer=False)
            sent = {n: (float(t.double().sum()), float(t.double().abs().sum()))
                    for bucket in worker.actor.export_weights(1 << 30) for n, t in bucket}
            engine = worker.engine.weight_checksums(list(sent))
            for name in sent:
                parts = worker.engine.checksum_terms(name)
                want = sum(c * sent[m][0] for m, c in parts)
                scale = sum(abs(c) * sent[m][1] for m, c in parts)
                if not abs(engine[name] - want) <= 1e-6 * scale:
                    bad.append(f"step {step}: {name}")
            if offloaded:
                worker.actor.offload(params=True, grads=False, optimizer=False)
    return bad


def sync_times(worker, syncs: int) -> dict:
    """Syncs without generation: the direct copy's time, then one sync with the direct copy switched off
    (export + load_weights, the path every weight took before)."""
    steady = []
    for step in range(syncs):
        with worker.sync.rollout_phase(step) as m:
            pass
        steady.append(m)
    direct, worker.sync._direct = worker.sync._direct, None
    with worker.sync.rollout_phase(syncs) as streamed:
        pass
    worker.sync._direct = direct
    return {"steady": steady, "streamed": streamed}


def hybrid_run(args: argparse.Namespace, model_dir: str, peers: dict | None = None) -> dict:
    import torch

    from hybridrl.protocol import DataProto
    from hybridrl.utils.device import device_memory_used

    cuda = not args.cpu_dry_run
    worker, overrides, info = start_worker(config_overrides(args, model_dir), model_dir, args.cpu_dry_run,
                                           max_rollout_rows=args.prompts)
    info = info[0] if isinstance(info, list) else info
    mem = {k: v for k, v in info.items() if k.endswith("_bytes")}
    engine_bytes = mem["engine_awake_bytes"] - mem["before_engine_bytes"]
    freed = (mem["engine_awake_bytes"] - mem["engine_asleep_bytes"]) / engine_bytes if engine_bytes else float("nan")
    prompts = make_prompts(args.prompts, args.prompt_len, vocab_of(model_dir))
    worker.generate_sequences(prompts[:8])  # warm-up, as the peers have
    speed = alternate(worker, peers or {}, prompts, args.reps)
    for peer in (peers or {}).values():  # the memory figures below are this process's alone
        peer.close()

    times = sync_times(worker, args.syncs)
    bandwidth = d2d_bandwidth("cuda" if cuda else "cpu", (1 << 30) if cuda else (1 << 24))
    ablation = {}
    if cuda and worker.sync._direct is not None:
        with worker.sync.rollout_phase(args.syncs + 1):  # the engine's weights must be mapped to be written
            # with param_offload the actor's params leave the GPU once the sync is done: bring them back
            # for the ablation and offload them again, so release() finds the state push() left
            offloaded = worker.sync.options.param_offload
            if offloaded:
                worker.actor.onload(params=True, grads=False, optimizer=False)
            ablation = copy_ablation(worker.sync._direct)
            if offloaded:
                worker.actor.offload(params=True, grads=False, optimizer=False)

    out = worker.generate_sequences(prompts)  # the unchanged model's samples, for the gap table and the update
    rollout_peak = int(out.meta_info["metrics"]["memory/rollout_used_bytes"])
    out.meta_info["temperature"] = 1.0
    table = gap_table(worker, out, model_dir, cuda)
    follow = follow_check(worker, prompts)

    # one actor update on the generated batch: the training phase's peak
    lp = worker.compute_log_prob(out)
    batch = out.union(DataProto.from_dict({"old_log_probs": lp.batch["old_log_probs"],
                                           "advantages": torch.randn_like(lp.batch["old_log_probs"])}))
    # torch's counters still include vLLM's slept (unmapped) pool, so the training peak is measured as the
    # memory actually resident when the update starts plus the update's own rise above that.
    resident = device_memory_used()
    base = torch.cuda.memory_allocated() if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    worker.update_actor(batch)
    train_peak = resident + (torch.cuda.max_memory_allocated() - base if cuda else 0)
    steady = times["steady"]
    return {
        "overrides": overrides, "model_dir": model_dir, "memory": mem, "sleep_freed_fraction": freed,
        "rollout_memory": {k: v for k, v in out.meta_info["metrics"].items() if k.startswith("memory/rollout_")},
        "startup": info.get("startup", {}), "speed": speed, "gap_table": table, **follow,
        "gap": {"rollout_vs_actor/logprob_abs_diff_mean": table["megatron_sdpa_vs_vllm"]["mean"],
                "rollout_vs_actor/logprob_abs_diff_max": table["megatron_sdpa_vs_vllm"]["max"]},
        "sync_seconds": statistics.median(m["timing_s/reshard_stream"] for m in steady),
        "sync_total_seconds": statistics.median(m["timing_s/reshard"] for m in steady),
        "sync_streamed_seconds": times["streamed"]["timing_s/reshard_stream"],
        "direct_bytes_fraction": steady[-1]["reshard/direct_bytes"] / steady[-1]["reshard/bytes"],
        # the share of syncs that ran the copy as a CUDA graph: with param offload (preset 0.5b_1gpu) a sync whose
        # storages sit at addresses not seen before copies eagerly (hybridrl/hybrid/direct.py)
        "direct_graph": statistics.fmean(m.get("reshard/direct_graph", 0.0) for m in steady),
        "direct_captures": sum(m.get("reshard/direct_captured", 0.0) for m in steady),
        "sync_check_seconds": statistics.median(m["timing_s/sync_check"] for m in steady),
        "sync_bytes": steady[0]["reshard/bytes"], "d2d_bytes_per_s": bandwidth,
        "direct_copy_seconds": ablation, "gen_tokens": float(out.batch["response_mask"].sum()),
        "train_peak_allocated_bytes": train_peak, "rollout_peak_used_bytes": rollout_peak,
        "gpu_total_bytes": torch.cuda.mem_get_info()[1] if cuda else 0,
        "engine_info": engine_info(worker) if cuda else {},
    }


def engine_info(worker) -> dict:
    """What the hybrid engine was built with, beside the peers' own report (KV blocks, graphs, threads)."""
    import torch

    cfg = worker.engine.llm.llm_engine.vllm_config
    return {"torch_threads": torch.get_num_threads(), "num_gpu_blocks": cfg.cache_config.num_gpu_blocks,
            "capture_sizes": cfg.compilation_config.cudagraph_capture_sizes,
            "cudagraph_mode": str(cfg.compilation_config.cudagraph_mode),
            "async_scheduling": cfg.scheduler_config.async_scheduling}


def config_overrides(args: argparse.Namespace, model_dir: str) -> list[str]:
    n, R = args.prompts, args.max_tokens
    return [
        "preset=0.5b_1gpu", f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_batch_size={n}", f"actor_rollout_ref.actor.ppo_mini_batch_size={n // 2}",
        f"data.max_prompt_length={args.prompt_len}", f"data.max_response_length={R}",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.ignore_eos=true",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_util}",
        f"actor_rollout_ref.rollout.enforce_eager={str(args.eager).lower()}",
        "actor_rollout_ref.rollout.temperature=1.0", "trainer.device=cuda",
        *getattr(args, "override", []),  # e.g. the GPU test's rollout.free_cache_engine=false
    ]


def copy_ablation(direct, repeats: int = 20) -> dict[str, float]:
    """Median seconds of the direct copy alone: eager, and as a CUDA graph with small dense pairs batched
    into one _foreach_copy_ up to 0 bytes (every pair its own copy), 4 MiB (the default) and any size."""
    import torch

    import hybridrl.hybrid.direct as d

    default, out = d.FOREACH_MAX_BYTES, {}
    for name, graph, limit in (("eager", False, default), ("graph_foreach_0", True, 0),
                               ("graph_foreach_4mib", True, 4 << 20), ("graph_foreach_all", True, 1 << 62)):
        d.FOREACH_MAX_BYTES = limit
        direct.reset(graph)
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            direct.run()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    d.FOREACH_MAX_BYTES = default
    direct.reset(True)
    return out


# ------------------------------------------------------------------------------------------ report
def plan_json(overrides: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "hybridrl", "plan", *overrides, "--json"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        return {"error": out.stderr[-2000:] or out.stdout[-2000:]}


def write(path: str, command: str, metrics: dict, extra: dict | None = None) -> None:
    import torch

    record = {"command": command, "device": torch.cuda.get_device_name(),
              "date": datetime.date.today().isoformat(), "metrics": metrics, **(extra or {})}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    print(f"wrote {path}: {json.dumps(metrics)}", flush=True)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def report(args: argparse.Namespace, command: str, h: dict, peers: dict) -> None:
    os.makedirs(args.out_dir, exist_ok=True)
    floor = h["sync_bytes"] / h["d2d_bytes_per_s"]
    t = h["gap_table"]
    write(os.path.join(args.out_dir, "reshard_bench.json"), command, {
        "logprob_abs_diff_mean": t["megatron_sdpa_vs_vllm"]["mean"], "logprob_abs_diff_max": t["megatron_sdpa_vs_vllm"]["max"],
        "gap_over_bf16_floor": t["megatron_sdpa_vs_vllm"]["mean"] / t["hf_bf16_vs_vllm"]["mean"],
        **{f"{k}_abs_diff_mean": v["mean"] for k, v in t.items()},
        "follow_logprob_abs_diff_mean": h["follow_gap"], "stale_logprob_abs_diff_mean": h["stale_gap"],
        "fresh_mismatches": len(h["fresh_mismatches"]), "sleep_freed_fraction": h["sleep_freed_fraction"],
        "sync_seconds": h["sync_seconds"], "sync_total_seconds": h["sync_total_seconds"],
        "sync_floor_seconds": floor, "sync_time_over_floor": h["sync_seconds"] / floor,
        "sync_streamed_seconds": h["sync_streamed_seconds"], "sync_streamed_over_floor": h["sync_streamed_seconds"] / floor,
        "direct_bytes_fraction": h["direct_bytes_fraction"], "direct_graph": h["direct_graph"],
        "sync_check_seconds": h["sync_check_seconds"],
        **{f"direct_copy_{k}_seconds": v for k, v in h["direct_copy_seconds"].items()},
        "sync_bytes": h["sync_bytes"], "d2d_bytes_per_s": h["d2d_bytes_per_s"],
    }, {"memory": h["memory"], "startup": h["startup"]})
    tps, ratios = h["speed"]["tokens_per_s"], h["speed"]["ratios"]
    metrics = {"rollout_tokens_per_s": statistics.median(tps["hybrid"]),
               "prompts": args.prompts, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
               "eager": args.eager, "reps": args.reps}
    for name in peers:
        key = "standalone" if name == "plain" else f"standalone_{name}_mode"
        metrics[f"{key}_tokens_per_s"] = statistics.median(tps[name])
        metrics[f"rollout_tokens_per_s_vs_{key}"] = statistics.median(ratios[name])
        metrics[f"rollout_tokens_per_s_vs_{key}_min"] = min(ratios[name])
        metrics[f"rollout_tokens_per_s_vs_{key}_max"] = max(ratios[name])
    write(os.path.join(args.out_dir, "rollout_bench.json"), command, metrics, {
        "per_rep": {"tokens_per_s": tps, "ratios": ratios}, "hybrid_engine": h["engine_info"],
        "peers": {name: p.info for name, p in peers.items()}})
    plan = plan_json(h["overrides"] + [f"--gpu-mem-gb={h['gpu_total_bytes'] / 2**30:.1f}", "--overhead-gb=0"])
    phases = plan.get("phases", {})
    from hybridrl.plan.report import update_peak_total

    metrics = {"train_peak_allocated_bytes": h["train_peak_allocated_bytes"],
               "rollout_peak_used_bytes": h["rollout_peak_used_bytes"]}
    if phases:
        train = update_peak_total(phases)  # the measured train peak spans the forward/backward and the step
        metrics["plan_train_actor_bytes"] = train
        metrics["plan_rollout_bytes"] = phases["rollout"]["total"]
        metrics["train_measured_over_plan"] = h["train_peak_allocated_bytes"] / train
        metrics["rollout_measured_over_plan"] = h["rollout_peak_used_bytes"] / phases["rollout"]["total"]
    write(os.path.join(args.out_dir, "plan_vs_measured_0.5b_1gpu.json"), command, metrics, {"plan": plan})


def main() -> None:
    args = parse()
    command = "PYTHONPATH=$PWD:/tmp/site python " + " ".join(sys.argv)
    work = tempfile.mkdtemp()
    model_dir = args.model_dir or make_model(os.path.join(work, "qwen2_0.5b_random"), args.cpu_dry_run)
    if args.cpu_dry_run:
        args.peers = ""
        h = hybrid_run(args, model_dir)
        print(json.dumps({k: v for k, v in h.items() if k != "overrides"}, indent=1, default=str))
        return
    peers = start_peers(args, model_dir, args.out_dir)
    try:
        h = hybrid_run(args, model_dir, peers)
    finally:
        for peer in peers.values():
            peer.close()
    report(args, command, h, peers)


if __name__ == "__main__":
    main()
