"""Print the weight-sync metrics of a trainer run, step by step (used by the GPU runners' logs).

    python benchmarks/grpo_sync_summary.py RUN_DIR/logs/metrics.jsonl
"""
import json
import sys

KEYS = ["timing_s/step", "timing_s/reshard", "timing_s/reshard_stream", "reshard/bytes", "reshard/direct_bytes",
        "reshard/direct_graph", "rollout_vs_actor/logprob_abs_diff_mean", "actor/ppo_kl"]


def main(path: str) -> None:
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            step = row.get("step", row.get("training/global_step"))
            print(step, {k: row[k] for k in KEYS if k in row}, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
