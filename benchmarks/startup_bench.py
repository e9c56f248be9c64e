"""Issue 39, "start-up in seconds": the trainer's own start-up table for the SmolLM2 job (a cold start, then the
same job again: the warm start) and for the 7B shape, in the issue's rows (hybridrl.utils.startup.phase_table):
Ray, workers, model build, weight load, vLLM engine, compile and graph capture, first validation, the rest, the total
to the first step, and the first step itself.

    python benchmarks/startup_bench.py smol --out OUT [--model DIR] [--cpu]   # OUT/startup_smol_cold, _warm
    python benchmarks/startup_bench.py report --in-dir OUT --out OUT/results/startup.json [--cpu]

`smol` runs the grpo_smollm2_gsm8k job for two steps (validation before training, none after) twice back to back.
The cold run starts on empty vLLM and Triton caches (VLLM_CACHE_ROOT and TRITON_CACHE_DIR point at a new folder of
this run under /tmp, removed after both runs; or at --cache, emptied first); the warm run reuses what the cold run left
there (the compile cache, vLLM's persisted KV-cache size under rollout.kv_cache_sizing=remember). The operating
system's file cache stays warm: a fresh machine's very first run is that row run as the lease's first call. The 7B
shape's run is four_gpu.py's 7b_big_1gpu with --steps 2 --tag startup (the `startup_7b` row), read by the same
report. With --cpu: the demo's tiny model, gloo, the torch engine (the dry run; its numbers are CPU numbers, never
the issue's).

startup.json's metrics: startup_cold_to_first_step_s (the cold run), startup_to_first_step_s (the warm run),
startup_7b_to_first_step_s, the goals (warm <= 30 s, cold <= 60 s) as startup_goal_met_warm / _cold, and per run
its table (`phases`, seconds) with `engine_kv_from_plan` (1: vLLM took the KV-cache size from its persisted plan).
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from bench_common import write_result  # noqa: E402

from hybridrl.utils.startup import phase_table  # noqa: E402

ARA = "actor_rollout_ref"
CACHE_PREFIX = "startup_bench_cache-"  # /tmp/startup_bench_cache-XXXX: the caches of one `smol` run
GOALS = {"warm": 30.0, "cold": 60.0}
RUNS = {"smol_cold": "startup_smol_cold", "smol_warm": "startup_smol_warm", "7b": "7b_big_1gpu.startup",
        "7b_cpu": "tiny_1.startup"}  # report name -> folder under OUT


def smol_command(folder: str, model: str, cpu: bool) -> list[str]:
    if cpu:  # the demo's tiny model and data, written into the folder
        return [sys.executable, "-m", "hybridrl.trainer.demo", "--out", folder, "--sft-steps", "2",
                "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=-1"]
    return [sys.executable, "-m", "hybridrl.trainer.main_ppo", "--config-name", "grpo_smollm2_gsm8k",
            f"{ARA}.model.path={model}", "trainer.total_training_steps=2", "trainer.test_freq=-1",
            "trainer.save_freq=-1", "trainer.val_before_train=true", f"trainer.default_local_dir={folder}",
            f"{ARA}.rollout.kv_cache_sizing=remember"]


def run_smol(args: argparse.Namespace) -> int:
    """The cold run, then the warm one. Their caches: a folder of this run (another run of this row, in another lease
    lane, has its own: a shared folder emptied here would empty that run's under it), or --cache, emptied first."""
    if args.cache:
        shutil.rmtree(args.cache, ignore_errors=True)  # the cold start's caches are empty
    cache = args.cache or tempfile.mkdtemp(prefix=CACHE_PREFIX, dir="/tmp")
    try:
        return _cold_then_warm(args, cache)
    finally:
        if not args.cache:
            shutil.rmtree(cache, ignore_errors=True)


def _cold_then_warm(args: argparse.Namespace, cache: str) -> int:
    env = dict(os.environ, VLLM_CACHE_ROOT=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"))
    status = 0
    for label in ("cold", "warm"):
        folder = os.path.join(args.out, f"startup_smol_{label}")
        if os.path.exists(folder):
            print(f"[startup] {folder} exists (an earlier run's): use another --out", flush=True)
            return 2
        os.makedirs(folder)
        cmd = smol_command(folder, args.model, args.cpu)
        with open(folder + ".run.json", "w") as f:  # beside the folder: the demo wants an empty one
            json.dump({"label": label, "command": " ".join(cmd), "cache": cache,
                       "date": datetime.date.today().isoformat()}, f, indent=1)
        began = time.time()
        with open(folder + ".log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                timeout=args.timeout).returncode
        line = next((x.strip() for x in open(folder + ".log") if x.startswith("hybridrl: start-up")), "no start-up line")
        print(f"[startup] smol {label}: rc={rc} in {time.time() - began:.0f} s; {line}", flush=True)
        status = status or rc
    return status


def metrics_rows(folder: str) -> list[dict]:
    found = sorted(glob.glob(os.path.join(folder, "**", "metrics.jsonl"), recursive=True))
    if not found:
        return []
    with open(found[0]) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_table(folder: str) -> dict | None:
    """The phase table of one run folder (None: no start-up metrics there)."""
    rows = metrics_rows(folder)
    first = next((r for r in rows if "timing_s/startup" in r), None)
    if first is None:
        return None
    step1 = next((r for r in rows if r.get("step") == 1 and "timing_s/step" in r), None)
    table = phase_table(first, first_step=step1["timing_s/step"] if step1 else None)
    engine = {k.rsplit("/", 1)[1]: v for k, v in first.items()
              if k.startswith("timing_s/startup/engine_") and not k.endswith("engine_kv_from_plan")}
    return {"phases": {k: round(v, 2) for k, v in table.items()}, "engine": {k: round(v, 2) for k, v in engine.items()},
            "engine_kv_from_plan": first.get("timing_s/startup/engine_kv_from_plan")}


def report(args: argparse.Namespace) -> int:
    runs = {}
    for d in args.in_dir:
        for name, sub in RUNS.items():
            table = run_table(os.path.join(d, sub))
            if table is not None:
                runs[name.removesuffix("_cpu")] = table
    if not runs:
        print(f"[startup] no start-up metrics under {args.in_dir}", file=sys.stderr)
        return 1
    metrics: dict[str, float] = {}
    for name, key in (("smol_cold", "startup_cold_to_first_step_s"), ("smol_warm", "startup_to_first_step_s"),
                      ("7b", "startup_7b_to_first_step_s")):
        if name in runs:
            metrics[key] = runs[name]["phases"]["to_first_step"]
    for label, key in (("warm", "startup_to_first_step_s"), ("cold", "startup_cold_to_first_step_s")):
        if key in metrics and not args.cpu:  # the goals are the GPU's: a dry run's CPU seconds say nothing of them
            metrics[f"startup_goal_met_{label}"] = float(metrics[key] <= GOALS[label])
    device = "cpu (dry run)" if args.cpu else _gpu_name()
    out = {"command": args.command, "device": device, "date": datetime.date.today().isoformat(), "metrics": metrics,
           "runs": runs}
    md = markdown(out)
    write_result(args.out, out, md)
    print(md)
    return 0


def _gpu_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except Exception:
        return "unknown"


def markdown(out: dict) -> str:
    rows = ("ray", "workers", "model_build", "weight_load", "vllm_engine", "compile_and_capture", "first_validation",
            "other", "to_first_step", "first_step")
    names = list(out["runs"])
    lines = [f"# Start-up (issue 39), {out['device']}, {out['date']}", "",
             "| phase (s) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for r in rows:
        cells = [out["runs"][n]["phases"].get(r) for n in names]
        lines.append(f"| {r} | " + " | ".join("" if c is None else f"{c:.1f}" for c in cells) + " |")
    lines += ["", "engine parts: " + "; ".join(
        f"{n}: " + ", ".join(f"{k.removeprefix('engine_')} {v:.1f}" for k, v in out["runs"][n]["engine"].items())
        for n in names), "", "metrics: " + ", ".join(f"{k} {v:g}" for k, v in out["metrics"].items()), ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("smol")
    s.add_argument("--out", required=True)
    s.add_argument("--model", default="/tmp/smol")
    s.add_argument("--cache", default=None, help="VLLM_CACHE_ROOT and TRITON_CACHE_DIR of both runs (emptied first; "
                   "default: a new folder of this run, removed after it)")
    s.add_argument("--timeout", type=float, default=270, help="seconds each run may take")
    s.add_argument("--cpu", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("--in-dir", nargs="+", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--command", default="python benchmarks/runs.py run startup_smol; run startup_7b")
    r.add_argument("--cpu", action="store_true")
    args = p.parse_args()
    return run_smol(args) if args.cmd == "smol" else report(args)


if __name__ == "__main__":
    sys.exit(main())
