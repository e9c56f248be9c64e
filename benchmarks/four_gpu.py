"""Issue 33's multi-GPU GRPO runs as one table of named runs, one runner and one report
(benchmarks/results/four_gpu.json + .md).

    python benchmarks/four_gpu.py list
    python benchmarks/four_gpu.py run NAME [NAME ...] --out DIR [--steps 6] [--budget 570]
    python benchmarks/four_gpu.py report --in-dir DIR [DIR ...] --out benchmarks/results/four_gpu.json

A run is the real trainer (Ray controller, Megatron actor with transformer-engine layers where TE imports, packed
micro-batches cut by tokens, vLLM with CUDA graphs) on the first `gpus` GPUs of the machine, written to DIR/NAME/:
run.json (what ran and on which GPUs), plan.json (`hybridrl plan --json` for the same overrides: a run the plan
refuses is skipped, its problems printed) and the trainer's logs/metrics.jsonl; scale_report.py reads that layout.
The random models are built on first use under --models (multi_gpu_bench.py model; the 7B one config-only: its
runs start from random weights). `allgather_N` is the NCCL probe on N GPUs (bus and device-copy bandwidth), the
floor of a sync across GPUs. Every run of one shape is the same job (JOBS); only the layout and the memory knobs
differ. `--cpu` runs the rows on gloo with the tiny model and the torch engine (the dry run; no numbers kept).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
import scale_report  # noqa: E402  (benchmarks/: this script's folder)
from runner import run_gpus  # noqa: E402

ARA = "actor_rollout_ref"
TP, PP = f"{ARA}.actor.megatron.tensor_model_parallel_size", f"{ARA}.actor.megatron.pipeline_model_parallel_size"
RTP = f"{ARA}.rollout.tensor_model_parallel_size"
OPT_OFFLOAD = f"{ARA}.actor.megatron.optimizer_offload=true"
RECOMPUTE = f"{ARA}.model.enable_gradient_checkpointing=true"


@dataclass(frozen=True)
class Job:
    """The GRPO job of one shape: the same for every layout (prompts x n samples of `response` tokens)."""

    prompts: int
    n: int
    response: int
    overrides: tuple[str, ...] = ()


JOBS = {
    # the 1.5B check: 32 x 8 x 256 tokens, KL loss against the reference
    "1.5b": Job(32, 8, 256, (f"{ARA}.actor.use_kl_loss=true",)),
    # megatron_scale's 7B job (16 x 8 x 256): random init, no reference
    "7b": Job(16, 8, 256, (f"{ARA}.actor.use_kl_loss=false", f"{ARA}.actor.load_weight=false")),
    # a model one GPU cannot hold (14.8B x 18 bytes of training state): the 7B job, random init
    "14b": Job(16, 8, 256, (f"{ARA}.actor.use_kl_loss=false", f"{ARA}.actor.load_weight=false")),
    "tiny": Job(4, 4, 16, (f"{ARA}.actor.use_kl_loss=true",)),
    # the same shapes at the batch sizes of verl's GRPO examples (hundreds of prompts a step): 4x the sequences, so
    # a GPU of four still decodes as many sequences at once as one GPU did in the small jobs (a decode step's fixed
    # cost, ~2 ms, is paid per GPU and does not shrink with fewer sequences: four_gpu.md 2026-11-27 4 x H200)
    "1.5b_big": Job(128, 8, 256, (f"{ARA}.actor.use_kl_loss=true",)),
    "7b_big": Job(64, 8, 256, (f"{ARA}.actor.use_kl_loss=false", f"{ARA}.actor.load_weight=false")),
}


@dataclass(frozen=True)
class Run:
    shape: str
    gpus: int
    layout: tuple[str, ...] = ()  # training and rollout layout (rollout tp defaults to 1: one replica a GPU)
    knobs: tuple[str, ...] = ()  # memory knobs: token budget, recompute, offloads
    what: str = ""
    knobs_80gb: tuple[str, ...] = ()  # added on GPUs under 100 GiB (H100): what the plan needs there
    search: bool = False  # the layout `hybridrl plan --search` ranks first on this machine (run_one asks it)
    job: str = ""  # the JOBS entry when it is not the shape's own

    @property
    def job_name(self) -> str:
        return self.job or self.shape

    def overrides(self, gib: float = 140.0) -> list[str]:
        if self.search:
            return list(self.knobs)
        layout = list(self.layout)
        if not any(o.startswith(RTP + "=") for o in layout):
            layout.append(f"{RTP}=1")
        return layout + list(self.knobs) + (list(self.knobs_80gb) if gib < 100 else [])



TOKENS_1P5B = f"{ARA}.actor.ppo_max_token_len_per_gpu=8192"
# one GPU holds 7.6B x 18 bytes of state only for the optimizer step: recompute, 4096-token micro-batches and the
# optimizer state on the host between steps (megatron_scale's 7b row)
SEVEN_B_ONE_GPU = (f"{ARA}.actor.ppo_max_token_len_per_gpu=4096", RECOMPUTE, OPT_OFFLOAD)
# two or more H200s: half the state a GPU under tp2, so no recompute and the optimizer state stays on the GPU
SEVEN_B_SHARDED = (f"{ARA}.actor.ppo_max_token_len_per_gpu=8192",)

RUNS: dict[str, Run] = {
    "1p5b_1gpu": Run("1.5b", 1, (), (TOKENS_1P5B,), "1.5B on one GPU: the base of dp scaling"),
    "1p5b_dp2": Run("1.5b", 2, (), (TOKENS_1P5B,), "1.5B dp2, one vLLM replica a GPU (tp_g1 x dp_g2)"),
    "1p5b_dp4": Run("1.5b", 4, (), (TOKENS_1P5B,), "1.5B dp4, vLLM tp_g1 x dp_g4"),
    "7b_1gpu": Run("7b", 1, (), SEVEN_B_ONE_GPU, "7B on one GPU with its offloads and recompute"),
    "7b_tp2": Run("7b", 2, (f"{TP}=2", f"{RTP}=2"), SEVEN_B_SHARDED, "7B tp2 -> vLLM tp_g2 (shard to shard)",
                  (OPT_OFFLOAD,)),
    "7b_tp2_rdp2": Run("7b", 2, (f"{TP}=2",), SEVEN_B_SHARDED, "7B tp2 -> vLLM tp_g1 x dp_g2 (each GPU gathers all)",
                       (OPT_OFFLOAD,)),
    "7b_pp2_rtp2": Run("7b", 2, (f"{PP}=2", f"{RTP}=2"), SEVEN_B_SHARDED, "7B pp2 -> vLLM tp_g2",
                       (OPT_OFFLOAD, RECOMPUTE)),
    "7b_tp2dp2": Run("7b", 4, (f"{TP}=2", f"{RTP}=2"), SEVEN_B_SHARDED, "7B tp2 x dp2 -> vLLM tp_g2 x dp_g2",
                     (OPT_OFFLOAD,)),
    "7b_tp4": Run("7b", 4, (f"{TP}=4", f"{RTP}=4"), SEVEN_B_SHARDED, "7B tp4 -> vLLM tp_g4"),
    "1p5b_big_1gpu": Run("1.5b", 1, (), (TOKENS_1P5B,), "1.5B, 128 prompts x 8 on one GPU", job="1.5b_big"),
    "1p5b_big_dp4": Run("1.5b", 4, (), (TOKENS_1P5B,), "1.5B, 128 prompts x 8, dp4 -> tp_g1 x dp_g4", job="1.5b_big"),
    "7b_big_1gpu": Run("7b", 1, (), SEVEN_B_ONE_GPU, "7B, 64 prompts x 8 on one GPU (offloads, recompute)", job="7b_big"),
    "7b_big_tp2dp2": Run("7b", 4, (f"{TP}=2", f"{RTP}=2"), SEVEN_B_SHARDED, "7B, 64 prompts x 8, tp2 x dp2 -> tp_g2 x dp_g2",
                         (OPT_OFFLOAD,), job="7b_big"),
    "7b_big_rdp4": Run("7b", 4, (f"{TP}=2",), SEVEN_B_SHARDED, "7B, 64 prompts x 8, tp2 x dp2 -> tp_g1 x dp_g4",
                       (OPT_OFFLOAD,), job="7b_big"),
    "7b_pp2dp2_rtp2": Run("7b", 4, (f"{PP}=2", f"{RTP}=2"), SEVEN_B_SHARDED, "7B pp2 x dp2 -> vLLM tp_g2 x dp_g2",
                          (OPT_OFFLOAD, RECOMPUTE)),
    "7b_pp2dp2_rdp4": Run("7b", 4, (f"{PP}=2",), SEVEN_B_SHARDED, "7B pp2 x dp2 -> vLLM tp_g1 x dp_g4",
                          (OPT_OFFLOAD, RECOMPUTE)),
    # 14B (266 GB of training state): in the layout `hybridrl plan --search` ranks first on the machine at hand
    # (2026-11-27: 2 x H200 tp2 with the optimizer state on the host, rollout tp_g1 x dp_g2; 4 x H200 tp2 x dp2 ->
    # tp_g2 x dp_g2; 4 x H100 tp4 with the optimizer state on the host)
    "14b_2gpu": Run("14b", 2, (), SEVEN_B_SHARDED, "14B on 2 GPUs, the plan's pick", search=True),
    "14b_4gpu": Run("14b", 4, (), SEVEN_B_SHARDED, "14B on 4 GPUs, the plan's pick", search=True),
    # the dry run's rows (CPU, gloo, the torch engine)
    "tiny_1": Run("tiny", 1, (), (), "dry run, one process"),
    "tiny_dp2": Run("tiny", 2, (), (), "dry run, dp2"),
    "tiny_tp2": Run("tiny", 2, (f"{TP}=2", f"{RTP}=2"), (), "dry run, tp2 -> tp_g2"),
    "tiny_search": Run("tiny", 2, (), (), "dry run, the plan's pick", search=True),
}


# ------------------------------------------------------------------------------------------------ running
def layout_of(overrides: list[str], gpus: int) -> dict[str, int]:
    """tp/pp/dp and tp_g/dp_g as the trainer will read them from `overrides` (the last value of a key wins)."""
    sizes = {k: int(v) for k, v in (o.split("=", 1) for o in overrides if o.startswith((TP, PP, RTP)))}
    tp, pp, rtp = sizes.get(TP, 1), sizes.get(PP, 1), sizes.get(RTP, 1)
    return {"tp": tp, "pp": pp, "dp": gpus // (tp * pp), "tp_g": rtp, "dp_g": gpus // rtp}


def environment(gpus: int, cpu: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0", HF_HUB_OFFLINE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false")
    env.setdefault("HYBRIDRL_MODEL_CACHE", "/tmp/mcache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    if not cpu:  # the first `gpus` GPUs of the machine (of those the caller left visible)
        env["CUDA_VISIBLE_DEVICES"] = run_gpus(gpus, "four_gpu: the run")
    return env


def device_info(cpu: bool) -> tuple[str, float]:
    """(device name, GiB of memory per GPU) of this machine's first GPU."""
    if cpu:
        return "cpu", 80.0
    import torch

    return torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory / 2**30


