"""Issue 19's scale curve: GRPO step time, its phases and peak memory per model shape on one GPU, against
`hybridrl plan` for the same overrides.

    python benchmarks/scale_report.py --in-dir OUT --out OUT/results/megatron_scale.json [--command "..."]

Reads every OUT/scale_SHAPE/ that the row scale_SHAPE of benchmarks/runs.py wrote: run.json (shape, device, the
shape's overrides, the trainer command), plan.json (`hybridrl plan ... --json`, the same overrides) and
logs/metrics.jsonl (the trainer's, one record per step; a step logged twice keeps its last record, as the
trainer's plot does). Per shape, timings over steps 2..N (step 1 carries compilation, allocator growth and
the first pinning of host memory):
  step_s_median/_min/_max   timing_s/step
  <phase>_s                 median timing_s/<phase> of the step's parts (STEP_PHASES; other_s is what the
                            step spent outside them) and of gen's (GEN_PHASES: generation itself, the weight
                            sync into vLLM with its checks (reshard; its engine_wake_weights inside), waking the
                            KV cache, moving the training state out and back, sleep)
  tokens_per_s_per_gpu      median perf/throughput (prompt + response tokens of the step / step time / GPUs)
  startup_s                 timing_s/startup (logged with step 1)
  train_peak_bytes          max memory/train_peak_bytes over all steps: device memory resident when the actor
                            update starts plus the update's rise in allocated memory
  rollout_peak_bytes        max memory/rollout_used_bytes: device memory in use with vLLM's weights and KV awake
  plan_train_bytes, plan_rollout_bytes    the plan's larger of phases.train_actor/actor_step .total, phases.rollout.total
  ref_peak_bytes            max memory/ref_peak_bytes: the reference's log-prob pass with its weights on the device
                            (plan: the ref_log_prob phase; plans made before issue 42's fix have it only with
                            ref.megatron.param_offload)
  train_measured_over_plan, rollout_measured_over_plan, ref_measured_over_plan    measured / plan total (the
                            plan's overhead included)
  *_over_plan_no_overhead   measured / (total - overhead): the 0.5B and 1.5B plan_vs_measured results' basis
  rollout_{used,torch_allocated,torch_reserved}_bytes_by_step    each step's value (None where not logged): a
                            footprint that grows from step to step, and whether torch's live tensors grow with it
Writes the results record (DEVELOPERS.md format: metrics flattened as SHAPE_KEY, each run's detail and
overrides under "runs"), NAME.md beside it, and copies each run's inputs to NAME/ (SHAPE_metrics.jsonl,
SHAPE_plan.json, SHAPE_run.json) so that one folder brings everything back. A markdown table goes to stdout.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shutil
import statistics
import sys
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hybridrl.plan.report import update_peak_total  # noqa: E402

STEP_PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor")
GEN_PHASES = ("generate", "reshard", "engine_wake_weights", "engine_wake_kv_cache", "offload", "onload", "engine_sleep")
GiB = 2 ** 30


def read_steps(path: str) -> list[dict[str, Any]]:
    """The training records of a metrics.jsonl in step order, the last record of each step."""
    by_step: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if "timing_s/step" in row:
                    by_step[int(row["step"])] = row
    return [by_step[k] for k in sorted(by_step)]


def median_of(rows: list[dict[str, Any]], key: str) -> Optional[float]:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def _max(rows: list[dict[str, Any]], key: str) -> Optional[float]:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return max(values) if values else None


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    return num / den if num and den else None


def summarize(steps: list[dict[str, Any]], plan: dict[str, Any]) -> dict[str, Any]:
    """One shape's numbers (module docstring) from its step records and its plan."""
    if not steps:
        return {"error": "no training steps logged"}
    timed = steps[1:]
    out: dict[str, Any] = {"steps": len(steps), "steps_timed": len(timed)}
    if not timed:
        out["error"] = "one step only: steps 2..N are the timed ones (raise STEPS or SCALE_TIME_S)"
    else:
        step = [r["timing_s/step"] for r in timed]
        out.update(step_s_median=statistics.median(step), step_s_min=min(step), step_s_max=max(step))
        for phase in STEP_PHASES:
            out[f"{phase}_s"] = median_of(timed, f"timing_s/{phase}")
        # the median of each step's remainder, not a difference of medians (those need not add up)
        out["other_s"] = statistics.median(
            r["timing_s/step"] - sum(r.get(f"timing_s/{p}", 0.0) for p in STEP_PHASES) for r in timed)
        for phase in GEN_PHASES:
            out[f"gen_{phase}_s"] = median_of(timed, f"timing_s/{phase}")
        out["tokens_per_s_per_gpu"] = median_of(timed, "perf/throughput")
        out["mfu_actor"] = median_of(timed, "perf/mfu/actor")
    out["startup_s"] = steps[0].get("timing_s/startup")
    out["response_length_mean"] = median_of(steps, "response_length/mean")
    out["train_peak_bytes"] = _max(steps, "memory/train_peak_bytes")
    out["rollout_peak_bytes"] = _max(steps, "memory/rollout_used_bytes")
    out["ref_peak_bytes"] = _max(steps, "memory/ref_peak_bytes")  # absent in runs before this metric
    for key in ("rollout_used", "rollout_torch_allocated", "rollout_torch_reserved"):  # growth from step to step
        out[f"{key}_bytes_by_step"] = [r.get(f"memory/{key}_bytes") for r in steps]
    phases = plan.get("phases") or {}
    overhead = plan.get("overhead_bytes") or 0
    totals = {"train": update_peak_total(phases), "rollout": (phases.get("rollout") or {}).get("total"),
              "ref": (phases.get("ref_log_prob") or {}).get("total")}
    for name, total in totals.items():
        out[f"plan_{name}_bytes"] = total
        out[f"{name}_measured_over_plan"] = _ratio(out[f"{name}_peak_bytes"], total)
        out[f"{name}_measured_over_plan_no_overhead"] = _ratio(out[f"{name}_peak_bytes"],
                                                               total - overhead if total else None)
    return out


