"""The 3D-HybridEngine on one GPU: a Megatron actor and a colocated vLLM engine, Qwen2.5-0.5B shape, bf16.

Runs the real role worker (hybridrl.workers.ActorRolloutRefWorker) in this process and measures
  logprob_abs_diff_mean/max   vLLM's token log-probs vs the actor's recomputation on the same tokens
  sleep_freed_fraction        (used with the engine awake - used asleep) / (awake - before the engine started)
  sync_seconds                median wall time of moving the weights actor -> engine after the first sync
                              (the direct copy where proven, else export + load_weights); the first sync
                              (always export + load_weights, it proves the direct copy): sync_streamed_seconds
  sync_floor_seconds          bytes streamed / measured device-to-device copy bandwidth (bytes / s, one copy)
  sync_time_over_floor        their ratio (goal <= 2.0)
  rollout_tokens_per_s        generation inside the hybrid engine, and the same prompts and sampling on a
                              standalone vllm.LLM in a separate process: rollout_tokens_per_s_vs_standalone
  peak memory per phase       against `hybridrl plan --json` for the same config (issue 7)
and writes reshard_bench.json, rollout_bench.json and plan_vs_measured.json (results format of DEVELOPERS.md).

    PYTHONPATH=$PWD:/tmp/site python benchmarks/hybrid_bench.py --out-dir benchmarks/results
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

SHAPE = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
             num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
             tie_word_embeddings=True)
REPEATS = 2  # timed generations per side; the faster one counts (the first after start-up carries noise)
TINY = dict(SHAPE, vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--model-dir", default=None, help="HF folder to use instead of a random Qwen2.5-0.5B shape")
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--syncs", type=int, default=8)
    p.add_argument("--gpu-util", type=float, default=0.5)
    p.add_argument("--eager", action="store_true", help="vLLM enforce_eager (no CUDA graphs): faster start")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="exercise the script on CPU (tiny model, torch engine, no standalone peer); writes nothing")
    p.add_argument("--standalone-json", default=None, help=argparse.SUPPRESS)  # internal: the standalone run
    p.add_argument("--standalone-sleep-mode", action="store_true", help=argparse.SUPPRESS)
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


def prompt_ids(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab - 100, (n, length), generator=g).tolist()


def engine_kwargs(args: argparse.Namespace) -> dict:
    """What both the hybrid and the standalone engine are built with (equal, so the comparison is fair)."""
    return dict(gpu_memory_utilization=args.gpu_util, enforce_eager=args.eager, max_num_seqs=1024,
                max_num_batched_tokens=8192, seed=0, max_model_len=args.prompt_len + args.max_tokens)


# ------------------------------------------------------------------------------------------ standalone
def standalone(args: argparse.Namespace) -> None:
    """A plain vllm.LLM loading the weights itself: the peer the hybrid engine's speed is compared with."""
    from vllm import LLM, SamplingParams

    kw = engine_kwargs(args)
    llm = LLM(model=args.model_dir, skip_tokenizer_init=True, dtype="bfloat16", load_format="auto",
              logprobs_mode="processed_logprobs", enable_chunked_prefill=True, enable_prefix_caching=True,
              disable_log_stats=True, enable_sleep_mode=args.standalone_sleep_mode, **kw)
    prompts = [{"prompt_token_ids": p} for p in prompt_ids(args.prompts, args.prompt_len, SHAPE["vocab_size"])]
    # per-prompt seeds, as the hybrid engine samples (seeded requests take vLLM's slower sampling path)
    params = [SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=args.max_tokens, ignore_eos=True,
                             logprobs=0, detokenize=False, seed=1000 + i) for i in range(len(prompts))]
    llm.generate(prompts[:8], params[:8], use_tqdm=False)  # warm-up
    seconds = float("inf")
    for _ in range(REPEATS):  # the best of REPEATS, as on the hybrid side
        llm.reset_prefix_cache()
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = min(seconds, time.perf_counter() - start)
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    with open(args.standalone_json, "w") as f:
        json.dump({"tokens": tokens, "seconds": seconds}, f)


def run_standalone(args: argparse.Namespace, model_dir: str, sleep_mode: bool = False) -> dict:
    out = os.path.join(tempfile.mkdtemp(), "standalone.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--model-dir", model_dir, "--standalone-json", out,
           "--prompts", str(args.prompts), "--prompt-len", str(args.prompt_len), "--max-tokens", str(args.max_tokens),
           "--gpu-util", str(args.gpu_util)] + (["--eager"] if args.eager else []) + \
        (["--standalone-sleep-mode"] if sleep_mode else [])
    subprocess.run(cmd, check=True, timeout=600)
    with open(out) as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------ hybrid
def start_worker(overrides: list[str], model_dir: str, cpu: bool = False) -> tuple:
    """The real role worker (actor + colocated rollout engine) as rank 0 of 1, in this process:
    (worker, the overrides it was built with, init_model's report). cpu: the torch engine on gloo."""
    from hybridrl.config import load_config, validate
    from hybridrl.workers import ActorRolloutRefWorker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if cpu:
        overrides = overrides + ["trainer.device=cpu", "actor_rollout_ref.rollout.name=torch"]
    run = validate(load_config(overrides))
    worker = ActorRolloutRefWorker(run, model_dir, total_training_steps=10)
    return worker, overrides, worker.init_model()


