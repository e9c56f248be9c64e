"""Issue 38's record: a mixture of experts at speed on one GPU and on four (benchmarks/results/moe_scale.json + .md).

    python benchmarks/moe_scale.py report --in-dir OUT --out OUT/results/moe_scale.json [--command "..."]
        [--d2d-bytes-per-s B]

Reads what the rows of benchmarks/rows_moe.py left in OUT:
  moe_1b_te_train.json      train_bench on moe_1b (TE grouped GEMM): moe_mfu_active
  moe_1b_te_grpo/           GRPO on one GPU (run.json, plan.json, logs/metrics.jsonl): moe_sync_over_floor
  moe_8b_ep4/, moe_8b_ep4_r3/, moe_8b_ep4_rtp4/    GRPO on four GPUs (router replay off, R3; vLLM expert parallel or
                            tensor-parallel experts)
  allgather_4.json          four_gpu.py's probe: NCCL bus bandwidth and the device-copy bandwidth on 4 GPUs
Per run, medians over steps 2..N (step 1 carries compilation and the first capture of the copy's CUDA graph):
  sync_s                    timing_s/reshard_stream: the weight sync into the engine (rank 0's)
  sync_floor_s              max(bytes copied on this GPU / device-copy bandwidth (measured by the row on its GPU 0
                            before the run: run.json d2d_bytes_per_s), bytes received / NCCL bus bandwidth):
                            copied = reshard/bytes - reshard/remote_bytes (the rank's engine shard less what came from
                            other GPUs), received = reshard/remote_bytes; sync_over_floor = sync_s / sync_floor_s
  mfu_active                perf/mfu/actor_forward_backward: active-parameter FLOPs over the update's forward and
                            backward passes, per GPU
  routing_agreement, logprob_gap    rollout_vs_actor/routing_agreement and logprob_abs_diff_mean
  train/rollout peak vs plan        scale_report's measured peaks against the plan's totals (run's plan.json)
The issue's metrics (goals in GOALS) come from the runs above; a missing run leaves its metrics null. Each run's
inputs are copied to NAME/ beside the JSON, so that one folder brings everything back.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale_report  # noqa: E402  (benchmarks/: this script's folder)
from bench_common import write_result  # noqa: E402

RUNS = ("moe_1b_te_grpo", "moe_8b_ep4", "moe_8b_ep4_r3", "moe_8b_ep4_rtp4")
# metric -> (goal, "min" | "max"): the value must be at least / at most the goal
GOALS = {"moe_mfu_active": (0.25, "min"), "moe_sync_over_floor": (2.0, "max"), "moe_mfu_active_4gpu": (0.25, "min"),
         "moe_sync_over_floor_4gpu": (2.0, "max"), "moe_plan_vs_measured_peak_4gpu": (1.15, "max")}
RUN_KEYS = {"sync_s": "timing_s/reshard_stream", "sync_bytes": "reshard/bytes", "sync_remote_bytes": "reshard/remote_bytes",
            "sync_direct_bytes": "reshard/direct_bytes", "sync_buckets": "reshard/buckets",
            "sync_check_s": "timing_s/sync_check", "mfu_active": "perf/mfu/actor_forward_backward",
            "routing_agreement": "rollout_vs_actor/routing_agreement",
            "logprob_gap": "rollout_vs_actor/logprob_abs_diff_mean", "generate_s": "timing_s/generate"}


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def summarize_run(folder: str, d2d: Optional[float], busbw: Optional[float]) -> dict[str, Any]:
    run = scale_report.load_run(folder)
    steps = scale_report.read_steps(os.path.join(folder, "logs", "metrics.jsonl")) \
        if os.path.exists(os.path.join(folder, "logs", "metrics.jsonl")) else []
    timed = steps[1:]
    for out, key in RUN_KEYS.items():
        run[out] = scale_report.median_of(timed, key)
    run["sync_captures"] = sum(1 for r in timed if r.get("reshard/direct_captured"))
    received = run["sync_remote_bytes"] or 0.0
    copied = (run["sync_bytes"] or 0.0) - received
    floors = [x for x in (_ratio(copied, d2d) if copied else None, _ratio(received, busbw) if received else None) if x]
    run["sync_floor_s"] = max(floors) if floors and (not received or busbw) else None
    run["sync_over_floor"] = _ratio(run["sync_s"], run["sync_floor_s"])
    phases = [run.get(f"{p}_measured_over_plan") for p in ("train", "rollout")]
    phases = [v for v in phases if v]
    run["plan_vs_measured_peak"] = max(max(v, 1 / v) for v in phases) if phases else None
    return run


def headline(train: dict[str, Any], runs: dict[str, dict[str, Any]]) -> dict[str, Optional[float]]:
    one, ep4, r3, rtp4 = (runs.get(n) or {} for n in RUNS)
    m = {"moe_mfu_active": (train.get("metrics") or {}).get("moe_mfu_active"),
         "moe_sync_over_floor": one.get("sync_over_floor"),
         "moe_mfu_active_4gpu": ep4.get("mfu_active"),
         "moe_sync_over_floor_4gpu": ep4.get("sync_over_floor"),
         "moe_plan_vs_measured_peak_4gpu": max([r["plan_vs_measured_peak"] for r in (ep4, r3)
                                               if r.get("plan_vs_measured_peak")], default=None),
         "moe_routing_agreement": one.get("routing_agreement"),
         "moe_routing_agreement_4gpu": ep4.get("routing_agreement"),
         "moe_routing_agreement_r3_4gpu": r3.get("routing_agreement"),
         "moe_logprob_gap_4gpu": ep4.get("logprob_gap"),
         "moe_logprob_gap_r3_4gpu": r3.get("logprob_gap"),
         "moe_r3_gap_over_noreplay_4gpu": _ratio(r3.get("logprob_gap"), ep4.get("logprob_gap")),
         "moe_mfu_active_grpo_1gpu": one.get("mfu_active"),
         "moe_sync_over_floor_4gpu_rtp4": rtp4.get("sync_over_floor"),
         "moe_tokens_per_s_per_gpu_4gpu": ep4.get("tokens_per_s_per_gpu")}
    return m


def _met(value: Optional[float], goal: float, how: str) -> str:
    if value is None:
        return "not run"
    return "met" if (value >= goal if how == "min" else value <= goal) else "not met"


def _f(v: Any, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def markdown(record: dict[str, Any]) -> str:
    m, runs, train = record["metrics"], record["runs"], record.get("train") or {}
    lines = [f"# moe_scale: a mixture of experts at speed (issue 38), {record['device']}, {record['date']}", "",
             "```", record["command"], "```", "", "| metric | value | goal | |", "|---|---|---|---|"]
    for name, (goal, how) in GOALS.items():
        lines.append(f"| `{name}` | {_f(m.get(name))} | {'>=' if how == 'min' else '<='} {goal} | "
                     f"{_met(m.get(name), goal, how)} |")
    lines += [f"| `{k}` | {_f(v)} | | |" for k, v in m.items() if k not in GOALS]
    lines += ["", "| run | GPUs | what | step s | sync s (floor, x) | graph captures | MFU active fwd+bwd | routing "
              "agreement | gap | train / rollout peak vs plan |", "|" + "---|" * 10]
    for name, r in runs.items():
        lines.append(f"| {name} | {r.get('gpus')} x {r.get('device', '?')} | {r.get('what', '')} | "
                     f"{_f(r.get('step_s_median'), '{:.2f}')} | {_f(r.get('sync_s'), '{:.4f}')} "
                     f"({_f(r.get('sync_floor_s'), '{:.4f}')}, {_f(r.get('sync_over_floor'), '{:.2f}')}) | "
                     f"{r.get('sync_captures', '-')} | {_f(r.get('mfu_active'))} | {_f(r.get('routing_agreement'))} | "
                     f"{_f(r.get('logprob_gap'), '{:.4f}')} | {_f(r.get('train_measured_over_plan'), '{:.2f}')} / "
                     f"{_f(r.get('rollout_measured_over_plan'), '{:.2f}')} |")
    if train:
        tm, ts = train.get("metrics", {}), train.get("setup", {})
        lines += ["", f"moe_1b_te_train: {ts.get('experts', '?')}; {ts.get('layout', '')}; "
                  f"{tm.get('tokens_per_update', 0):,} tokens an update, forward+backward {_f(tm.get('forward_backward_seconds'))} s, "
                  f"peak {_f(tm.get('peak_memory_gib'), '{:.1f}')} GiB; `{train.get('command', '')}`"]
    lines += ["", "Medians over steps 2..N; sync = timing_s/reshard_stream on rank 0, floor = max(copied / device-copy "
              "bandwidth, received / NCCL bus bandwidth); peaks: measured / plan (the plan's overhead included)."]
    return "\n".join(lines) + "\n"


def report(args: argparse.Namespace) -> dict[str, Any]:
    ag_path = os.path.join(args.in_dir, "allgather_4.json")
    ag = json.load(open(ag_path)) if os.path.exists(ag_path) else {}
    d2d_4 = ag.get("d2d_bytes_per_s") or args.d2d_bytes_per_s
    d2d_1 = args.d2d_bytes_per_s or ag.get("d2d_bytes_per_s")
    runs = {}
    for name in RUNS:
        folder = os.path.join(args.in_dir, name)
        if os.path.exists(os.path.join(folder, "run.json")):
            info = json.load(open(os.path.join(folder, "run.json")))
            d2d = info.get("d2d_bytes_per_s") or (d2d_1 if info.get("gpus", 1) == 1 else d2d_4)
            runs[name] = summarize_run(folder, d2d, ag.get("busbw_bytes_per_s"))
    train_path = os.path.join(args.in_dir, "moe_1b_te_train.json")
    train = json.load(open(train_path)) if os.path.exists(train_path) else {}
    devices = sorted({f"{r.get('gpus')} x {r.get('device')}" for r in runs.values()} | (
        {f"1 x {train['device']}"} if train.get("device") else set()))
    record = {"command": args.command, "device": "; ".join(devices) or "-", "date": datetime.date.today().isoformat(),
              "metrics": headline(train, runs), "goals": {k: list(v) for k, v in GOALS.items()},
              "bandwidth": {"d2d_bytes_per_s_1gpu": d2d_1, "d2d_bytes_per_s_4gpu": d2d_4,
                            "busbw_bytes_per_s_4gpu": ag.get("busbw_bytes_per_s")},
              "train": train, "runs": runs}
    text = markdown(record)
    write_result(args.out, record, text)
    _keep_inputs(args.in_dir, os.path.splitext(args.out)[0])
    print(text)
    return record


def _keep_inputs(in_dir: str, files: str) -> None:
    os.makedirs(files, exist_ok=True)
    for name in RUNS:
        for src, dst in (("logs/metrics.jsonl", "metrics.jsonl"), ("plan.json", "plan.json"), ("run.json", "run.json")):
            path = os.path.join(in_dir, name, src)
            if os.path.exists(path):
                shutil.copyfile(path, os.path.join(files, f"{name}_{dst}"))
    for name in ("moe_1b_te_train.json", "allgather_4.json"):
        if os.path.exists(os.path.join(in_dir, name)):
            shutil.copyfile(os.path.join(in_dir, name), os.path.join(files, name))


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report")
    r.add_argument("--in-dir", required=True, help="the rows' OUT")
    r.add_argument("--out", required=True)
    r.add_argument("--command", default="python3 benchmarks/runs.py run moe_scale_report")
    r.add_argument("--d2d-bytes-per-s", type=float, default=None,
                   help="device-copy bandwidth for runs whose run.json has none (default: measured here on a GPU)")
    args = p.parse_args(argv)
    if args.d2d_bytes_per_s is None:
        import torch

        if torch.cuda.is_available():
            from bench_common import d2d_bandwidth

            args.d2d_bytes_per_s = d2d_bandwidth("cuda")
    report(args)


if __name__ == "__main__":
    main()
