"""Issue 20's GPU record: GRPO on a random Qwen3-MoE through the real trainer, router replay off and R3.

    python benchmarks/moe_report.py --noreplay RUN1/logs/metrics.jsonl --r3 RUN2/logs/metrics.jsonl \
        --gap gap.json --model-dir MODEL --command "..." --out benchmarks/results/moe_grpo.json

Inputs: the two trainer runs' metrics.jsonl (both with rollout.enable_rollout_routing_replay=true, so both
report rollout_vs_actor/routing_agreement), gap_bench.py's record on the same model (the bf16 floor: transformers
bf16 against vLLM on the same tokens) and the model folder (total and active parameters). Writes the JSON
(DEVELOPERS.md format) and a .md beside it. Per-step figures are means over the steps after the first (its
timings include warm-ups; all steps when there is only one).

  logprob_abs_diff_mean          rollout vs actor (trainer metric, replay off) and its ratio to the bf16 floor
  routing_agreement              fraction of (response token, MoE layer) whose top-k experts are the rollout's;
                                 _replay: the R3 run's (the router's own choice, measured while replaying)
  logprob_abs_diff_mean_replay   rollout vs actor with the rollout's experts replayed (R3)
  sync_seconds                   the weight copy (timing_s/reshard_stream) against sync_floor_seconds =
                                 reshard/bytes / the device-to-device copy bandwidth measured here (hybrid_bench's)
  mfu_active                     perf/mfu/actor: 6 x active matmul weights x tokens (+ attention) / update time / peak
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--noreplay", required=True, help="metrics.jsonl of the run with actor.router_replay.mode=disabled")
    p.add_argument("--r3", required=True, help="metrics.jsonl of the run with actor.router_replay.mode=R3")
    p.add_argument("--gap", required=True, help="gap_bench.py's JSON on the same model")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default=None, help="device name (default: this machine's GPU)")
    p.add_argument("--d2d-bytes-per-s", type=float, default=None,
                   help="device copy bandwidth (default: measured here, as hybrid_bench.py does)")
    return p.parse_args(argv)


def train_rows(path: str) -> list[dict]:
    """The training steps of a metrics.jsonl (validation-only rows left out); [] if the run wrote none."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return [r for r in rows if "critic/score/mean" in r]