def model_dir(shape: str, models: str) -> str:
    folder = os.path.join(models, f"m_{shape}")
    if not os.path.exists(os.path.join(folder, "config.json")):
        cmd = [sys.executable, os.path.join(HERE, "multi_gpu_bench.py"), "model", "--dir", folder, "--shape", shape]
        if JOBS[shape].overrides and f"{ARA}.actor.load_weight=false" in JOBS[shape].overrides:
            cmd.append("--no-weights")
        print(f"[four_gpu] building the {shape} model in {folder}", flush=True)
        subprocess.run(cmd, check=True, env=environment(1, shape == "tiny"), timeout=600)
    return folder


def trainer_overrides(run: Run, model: str, folder: str, steps: int, max_time_s: float, cpu: bool,
                      gib: float = 140.0) -> list[str]:
    job = JOBS[run.job_name]
    device = ([f"{ARA}.rollout.name=torch", "trainer.device=cpu"] if cpu
              else [f"{ARA}.rollout.name=vllm", "trainer.device=cuda", f"{ARA}.rollout.gpu_memory_utilization=0.4"])
    return ["--config-name", "grpo_trainer", f"{ARA}.model.path={model}", f"data.train_files={model}/data/train.parquet",
            f"data.val_files={model}/data/test.parquet", "data.max_prompt_length=64",
            f"data.max_response_length={job.response}", f"data.train_batch_size={job.prompts}",
            f"{ARA}.actor.ppo_mini_batch_size={job.prompts}", f"{ARA}.rollout.n={job.n}", f"{ARA}.rollout.ignore_eos=true",
            f"{ARA}.model.use_remove_padding=true", f"{ARA}.actor.use_dynamic_bsz=true", *device,
            f"trainer.n_gpus_per_node={run.gpus}", f"trainer.total_training_steps={steps}",
            f"trainer.max_time_s={int(max_time_s)}", "trainer.test_freq=-1", "trainer.save_freq=-1",
            "trainer.val_before_train=false", "trainer.logger=[console,jsonl]", "trainer.progress_bar=false",
            f"trainer.default_local_dir={folder}", *job.overrides, *run.overrides(gib)]


