"""Issue 17's record (benchmarks/results/rollout_graphs.json) from the runs of one lease (the rows grpo, gap and
report of benchmarks/runs.py):

  --bench DIR       hybrid_bench.py's rollout_bench.json + reshard_bench.json (graphs on; hybrid vs standalone
                    alternated; the 0.5B random model's gap table)
  --gap NAME=FILE   gap_bench.py results of the other models (e.g. 1.5b_random=..., smollm2_135m=...)
  --graphs FILE     metrics.jsonl of the SmolLM2 GRPO run with CUDA graphs (the machine's first run: cold caches)
  --warm FILE       metrics.jsonl of a second graphs run on the same machine (start-up with warm caches)
  --eager FILE      metrics.jsonl of the same job with enforce_eager=true

Per-step timings are medians over steps 2..K, K the step count of the shortest of the three runs, so every run
is compared on the same steps (same data, seeds and response lengths; step 1 carries warm-ups).
gen_speedup_graphs_vs_eager compares the warm graphs run with the eager run (both after the machine's first
compile); the first graphs run's own ratio is reported beside it (its early steps also JIT-compile kernels for
shapes met for the first time). gap_over_bf16_floor of a model is
actor-vs-vLLM / transformers-bf16-vs-vLLM on the same tokens: 1.0 means the actor is as close to vLLM as an
independent bf16 implementation loading the weights from disk.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys


def steps(path: str) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(line) for line in open(path)]
    return [r for r in rows if "timing_s/step" in r], [r for r in rows if "val/score" in r]


def median_after_first(train: list[dict], key: str, last: int | None = None) -> float:
    """Median of `key` over steps 2..last (all steps if there is only one)."""
    rows = train[1:last] if len(train) > 1 else train
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else float("nan")


def startup(train: list[dict]) -> dict:
    first = train[0] if train else {}
    return {k: v for k, v in first.items() if k.startswith("timing_s/startup")}


def run_summary(path: str, last: int | None = None) -> dict:
    train, val = steps(path)
    out = {"steps": len(train), **{f"{k}_median": median_after_first(train, k, last)
                                   for k in ("timing_s/gen", "timing_s/step", "timing_s/generate", "timing_s/reshard",
                                             "timing_s/update_actor", "timing_s/old_log_prob", "timing_s/ref",
                                             "perf/throughput", "rollout_vs_actor/logprob_abs_diff_mean")},
           "startup": startup(train)}
    if len(val) >= 2:
        out.update(val_score_before=val[0]["val/score"], val_score_after=val[-1]["val/score"],
                   val_score_gain=val[-1]["val/score"] - val[0]["val/score"])
    return out


def gap_row(metrics: dict) -> dict:
    actor, floor = metrics["megatron_sdpa_vs_vllm_abs_diff_mean"], metrics["hf_bf16_vs_vllm_abs_diff_mean"]
    return {"actor_vs_vllm": actor, "hf_bf16_vs_vllm": floor, "gap_over_bf16_floor": actor / floor,
            "actor_vs_fp32": metrics.get("megatron_sdpa_vs_hf_fp32_abs_diff_mean"),
            "vllm_vs_fp32": metrics.get("hf_fp32_vs_vllm_abs_diff_mean"),
            "megatron_local_vs_vllm": metrics.get("megatron_local_vs_vllm_abs_diff_mean")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", required=True)
    p.add_argument("--gap", action="append", default=[], help="NAME=gap_bench json")
    p.add_argument("--graphs", required=True)
    p.add_argument("--warm", default=None)
    p.add_argument("--eager", required=True)
    p.add_argument("--command", default="python3 benchmarks/runs.py run report")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    rollout = json.load(open(os.path.join(args.bench, "rollout_bench.json")))
    reshard = json.load(open(os.path.join(args.bench, "reshard_bench.json")))
    gaps = {"0.5b_random": gap_row(reshard["metrics"])}
    for item in args.gap:
        name, path = item.split("=", 1)
        gaps[name] = gap_row(json.load(open(path))["metrics"])
    runs = {"graphs": args.graphs, "eager": args.eager, **({"warm": args.warm} if args.warm else {})}
    last = min(len(steps(path)[0]) for path in runs.values())
    common = {name: run_summary(path, last) for name, path in runs.items()}  # steps 2..last of every run
    graphs, eager, warm = run_summary(args.graphs), common["eager"], common.get("warm", common["graphs"])
    r = rollout["metrics"]
    metrics = {
        "rollout_tokens_per_s_vs_standalone": r["rollout_tokens_per_s_vs_standalone"],
        "rollout_tokens_per_s_vs_standalone_min": r["rollout_tokens_per_s_vs_standalone_min"],
        "rollout_tokens_per_s_vs_standalone_max": r["rollout_tokens_per_s_vs_standalone_max"],
        "rollout_tokens_per_s_vs_standalone_sleep_mode": r.get("rollout_tokens_per_s_vs_standalone_sleep_mode"),
        "rollout_reps": r["reps"],
        "compared_steps": f"2..{last}",
        "gen_speedup_graphs_vs_eager": eager["timing_s/gen_median"] / warm["timing_s/gen_median"],
        "gen_speedup_graphs_first_run_vs_eager": eager["timing_s/gen_median"] / common["graphs"]["timing_s/gen_median"],
        "timing_s/gen_graphs": warm["timing_s/gen_median"], "timing_s/gen_eager": eager["timing_s/gen_median"],
        "timing_s/gen_graphs_first_run": common["graphs"]["timing_s/gen_median"],
        "timing_s/gen_graphs_first_run_all_steps": graphs["timing_s/gen_median"],
        "timing_s/step_graphs": warm["timing_s/step_median"], "timing_s/step_eager": eager["timing_s/step_median"],
        "timing_s/step_graphs_first_run": common["graphs"]["timing_s/step_median"],
        "timing_s/step_graphs_first_run_all_steps": graphs["timing_s/step_median"],
        "timing_s/startup_first_run": graphs["startup"].get("timing_s/startup"),
        "timing_s/startup_second_run": warm.get("startup", {}).get("timing_s/startup"),
        "timing_s/startup_eager": eager["startup"].get("timing_s/startup"),
        "val_score_gain": graphs.get("val_score_gain"), "val_score_before": graphs.get("val_score_before"),
        "val_score_after": graphs.get("val_score_after"), "steps_graphs": graphs["steps"],
        "gap_over_bf16_floor_max": max(g["gap_over_bf16_floor"] for g in gaps.values()),
        **{f"gap_over_bf16_floor_{name}": g["gap_over_bf16_floor"] for name, g in gaps.items()},
    }
    record = {"command": args.command, "device": rollout["device"], "date": datetime.date.today().isoformat(),
              "metrics": metrics, "gap_table": gaps, "runs": {"graphs_all_steps": graphs, **common},
              "rollout_per_rep": rollout.get("per_rep"), "engines": {"hybrid": rollout.get("hybrid_engine"),
                                                                    "peers": rollout.get("peers")}}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    json.dump(metrics, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