def hybrid_run(args: argparse.Namespace, model_dir: str) -> dict:
    import torch

    from hybridrl.hybrid.checks import logprob_gap
    from hybridrl.protocol import DataProto
    from hybridrl.utils.device import device_memory_used

    worker, overrides, info = start_worker(config_overrides(args, model_dir), model_dir, args.cpu_dry_run)
    cuda = not args.cpu_dry_run
    mem = {k: v for k, v in info.items() if k.endswith("_bytes")}
    engine_bytes = mem["engine_awake_bytes"] - mem["before_engine_bytes"]
    freed = (mem["engine_awake_bytes"] - mem["engine_asleep_bytes"]) / engine_bytes if engine_bytes else float("nan")

    # syncs without generation: the reshard time alone
    syncs = []
    for step in range(args.syncs):
        with worker.sync.rollout_phase(step) as m:
            pass
        syncs.append(m)
    bandwidth = d2d_bandwidth("cuda" if cuda else "cpu", (1 << 30) if cuda else (1 << 24))
    fresh = weights_follow_the_actor(worker)
    ablation = {}
    if cuda and worker.sync._direct is not None:
        with worker.sync.rollout_phase(args.syncs):  # the engine's weights must be mapped to be written
            # with param_offload the actor's params leave the GPU once the sync is done: bring them back
            # for the ablation and offload them again, so release() finds the state push() left
            offloaded = worker.sync.options.param_offload
            if offloaded:
                worker.actor.onload(params=True, grads=False, optimizer=False)
            ablation = copy_ablation(worker.sync._direct)
            if offloaded:
                worker.actor.offload(params=True, grads=False, optimizer=False)

    # generation through the worker (sync + generate + sleep), after a warm-up
    prompts = make_prompts(args.prompts, args.prompt_len, (TINY if args.cpu_dry_run else SHAPE)["vocab_size"])
    worker.generate_sequences(prompts[:8])
    runs = [worker.generate_sequences(prompts) for _ in range(REPEATS)]
    out = min(runs, key=lambda o: o.meta_info["metrics"]["timing_s/generate"])
    gen = out.meta_info["metrics"]
    rollout_peak = device_memory_used_peak(gen)
    out.meta_info["temperature"] = 1.0
    lp = worker.compute_log_prob(out)
    gap = logprob_gap(out.batch["rollout_log_probs"], lp.batch["old_log_probs"], out.batch["response_mask"])

    # one actor update on the generated batch: the training phase's peak
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
    # the first sync streams through load_weights and proves the direct copy; the later ones copy directly
    steady = syncs[1:] or syncs
    stream = [m["timing_s/reshard_stream"] for m in steady]
    total = [m["timing_s/reshard"] for m in steady]
    model_bytes = syncs[0]["reshard/bytes"]
    return {
        "overrides": overrides, "model_dir": model_dir, "memory": mem, "sleep_freed_fraction": freed, "gap": gap,
        "sync_seconds": statistics.median(stream), "sync_total_seconds": statistics.median(total),
        "sync_streamed_seconds": syncs[0]["timing_s/reshard_stream"],
        "direct_bytes_fraction": steady[-1]["reshard/direct_bytes"] / steady[-1]["reshard/bytes"],
        "direct_graph": steady[-1].get("reshard/direct_graph", 0.0),
        "sync_check_seconds": statistics.median(m["timing_s/sync_check"] for m in steady),
        "sync_bytes": model_bytes, "d2d_bytes_per_s": bandwidth, "gen_seconds": gen["timing_s/generate"],
        "direct_copy_seconds": ablation, "fresh_mismatches": fresh,
        "gen_tokens": float(out.batch["response_mask"].sum()), "train_peak_allocated_bytes": train_peak,
        "rollout_peak_used_bytes": rollout_peak, "gpu_total_bytes": torch.cuda.mem_get_info()[1] if cuda else 0,
        "device_memory_used_end": device_memory_used(),
    }


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
    ]


def make_prompts(n: int, length: int, vocab: int) -> "DataProto":  # noqa: F821
    """n random prompts of `length` ids below `vocab`, one sample each."""
    import numpy as np
    import torch

    from hybridrl.protocol import DataProto

    ids = torch.tensor(prompt_ids(n, length, vocab))
    mask = torch.ones_like(ids)
    pos = torch.arange(length).expand_as(ids).clone()
    # n=1 sample per prompt so the token count equals the standalone run's
    meta = {"step": 1, "validate": False}
    proto = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                                {"uid": np.array([str(i) for i in range(len(ids))], dtype=object)}, meta)
    return proto


def device_memory_used_peak(metrics: dict) -> int:
    return int(metrics["memory/rollout_used_bytes"])


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
                    p.add_(0.01)
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