def plan_for(overrides: list[str], gib: float, env: dict[str, str], folder: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "hybridrl", "plan", *overrides, "--json", "--gpu-mem-gb", f"{gib:.1f}"],
                          capture_output=True, text=True, env=env, timeout=300)
    with open(os.path.join(folder, "plan.err"), "w") as f:
        f.write(proc.stderr)
    try:
        plan = json.loads(proc.stdout)
    except json.JSONDecodeError:
        plan = {"ok": None, "error": f"hybridrl plan exited {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    with open(os.path.join(folder, "plan.json"), "w") as f:
        json.dump(plan, f, indent=1)
    return plan


def searched_layout(overrides: list[str], gpus: int, gib: float, env: dict[str, str], folder: str) -> Optional[list[str]]:
    """The fastest layout `hybridrl plan --search` finds for this job here (its output kept as search.json)."""
    proc = subprocess.run([sys.executable, "-m", "hybridrl", "plan", "--search", "--json", "--gpus", str(gpus),
                           "--gpu-mem-gb", f"{gib:.1f}", *overrides], capture_output=True, text=True, env=env, timeout=600)
    with open(os.path.join(folder, "search.json"), "w") as f:
        f.write(proc.stdout or proc.stderr)
    try:
        ranked = json.loads(proc.stdout)["ranked"]
    except (json.JSONDecodeError, KeyError):
        return None
    return ranked[0]["overrides"] if ranked else None


def run_one(name: str, args: argparse.Namespace, deadline: float) -> Optional[int]:
    """One named run into args.out/NAME; returns the trainer's exit code (None: skipped)."""
    if name.startswith("allgather_"):
        return allgather(int(name.split("_")[1]), args, deadline)
    run = RUNS[name]
    label = f"{name}.{args.tag}" if args.tag else name
    folder = os.path.join(args.out, label)
    if os.path.exists(folder):  # never mix two runs' metrics: a new name or a new --out
        print(f"[four_gpu] {label}: {folder} exists (an earlier run's); skipped: use another --out or --tag", flush=True)
        return None
    os.makedirs(folder)
    device, gib = device_info(args.cpu)
    model = model_dir(run.shape, args.models)
    env = environment(run.gpus, args.cpu)
    left = deadline - time.time()
    overrides = trainer_overrides(run, model, folder, args.steps, max(60, left - 90), args.cpu, gib) + args.override
    if run.search:
        pick = searched_layout(overrides, run.gpus, gib, env, folder)
        if pick is None:
            print(f"[four_gpu] {label}: `hybridrl plan --search` finds no layout that fits (search.json), skipped",
                  flush=True)
            return None
        overrides += pick
    plan = plan_for(overrides, gib, env, folder)
    info = {"name": label, "run": name, "tag": args.tag, "extra_overrides": args.override, "shape": run.job_name, "model_shape": run.shape, "gpus": run.gpus, "what": run.what,
            "layout": layout_of(overrides, run.gpus), "device": device, "gpu_memory_gib": gib,
            "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"), "overrides": overrides,
            "command": " ".join([sys.executable, "-m", "hybridrl.trainer.main_ppo", *overrides]),
            "date": datetime.date.today().isoformat()}
    with open(os.path.join(folder, "run.json"), "w") as f:
        json.dump(info, f, indent=1)
    if plan.get("ok") is False:
        print(f"[four_gpu] {name}: the plan refuses it on {gib:.0f} GiB GPUs, skipped: "
              + "; ".join(p["message"] for p in plan.get("problems", [])), flush=True)
        return None
    if left < 120:
        print(f"[four_gpu] {name}: {left:.0f} s left in the budget, skipped", flush=True)
        return None
    print(f"[four_gpu] {name}: {run.what}; {run.gpus} x {device}; log {folder}.log", flush=True)
    machine_state(os.path.join(folder, "machine_before.txt"))
    start = time.time()
    with open(folder + ".log", "w") as log:
        try:
            rc = subprocess.run([sys.executable, "-m", "hybridrl.trainer.main_ppo", *overrides], stdout=log,
                                stderr=subprocess.STDOUT, env=env, timeout=max(60, left - 15)).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    machine_state(os.path.join(folder, "machine_after.txt"))
    print(f"[four_gpu] {name}: rc={rc} in {time.time() - start:.0f} s; {one_line(folder)}", flush=True)
    return rc