def load_run(folder: str) -> dict[str, Any]:
    """run.json + plan.json + the summary of logs/metrics.jsonl of one scale_SHAPE run folder."""
    info = json.load(open(os.path.join(folder, "run.json")))
    try:
        plan = json.load(open(os.path.join(folder, "plan.json")))
    except (OSError, json.JSONDecodeError) as e:
        plan = {"error": f"plan.json: {e}"}
    metrics_file = os.path.join(folder, "logs", "metrics.jsonl")
    steps = read_steps(metrics_file) if os.path.exists(metrics_file) else []
    run = {**info, "params": (plan.get("model") or {}).get("params"), "plan_ok": plan.get("ok"),
           "plan_problems": [p.get("message") for p in plan.get("problems") or []],
           "plan_recompute": (plan.get("layout") or {}).get("recompute"),
           "plan_gpu_memory_bytes": plan.get("gpu_memory_bytes"), "plan_overhead_bytes": plan.get("overhead_bytes"),
           **summarize(steps, plan)}
    if not steps:
        run["error"] = f"no training steps in {metrics_file} (see the call's scale_{info['shape']}.log)"
    return run


def _g(value: Optional[float], scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value / scale)


def _params(n: Optional[int]) -> str:
    return "-" if n is None else (f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M")


def _name(shape: str, run: dict[str, Any]) -> str:
    """The row's shape, and the model it ran on where that differs (the CPU dry run's tiny model)."""
    model = run.get("model_shape")
    return shape if model in (None, shape) else f"{shape} ({model} model)"


def table(runs: dict[str, dict[str, Any]]) -> str:
    head = ("| shape | params | steps | step s, median (min-max) | gen | sync | old log-prob | ref | update | "
            "tokens/s/GPU | train peak GiB (plan, x) | rollout peak GiB (plan, x) | start-up s |")
    columns = head.count("|") - 1
    lines = [head, "|" + "---|" * columns]
    for shape, r in runs.items():
        if "step_s_median" not in r:
            lines.append(f"| {_name(shape, r)} | {_params(r.get('params'))} | {r.get('steps', 0)} | "
                         f"failed: {r.get('error')} |" + " |" * (columns - 4))
            continue
        spread = f"{r['step_s_median']:.2f} ({r['step_s_min']:.2f}-{r['step_s_max']:.2f})"
        train = (f"{_g(r['train_peak_bytes'], GiB)} ({_g(r['plan_train_bytes'], GiB)}, "
                 f"{_g(r['train_measured_over_plan'], fmt='{:.2f}')})")
        rollout = (f"{_g(r['rollout_peak_bytes'], GiB)} ({_g(r['plan_rollout_bytes'], GiB)}, "
                   f"{_g(r['rollout_measured_over_plan'], fmt='{:.2f}')})")
        lines.append(f"| {_name(shape, r)} | {_params(r.get('params'))} | {r['steps']} | {spread} | "
                     f"{_g(r['gen_s'], fmt='{:.2f}')} | {_g(r['gen_reshard_s'], fmt='{:.2f}')} | "
                     f"{_g(r['old_log_prob_s'], fmt='{:.2f}')} | {_g(r['ref_s'], fmt='{:.2f}')} | "
                     f"{_g(r['update_actor_s'], fmt='{:.2f}')} | {_g(r['tokens_per_s_per_gpu'], fmt='{:.0f}')} | "
                     f"{train} | {rollout} | {_g(r['startup_s'], fmt='{:.0f}')} |")
    lines.append("")
    lines.append("Timings: medians over steps 2..N, seconds; sync = the weight sync into the rollout engine (inside "
                 "gen); ref '-' = no reference model. Peaks: max over steps; plan = `hybridrl plan` total with its "
                 "overhead; x = measured / plan.")
    lines.append("")
    lines.append("Per-shape overrides (on top of the common workload in each run's command):")
    for shape, r in runs.items():
        lines.append(f"- {shape}: `{' '.join(r.get('shape_overrides', []) + r.get('extra_overrides', []))}`")
    return "\n".join(lines)


def _order(run: dict[str, Any]) -> tuple:
    return (run.get("params") is None, run.get("params") or 0, run.get("shape", ""))


def report(in_dir: str, out: str, command: str) -> dict[str, Any]:
    folders = sorted(p for p in glob.glob(os.path.join(in_dir, "scale_*")) if os.path.exists(os.path.join(p, "run.json")))
    if not folders:
        raise SystemExit(f"scale_report: no {in_dir}/scale_*/run.json (written by `benchmarks/runs.py run scale_SHAPE`)")
    loaded = sorted((load_run(f) for f in folders), key=_order)
    runs = {r["shape"]: r for r in loaded}
    metrics: dict[str, Any] = {}
    skip = {"shape", "model_shape", "device", "command", "model_dir", "shape_overrides", "extra_overrides", "plan_problems"}
    for shape, r in runs.items():
        metrics.update({f"{shape}_{k}": v for k, v in r.items() if k not in skip and not isinstance(v, (list, dict))})
    devices = sorted({r.get("device", "?") for r in runs.values()})
    record = {"command": command, "device": devices[0] if len(devices) == 1 else "; ".join(devices),
              "date": datetime.date.today().isoformat(), "metrics": metrics, "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    text = table(runs)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(f"# {os.path.splitext(os.path.basename(out))[0]}: GRPO scale curve, {record['device']}, "
                f"{record['date']}\n\n{text}\n")
    files = os.path.splitext(out)[0]
    os.makedirs(files, exist_ok=True)
    for folder in folders:
        shape = json.load(open(os.path.join(folder, "run.json")))["shape"]
        for src, name in (("logs/metrics.jsonl", "metrics.jsonl"), ("plan.json", "plan.json"), ("run.json", "run.json")):
            if os.path.exists(os.path.join(folder, src)):
                shutil.copyfile(os.path.join(folder, src), os.path.join(files, f"{shape}_{name}"))
    print(text)
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--in-dir", required=True, help="the runner's OUT: holds scale_SHAPE/ folders")
    p.add_argument("--out", required=True)
    p.add_argument("--command", default="python3 benchmarks/runs.py run scale_SHAPE")
    args = p.parse_args()
    report(args.in_dir, args.out, args.command)


if __name__ == "__main__":
    main()
