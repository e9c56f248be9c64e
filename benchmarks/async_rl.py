"""Issue 37's GPU runs: fully async (2 GPUs train, 2 generate) vs colocated on 4 GPUs vs one-step-off (2 + 2), back to
back on one machine, on a job with long-tailed responses (SmolLM2 GRPO, responses up to 4k tokens, sampled EOS).

    python benchmarks/async_rl.py list
    python benchmarks/async_rl.py run NAME [NAME ...] --model DIR --out DIR [--steps 20]
    python benchmarks/async_rl.py report --in-dir DIR --out benchmarks/results/async_rl.json
    python benchmarks/async_rl.py dry-run --out DIR      # CPU: every row on the demo model for 3 steps (gloo)

Metrics (the issue's names):
- async_vs_colocated_throughput: response tokens/s over the whole run (sum of perf/total_num_tokens over the wall time
  from the first to the last step's end), fully_async_2_2 over colocated_4; one-step-off beside them;
- async_val_gain_over_sync: (last - first validation score) of fully_async_2_2 over that of colocated_4, the same
  number of samples (steps x train_batch_size x n) each, with the async run's version lag reported beside it.
NOT RUN YET ON GPU: the table is here so a lease can run it; the dry run checks the command lines on CPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARA = "actor_rollout_ref"
SPLIT = [f"{ARA}.hybrid_engine=false", f"{ARA}.rollout.n_gpus_per_node=2", "trainer.n_gpus_per_node=2",
         f"{ARA}.rollout.calculate_log_probs=true"]
LONG_TAIL = ["data.max_response_length=4096", f"{ARA}.rollout.ignore_eos=false", f"{ARA}.rollout.temperature=1.0",
             "data.train_batch_size=64", f"{ARA}.actor.ppo_mini_batch_size=32", f"{ARA}.actor.use_dynamic_bsz=true",
             f"{ARA}.actor.ppo_max_token_len_per_gpu=16384", "trainer.val_before_train=true"]
ASYNC = ["async_training.enable=true", "async_training.require_batches=2", "async_training.staleness_threshold=0.5",
         "async_training.trigger_parameter_sync_step=1", "async_training.partial_rollout=true",
         "async_training.compute_prox_log_prob=true"]


@dataclass(frozen=True)
class Run:
    name: str
    overrides: tuple[str, ...]
    gpus: int = 4


RUNS = {r.name: r for r in (
    Run("colocated_4", ("trainer.n_gpus_per_node=4",)),
    Run("one_step_off_2_2", (*SPLIT, "trainer.one_step_off_policy=true")),
    Run("fully_async_2_2", (*SPLIT, *ASYNC)),
)}
CPU_DEMO = ["trainer.device=cpu", "trainer.plot=false", "trainer.test_freq=3", "data.max_response_length=4",
            f"{ARA}.rollout.n_gpus_per_node=1"]


def command(run: Run, steps: int, folder: str, model: Optional[str], cpu: bool) -> list[str]:
    common = [f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={folder}",
              "trainer.logger=[console,jsonl]"]
    if cpu:  # the demo's tiny model and data; one rollout process, two trainer ranks
        overrides = [o.replace("n_gpus_per_node=4", "n_gpus_per_node=2") for o in run.overrides
                     if "rollout.n_gpus_per_node" not in o and not o.startswith("trainer.n_gpus_per_node=2")]
        overrides = [o.replace("require_batches=2", "require_batches=1") for o in overrides]
        return [sys.executable, "-m", "hybridrl.trainer.demo", "--out", folder, "--sft-steps", "20", *CPU_DEMO,
                *overrides, f"trainer.total_training_steps={steps}"]
    return [sys.executable, "-m", "hybridrl.trainer.main_ppo", "--config-name", "grpo_smollm2_gsm8k",
            f"{ARA}.model.path={model}", *LONG_TAIL, *run.overrides, *common]


def run_rows(names: list[str], out: str, steps: int, model: Optional[str], cpu: bool) -> None:
    for name in names:
        folder = os.path.join(out, name)
        cmd = command(RUNS[name], steps, folder, model, cpu)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{name}.log"), "w") as log:
            code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, PYTHONPATH=_python_path())).returncode
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump({"command": " ".join(cmd), "returncode": code}, f)
        print(f"async_rl: {name} exit {code}: {summary(folder) if code == 0 else 'see ' + name + '.log'}", flush=True)


def _python_path() -> str:
    """The repository first, then what the caller set (on the GPU host /tmp/site: vLLM, megatron-core, Ray)."""
    return os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)


def metrics_rows(folder: str) -> list[dict[str, Any]]:
    for sub in ("checkpoints/logs", "logs"):
        path = os.path.join(folder, sub, "metrics.jsonl")
        if os.path.exists(path):
            return [json.loads(line) for line in open(path)]
    return []


def summary(folder: str) -> dict[str, Optional[float]]:
    rows = metrics_rows(folder)
    train = [r for r in rows if "perf/total_num_tokens" in r]
    vals = [r["val/score"] for r in rows if "val/score" in r]
    seconds = sum(r.get("timing_s/step", 0.0) for r in train)  # each step's wall time, generation waits included
    lags = [r["fully_async/version_lag/mean"] for r in train if "fully_async/version_lag/mean" in r]
    return {"tokens_per_s": sum(r["perf/total_num_tokens"] for r in train) / seconds if seconds else None,
            "val_gain": vals[-1] - vals[0] if len(vals) >= 2 else None, "steps": float(len(train)),
            "version_lag_mean": sum(lags) / len(lags) if lags else None}


def ratio(x: Optional[float], y: Optional[float]) -> Optional[float]:
    return x / y if x is not None and y not in (None, 0) else None


def report(in_dir: str) -> dict[str, Any]:
    s = {name: summary(os.path.join(in_dir, name)) for name in RUNS}
    a, c = s["fully_async_2_2"], s["colocated_4"]
    return {"metrics": {"async_vs_colocated_throughput": ratio(a["tokens_per_s"], c["tokens_per_s"]),
                        "one_step_off_vs_colocated_throughput": ratio(s["one_step_off_2_2"]["tokens_per_s"],
                                                                      c["tokens_per_s"]),
                        "async_val_gain_over_sync": ratio(a["val_gain"], c["val_gain"]),
                        "async_version_lag_mean": a["version_lag_mean"]},
            "runs": s, "date": datetime.date.today().isoformat()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["list", "run", "report", "dry-run"])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--out", default="/tmp/async_rl")
    parser.add_argument("--in-dir")
    parser.add_argument("--model")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if args.mode == "list":
        for r in RUNS.values():
            print(f"{r.name:18s} {r.gpus} GPUs  {' '.join(r.overrides)}")
    elif args.mode == "run":
        if not args.model:
            parser.error("run needs --model (SmolLM2-135M-Instruct's folder)")
        run_rows(args.names or list(RUNS), args.out, args.steps, args.model, cpu=False)
    elif args.mode == "dry-run":
        run_rows(args.names or list(RUNS), args.out, 3, None, cpu=True)
        print(json.dumps(report(args.out)["metrics"], indent=1))
    else:
        result = report(args.in_dir)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result["metrics"], indent=1))


if __name__ == "__main__":
    main()
