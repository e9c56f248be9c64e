"""Summarize a training run's metrics.jsonl as a results record (DEVELOPERS.md format).

    python benchmarks/grpo_report.py --metrics DIR/logs/metrics.jsonl --command "..." --out results/NAME.json

val_score_gain = last val/score - first val/score (fraction; x100 for points); also the strict accuracy
extras (val-aux/*), the mean per-phase timing (timing_s/*), tokens/s/GPU (perf/throughput), the
rollout-vs-actor log-prob gap and the number of steps.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--metrics", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--device", default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows = [json.loads(line) for line in open(args.metrics)]
    val = [r for r in rows if "val/score" in r]
    train = [r for r in rows if "critic/score/mean" in r]
    num = lambda v: isinstance(v, (int, float))  # noqa: E731
    metrics = {"steps": len(train)}
    if val:  # a timing run may validate never
        metrics.update(val_score_before=val[0]["val/score"], val_score_after=val[-1]["val/score"],
                       val_score_gain=val[-1]["val/score"] - val[0]["val/score"])
    for k in sorted({k for r in val for k in r if k.startswith("val-aux/")}):
        metrics[f"{k}_before"], metrics[f"{k}_after"] = val[0].get(k), val[-1].get(k)
    keys = sorted({k for r in train for k in r if k.startswith(("timing_s/", "perf/", "rollout_vs_actor/"))})
    for k in keys:
        values = [r[k] for r in train if num(r.get(k))]
        if values:
            metrics[f"{k}_mean"] = statistics.fmean(values)
    metrics["train_score_first"] = train[0]["critic/score/mean"] if train else None
    metrics["train_score_last"] = train[-1]["critic/score/mean"] if train else None
    device = args.device
    if device is None:
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    record = {"command": args.command, "device": device, "date": datetime.date.today().isoformat(), "metrics": metrics}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(metrics, indent=1))


if __name__ == "__main__":
    main()