def copy_ablation(direct, repeats: int = 20) -> dict[str, float]:
    """Median seconds of the direct copy alone: eager, and as a CUDA graph with small dense pairs batched
    into one _foreach_copy_ up to 0 bytes (every pair its own copy), 4 MiB (the default) and any size."""
    import torch

    import hybridrl.hybrid.direct as d

    default, out = d.FOREACH_MAX_BYTES, {}
    for name, graph, limit in (("eager", False, default), ("graph_foreach_0", True, 0),
                               ("graph_foreach_4mib", True, 4 << 20), ("graph_foreach_all", True, 1 << 62)):
        d.FOREACH_MAX_BYTES = limit
        direct._use_graph, direct._graph_key, direct._captures = graph, None, 0
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            direct.run()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    d.FOREACH_MAX_BYTES = default
    direct._use_graph, direct._graph_key, direct._captures = True, None, 0
    return out


def d2d_bandwidth(device: str = "cuda", nbytes: int = 1 << 30) -> float:
    """Bytes per second of one device-to-device copy (each byte read once and written once)."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    sync()
    start = time.perf_counter()
    reps = 10
    for _ in range(reps):
        y.copy_(x)
    sync()
    return nbytes * reps / (time.perf_counter() - start)


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


def main() -> None:
    args = parse()
    if args.standalone_json:
        standalone(args)
        return
    command = "PYTHONPATH=$PWD:/tmp/site python " + " ".join(sys.argv)
    model_dir = args.model_dir or make_model(os.path.join(tempfile.mkdtemp(), "qwen2_0.5b_random"), args.cpu_dry_run)
    if args.cpu_dry_run:
        h = hybrid_run(args, model_dir)
        print(json.dumps({k: v for k, v in h.items() if k != "overrides"}, indent=1, default=str))
        return
    start = time.perf_counter()
    peer = run_standalone(args, model_dir)
    print(f"standalone vLLM: {peer['tokens']} tokens in {peer['seconds']:.2f}s ({time.perf_counter() - start:.0f}s wall)",
          flush=True)
    peer_sleep = run_standalone(args, model_dir, sleep_mode=True)  # isolates the sleep-mode allocator's share
    h = hybrid_run(args, model_dir)
    os.makedirs(args.out_dir, exist_ok=True)
    floor = h["sync_bytes"] / h["d2d_bytes_per_s"]
    write(os.path.join(args.out_dir, "reshard_bench.json"), command, {
        "logprob_abs_diff_mean": h["gap"]["rollout_vs_actor/logprob_abs_diff_mean"],
        "logprob_abs_diff_max": h["gap"]["rollout_vs_actor/logprob_abs_diff_max"],
        "sleep_freed_fraction": h["sleep_freed_fraction"],
        "sync_seconds": h["sync_seconds"], "sync_total_seconds": h["sync_total_seconds"],
        "sync_floor_seconds": floor, "sync_time_over_floor": h["sync_seconds"] / floor,
        "sync_streamed_seconds": h["sync_streamed_seconds"],
        "sync_streamed_over_floor": h["sync_streamed_seconds"] / floor,
        "direct_bytes_fraction": h["direct_bytes_fraction"], "direct_graph": h["direct_graph"],
        "sync_check_seconds": h["sync_check_seconds"], "fresh_mismatches": len(h["fresh_mismatches"]),
        **{f"direct_copy_{k}_seconds": v for k, v in h["direct_copy_seconds"].items()},
        "sync_bytes": h["sync_bytes"], "d2d_bytes_per_s": h["d2d_bytes_per_s"],
    }, {"memory": h["memory"]})
    hybrid_tps = h["gen_tokens"] / h["gen_seconds"]
    peer_tps = peer["tokens"] / peer["seconds"]
    write(os.path.join(args.out_dir, "rollout_bench.json"), command, {
        "rollout_tokens_per_s": hybrid_tps, "standalone_tokens_per_s": peer_tps,
        "rollout_tokens_per_s_vs_standalone": hybrid_tps / peer_tps,
        "standalone_sleep_mode_tokens_per_s": peer_sleep["tokens"] / peer_sleep["seconds"],
        "rollout_tokens_per_s_vs_standalone_sleep_mode": hybrid_tps / (peer_sleep["tokens"] / peer_sleep["seconds"]),
        "prompts": args.prompts, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "eager": args.eager,
    })
    plan = plan_json(h["overrides"] + [f"--gpu-mem-gb={h['gpu_total_bytes'] / 2**30:.1f}", "--overhead-gb=0"])
    phases = plan.get("phases", {})
    metrics = {"train_peak_allocated_bytes": h["train_peak_allocated_bytes"],
               "rollout_peak_used_bytes": h["rollout_peak_used_bytes"]}
    if phases:
        metrics["plan_train_actor_bytes"] = phases["train_actor"]["total"]
        metrics["plan_rollout_bytes"] = phases["rollout"]["total"]
        metrics["train_measured_over_plan"] = h["train_peak_allocated_bytes"] / phases["train_actor"]["total"]
        metrics["rollout_measured_over_plan"] = h["rollout_peak_used_bytes"] / phases["rollout"]["total"]
    write(os.path.join(args.out_dir, "plan_vs_measured_0.5b_1gpu.json"), command, metrics, {"plan": plan})


if __name__ == "__main__":
    main()