# what a run's timings depend on besides the code: GPU clocks, power and throttle reasons, memory held, and the
# host's load and busiest processes (a run slower throughout than the same run earlier had nothing else to go on:
# four_gpu.md, lease 3)
MACHINE_QUERIES = (
    ["nvidia-smi", "--query-gpu=index,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,"
     "clocks_throttle_reasons.active,memory.used,utilization.gpu", "--format=csv"],
    ["uptime"],
    ["ps", "-eo", "pid,pcpu,rss,etime,args", "--sort=-pcpu"],
)


def machine_state(path: str) -> None:
    with open(path, "w") as f:
        for cmd in MACHINE_QUERIES:
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
            except (OSError, subprocess.SubprocessError) as e:
                out = f"({e})\n"
            f.write(f"$ {' '.join(cmd)}\n" + "\n".join(line[:200] for line in out.splitlines()[:16]) + "\n\n")


def allgather(gpus: int, args: argparse.Namespace, deadline: float) -> Optional[int]:
    out = os.path.join(args.out, f"allgather_{gpus}.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
           os.path.join(HERE, "multi_gpu_bench.py"), "allgather", "--out", out] + (["--cpu"] if args.cpu else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=environment(gpus, args.cpu),
                          timeout=max(30, min(180, deadline - time.time())))
    print(f"[four_gpu] allgather_{gpus}: rc={proc.returncode} " + (proc.stdout.strip().splitlines() or [""])[-1], flush=True)
    return proc.returncode