def steady_mean(rows: list[dict], key: str) -> float | None:
    """Mean of `key` over the steps after the first (all of them when there is one); None if absent."""
    values = [r[key] for r in (rows[1:] or rows) if isinstance(r.get(key), (int, float))]
    return statistics.fmean(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def model_counts(model_dir: str) -> dict:
    from hybridrl.plan.model_shape import from_hf_config
    from hybridrl.trainer.metrics import matmul_params

    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    shape = from_hf_config(config, name=os.path.basename(model_dir))
    return {"total_params": shape.params, "active_params": shape.active_params, "expert_params": shape.expert_params,
            "matmul_active_params": matmul_params(config), "num_experts": shape.num_experts,
            "experts_per_token": shape.moe_topk, "num_layers": shape.num_layers, "hidden_size": shape.hidden_size}


def build_metrics(noreplay: list[dict], r3: list[dict], gap: dict, counts: dict, d2d_bytes_per_s: float | None) -> dict:
    g = gap.get("metrics", {})
    lp = "rollout_vs_actor/logprob_abs_diff_mean"
    ra = "rollout_vs_actor/routing_agreement"
    floor = g.get("hf_bf16_vs_vllm_abs_diff_mean")
    diff, diff_r3 = steady_mean(noreplay, lp), steady_mean(r3, lp)
    sync = steady_mean(noreplay, "timing_s/reshard_stream")
    sync_bytes = steady_mean(noreplay, "reshard/bytes")
    sync_floor = sync_bytes / d2d_bytes_per_s if sync_bytes and d2d_bytes_per_s else None
    m = {
        "steps": len(noreplay), "steps_replay": len(r3),
        "logprob_abs_diff_mean": diff,
        "logprob_abs_diff_mean_bf16_floor": floor,
        "logprob_abs_diff_over_bf16_floor": _ratio(diff, floor),
        "logprob_abs_diff_max": steady_mean(noreplay, "rollout_vs_actor/logprob_abs_diff_max"),
        # the same ratio on one set of tokens (gap_bench: the actor and transformers bf16 scored vLLM's samples)
        "gap_bench_logprob_abs_diff_mean": g.get("logprob_abs_diff_mean"),
        "gap_bench_over_bf16_floor": _ratio(g.get("logprob_abs_diff_mean"), floor),
        "gap_bench_hf_bf16_vs_hf_fp32_abs_diff_mean": g.get("hf_bf16_vs_hf_fp32_abs_diff_mean"),
        "gap_bench_vllm_vs_hf_fp32_abs_diff_mean": g.get("vllm_vs_hf_fp32_abs_diff_mean"),
        "gap_bench_routing_agreement": g.get("routing_agreement"),
        "routing_agreement": steady_mean(noreplay, ra),
        "routing_agreement_min": steady_mean(noreplay, ra + "_min"),
        "routing_agreement_replay": steady_mean(r3, ra),
        "logprob_abs_diff_mean_replay": diff_r3,
        "logprob_abs_diff_replay_over_noreplay": _ratio(diff_r3, diff),
        "logprob_abs_diff_replay_over_bf16_floor": _ratio(diff_r3, floor),
        "sync_seconds": sync, "sync_total_seconds": steady_mean(noreplay, "timing_s/reshard"),
        "sync_bytes": sync_bytes, "d2d_bytes_per_s": d2d_bytes_per_s, "sync_floor_seconds": sync_floor,
        "sync_time_over_floor": _ratio(sync, sync_floor),
        "sync_direct_bytes_fraction": _ratio(steady_mean(noreplay, "reshard/direct_bytes"), sync_bytes),
        "mfu_active": steady_mean(noreplay, "perf/mfu/actor"),
        "mfu_active_replay": steady_mean(r3, "perf/mfu/actor"),
        "step_seconds": steady_mean(noreplay, "timing_s/step"),
        "step_seconds_replay": steady_mean(r3, "timing_s/step"),
        "gen_seconds": steady_mean(noreplay, "timing_s/gen"),
        "update_actor_seconds": steady_mean(noreplay, "timing_s/update_actor"),
        "update_actor_seconds_replay": steady_mean(r3, "timing_s/update_actor"),
        "throughput_tokens_per_s": steady_mean(noreplay, "perf/throughput"),
        **counts,
    }
    return m


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def markdown(record: dict) -> str:
    m = record["metrics"]
    rows = [
        ("steps (replay off / R3)", f"{_fmt(m['steps'])} / {_fmt(m['steps_replay'])}", ""),
        ("model", f"{m['total_params'] / 1e9:.2f}B total, {m['active_params'] / 1e9:.3f}B active, "
                  f"{m['num_experts']} experts top-{m['experts_per_token']}, {m['num_layers']} layers", ""),
        ("logprob_abs_diff_mean (rollout vs actor)", _fmt(m["logprob_abs_diff_mean"]), "trainer, replay off"),
        ("bf16 floor (transformers bf16 vs vLLM)", _fmt(m["logprob_abs_diff_mean_bf16_floor"]), "gap_bench"),
        ("logprob_abs_diff_over_bf16_floor", _fmt(m["logprob_abs_diff_over_bf16_floor"]), "~1: bf16 rounding only"),
        ("gap_bench actor vs vLLM / floor (same tokens)", _fmt(m["gap_bench_over_bf16_floor"]), ""),
        ("routing_agreement (replay off)", _fmt(m["routing_agreement"]), "per token and MoE layer"),
        ("routing_agreement (R3 run)", _fmt(m["routing_agreement_replay"]), "the router's own top-k"),
        ("logprob_abs_diff_mean_replay (R3)", _fmt(m["logprob_abs_diff_mean_replay"]),
         f"x{_fmt(m['logprob_abs_diff_replay_over_noreplay'])} of replay off"),
        ("sync_seconds (weight copy)", _fmt(m["sync_seconds"]), f"floor {_fmt(m['sync_floor_seconds'])} s"),
        ("sync_time_over_floor", _fmt(m["sync_time_over_floor"]),
         f"{_fmt(m['sync_bytes'])} bytes at {_fmt((m['d2d_bytes_per_s'] or 0) / 1e9)} GB/s"),
        ("mfu_active (replay off / R3)", f"{_fmt(m['mfu_active'])} / {_fmt(m['mfu_active_replay'])}",
         "6 x active matmul weights x tokens"),
        ("step seconds (replay off / R3)", f"{_fmt(m['step_seconds'])} / {_fmt(m['step_seconds_replay'])}", ""),
    ]
    lines = [
        "# moe_grpo: GRPO on a random Qwen3-MoE, vLLM colocated, routing agreement and router replay (issue 20)",
        "",
        f"{record['device']}, {record['date']}. Command:",
        "",
        "```",
        record["command"],
        "```",
        "",
        "| metric | value | note |",
        "|---|---|---|",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows],
        "",
        "Per-step figures are means over the steps after the first. The bf16 floor is gap_bench's transformers-bf16 "
        "vs vLLM gap on the same model (its own samples); the trainer's gap is on the arithmetic prompts.",
        "",
    ]
    return "\n".join(lines)


def write(args: argparse.Namespace, metrics: dict, device: str) -> str:
    record = {"command": args.command, "device": device, "date": datetime.date.today().isoformat(), "metrics": metrics}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    md = os.path.splitext(args.out)[0] + ".md"
    with open(md, "w") as f:
        f.write(markdown(record))
    return md


def main(argv=None) -> None:
    args = parse(argv)
    bandwidth, device = args.d2d_bytes_per_s, args.device
    import torch

    if torch.cuda.is_available():
        device = device or torch.cuda.get_device_name()
        if bandwidth is None:
            from bench_common import d2d_bandwidth

            bandwidth = d2d_bandwidth("cuda")
    noreplay, r3 = train_rows(args.noreplay), train_rows(args.r3)
    gap = {}
    if os.path.exists(args.gap):
        with open(args.gap) as f:
            gap = json.load(f)
    metrics = build_metrics(noreplay, r3, gap, model_counts(args.model_dir), bandwidth)
    md = write(args, metrics, device or "cpu")
    print(f"wrote {args.out} and {md}: {json.dumps(metrics)}", flush=True)


if __name__ == "__main__":
    main()