def one_line(folder: str) -> str:
    path = os.path.join(folder, "logs", "metrics.jsonl")
    if not os.path.exists(path):
        return "no metrics"
    s = scale_report.summarize(scale_report.read_steps(path), {})
    if "step_s_median" not in s:
        return s.get("error", "")
    return (f"step {s['step_s_median']:.2f} s (gen {s['gen_s'] or 0:.2f}, update {s['update_actor_s'] or 0:.2f}), "
            f"{s['tokens_per_s_per_gpu'] or 0:.0f} tok/s/GPU over {s['steps_timed']} steps")


# ------------------------------------------------------------------------------------------------ report
def steps_of(folder: str) -> list[dict[str, Any]]:
    path = os.path.join(folder, "logs", "metrics.jsonl")
    return scale_report.read_steps(path)[1:] if os.path.exists(path) else []


def spread(rows: list[dict[str, Any]], key: str) -> Optional[list[float]]:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return [min(values), max(values)] if values else None


def receive_fraction(layout: dict[str, int]) -> float:
    """The share of the model each GPU must receive from other GPUs for its rollout shard: the engine holds 1/tp_g
    of every layer, and the training layout already put 1/(pp * max(tp, tp_g)) of the model on this GPU where the
    two shards nest (consecutive ranks: a tp_g shard inside a tp shard or around it)."""
    tp, pp, tp_g = layout["tp"], layout["pp"], layout["tp_g"]
    return max(0.0, 1.0 / tp_g - 1.0 / (pp * max(tp, tp_g)))


def summarize_run(folder: str, bandwidth: dict[int, dict[str, float]]) -> dict[str, Any]:
    run = scale_report.load_run(folder)
    rows = steps_of(folder)
    extra_keys = {"gen_generate_s": "timing_s/generate", "gen_generate_slowest_s": "timing_s/generate_slowest",
                  "rollout_worker_s": "timing_s/rollout_worker", "rollout_worker_slowest_s": "timing_s/rollout_worker_slowest",
                  "sync_s": "timing_s/reshard_stream",
                  "sync_check_s": "timing_s/sync_check", "forward_backward_s": "timing_s/actor_forward_backward",
                  "optimizer_step_s": "timing_s/actor_optimizer_step", "optimizer_onload_s": "timing_s/optimizer_onload",
                  "mfu_forward_backward": "perf/mfu/actor_forward_backward",
                  "logprob_gap_mean": "rollout_vs_actor/logprob_abs_diff_mean",
                  "sync_bytes_per_gpu": "reshard/bytes", "sync_direct_bytes": "reshard/direct_bytes",
                  "sync_remote_bytes": "reshard/remote_bytes",  # received by the cross-GPU copy, beside the floor's
                  "sync_remote_rounds": "reshard/remote_rounds",
                  "engine_wake_weights_s": "timing_s/engine_wake_weights",
                  "engine_wake_kv_cache_s": "timing_s/engine_wake_kv_cache"}
    for out, key in extra_keys.items():
        run[out] = scale_report.median_of(rows, key)
    for out, key in (("step_s_spread", "timing_s/step"), ("tokens_per_s_per_gpu_spread", "perf/throughput")):
        run[out] = spread(rows, key)
    run["sync_check_max_rel_diff"] = max((r.get("sync_check/max_rel_diff", 0.0) for r in rows), default=None)
    run["sync_checked_tensors"] = scale_report.median_of(rows, "sync_check/tensors_checked")
    ag = bandwidth.get(run.get("gpus", 1))
    if ag and run.get("params") and run.get("sync_s"):
        model_bytes = 2 * run["params"]  # bf16
        received = receive_fraction(run["layout"]) * model_bytes
        local = model_bytes / run["layout"]["tp_g"]
        floor = max(received / ag["busbw_bytes_per_s"], local / ag["d2d_bytes_per_s"])
        run.update(sync_receive_bytes_per_gpu=received, sync_floor_s=floor, sync_over_floor=run["sync_s"] / floor)
    return run


def comparisons(runs: dict[str, dict[str, Any]]) -> dict[str, Optional[float]]:
    """The issue's metrics from the runs present (2-GPU rows where four GPUs were not lent)."""
    def per_gpu(name: str) -> Optional[float]:
        return (runs.get(name) or {}).get("tokens_per_s_per_gpu")

    def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
        return a / b if a and b else None

    def base(name: str, sfx: str) -> Optional[float]:
        """The one-GPU run of the same tag, else the untagged one (a tag whose override changes nothing on one
        GPU, such as a tp_g > 1 engine setting, has no one-GPU run of its own)."""
        return per_gpu(name + sfx) or per_gpu(name)

    m: dict[str, Optional[float]] = {}
    for sfx in sorted({"." + r["tag"] if r.get("tag") else "" for r in runs.values()}):  # each --tag its own set
        for prefix, job in (("1p5b", ""), ("1p5b_big", "_big")):
            for dp in (2, 4):
                if f"{prefix}_dp{dp}{sfx}" in runs:
                    m[f"dp{dp}_scaling{job}{sfx}"] = ratio(per_gpu(f"{prefix}_dp{dp}{sfx}"), base(f"{prefix}_1gpu", sfx))
        for name, r in runs.items():
            if r.get("shape") in ("7b", "7b_big") and r.get("gpus", 1) > 1 and name.endswith(sfx) and (sfx or "." not in name):
                m[f"tokens_per_s_per_gpu_{name}_vs_1gpu"] = ratio(per_gpu(name), base(f"{r['shape']}_1gpu", sfx))
    for name, r in runs.items():
        if name.split(".")[0] in ("7b_tp2", "7b_tp2dp2", "7b_big_tp2dp2") and r.get("mfu_forward_backward") is not None:
            m[f"train_mfu_{name}"] = r["mfu_forward_backward"]
    for name, r in runs.items():  # the model one GPU cannot hold: measured peak over the plan in every phase
        if r.get("shape") == "14b":
            phases = [r.get(f"{k}_measured_over_plan") for k in ("train", "rollout", "ref")]
            if any(v is not None for v in phases):
                m[f"plan_peak_over_plan_max_{name}"] = max(v for v in phases if v is not None)
    for gpus in (2, 4):
        over = [r["sync_over_floor"] for r in runs.values() if r.get("gpus") == gpus and r.get("sync_over_floor")
                and r["layout"]["tp"] * r["layout"]["pp"] > 1]
        if over:
            m[f"sync_over_floor_max_{gpus}gpu"] = max(over)
    for name, r in runs.items():
        for key in ("sync_over_floor", "logprob_gap_mean", "train_measured_over_plan", "rollout_measured_over_plan"):
            if r.get(key) is not None:
                m[f"{name}_{key}"] = r[key]
    return m


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def markdown(runs: dict[str, dict[str, Any]], metrics: dict[str, Optional[float]]) -> str:
    lines = ["| run | GPUs | actor tp/pp/dp | rollout tp_g x dp_g | step s, median (min-max) | gen (generate) | sync s "
             "(floor, x) | old lp | ref | update (fwd+bwd, opt onload) | tok/s/GPU | MFU fwd+bwd | gap | train / "
             "rollout peak vs plan |", "|" + "---|" * 14]
    for name, r in runs.items():
        lay = r.get("layout") or {}
        sp = r.get("step_s_spread") or [None, None]
        sync = f"{_f(r.get('sync_s'), '{:.4f}')} ({_f(r.get('sync_floor_s'), '{:.4f}')}, {_f(r.get('sync_over_floor'), '{:.1f}')})"
        lines.append(
            f"| {name} | {r.get('gpus')} x {r.get('device', '?')} | {lay.get('tp')}/{lay.get('pp')}/{lay.get('dp')} | "
            f"{lay.get('tp_g')} x {lay.get('dp_g')} | {_f(r.get('step_s_median'))} ({_f(sp[0])}-{_f(sp[1])}) | "
            f"{_f(r.get('gen_s'))} ({_f(r.get('gen_generate_s'))}) | {sync} | {_f(r.get('old_log_prob_s'))} | "
            f"{_f(r.get('ref_s'))} | {_f(r.get('update_actor_s'))} ({_f(r.get('forward_backward_s'))}, "
            f"{_f(r.get('optimizer_onload_s'))}) | {_f(r.get('tokens_per_s_per_gpu'), '{:.0f}')} | "
            f"{_f(r.get('mfu_forward_backward'), '{:.3f}')} | {_f(r.get('logprob_gap_mean'), '{:.4f}')} | "
            f"{_f(r.get('train_measured_over_plan'))} / {_f(r.get('rollout_measured_over_plan'))} |")
    lines += ["", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {_f(v, '{:.3f}')} |" for k, v in metrics.items() if not k.startswith(tuple(runs))]
    return "\n".join(lines)


def report(args: argparse.Namespace) -> dict[str, Any]:
    bandwidth: dict[int, dict[str, float]] = {}
    runs: dict[str, dict[str, Any]] = {}
    for in_dir in args.in_dir:
        for gpus in (2, 4, 8):
            path = os.path.join(in_dir, f"allgather_{gpus}.json")
            if os.path.exists(path):
                bandwidth[gpus] = json.load(open(path))
        for name in sorted(os.listdir(in_dir)):
            if os.path.exists(os.path.join(in_dir, name, "run.json")):
                runs[name] = summarize_run(os.path.join(in_dir, name), bandwidth)
    metrics = comparisons(runs)
    devices = sorted({f"{r.get('gpus')} x {r.get('device')}" for r in runs.values()})
    record = {"command": args.command, "device": "; ".join(devices), "date": datetime.date.today().isoformat(),
              "metrics": metrics, "bandwidth": bandwidth, "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1, default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o))
    table = markdown(runs, metrics)
    print(table)
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    r = sub.add_parser("run")
    r.add_argument("names", nargs="+", help=f"{', '.join(RUNS)}, allgather_N")
    r.add_argument("--out", required=True)
    r.add_argument("--models", default="/tmp", help="where the random models are built (m_SHAPE)")
    r.add_argument("--steps", type=int, default=6, help="GRPO steps a run; step 1 (warm-up) is not timed")
    r.add_argument("--budget", type=float, default=570, help="seconds for all the runs of this call")
    r.add_argument("--cpu", action="store_true")
    r.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a trainer override added to every run of this call (an A/B: give it a --tag)")
    r.add_argument("--tag", default="", help="runs go to NAME.TAG; the report compares runs of one tag")
    rep = sub.add_parser("report")
    rep.add_argument("--in-dir", nargs="+", required=True)
    rep.add_argument("--out", required=True)
    rep.add_argument("--command", default="python benchmarks/four_gpu.py run NAME... --out DIR")
    args = p.parse_args()
    if args.cmd == "list":
        for name, run in RUNS.items():
            print(f"{name:16s} {run.gpus} GPU  {run.shape:5s} {run.what}")
        return
    if args.cmd == "report":
        report(args)
        return
    unknown = [n for n in args.names if n not in RUNS and not n.startswith("allgather_")]
    if unknown:
        raise SystemExit(f"four_gpu: unknown run(s) {unknown}; `python benchmarks/four_gpu.py list` names them")
    os.makedirs(args.out, exist_ok=True)
    deadline = time.time() + args.budget
    for name in args.names:
        run_one(name, args, deadline)


if __name__ == "__main__":
    main()
