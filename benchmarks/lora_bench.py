"""Issue 40's GPU runs: LoRA against full fine-tuning through the real trainer on one GPU, and the report.

The runs are rows of benchmarks/runs.py (rows_one_gpu.py builds their trainer commands from the tables below):
  lora_7b_full, lora_7b_lora, lora_7b_awake   the scale curve's 7B workload (random weights, rows_one_gpu.scale_common
                                              + SCALE_SHAPES["7b"], GPU_UTIL of the GPU for vLLM), full fine-tuning vs
                                              LoRA rank 32 (adapter-only sync; the engine asleep between rollouts with
                                              its base kept on the GPU where the plan fits it, rollout.lora_base_resident
                                              =auto, else at level 1) vs the same with free_cache_engine=false (the
                                              engine stays awake, KV cache too)
  lora_smol, lora_smol_full                   GRPO on SmolLM2 + gsm_symbolic (configs/grpo_smollm2_gsm8k.yaml) with LoRA,
                                              and full fine-tuning beside it (else the full run of
                                              benchmarks/results/grpo_smollm2.json is the baseline)
  lora_report                                 this script's report over OUT/lora_* -> OUT/results/lora.json + .md

    python benchmarks/lora_bench.py report --in-dir OUT --out OUT/results/lora.json [--full-smol FILE]

Metrics (the issue's names first), medians over steps 2..N of the trainer's metrics.jsonl:
- lora_sync_seconds_vs_full: the sync's transfer and checks (timing_s/reshard less timing_s/engine_wake_weights), LoRA over
  full fine-tuning; lora_sync_phase_seconds_vs_full: timing_s/reshard whole (the engine's wake included: at level 1 it
  copies the base back from host memory, with the base resident it wakes nothing); both also for the awake run (_awake);
- lora_peak_memory_vs_full: the step's peak device memory (max of memory/train_peak_bytes and
  memory/rollout_used_bytes over all steps), LoRA over full; lora_train_peak_vs_full: the training phase's alone;
- lora_gap_vs_full: rollout-vs-actor log-prob gap (rollout_vs_actor/logprob_abs_diff_mean), LoRA over full: the bf16
  floor is full fine-tuning's gap on the same model and engine, so at the floor this is about 1;
- lora_val_score_gain: last - first val/score of the SmolLM2 LoRA run; full_val_score_gain beside it;
- lora_sync_bytes, full_sync_bytes: reshard/bytes per step (LoRA: the adapters alone).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from scale_report import read_steps  # noqa: E402

ARA = "actor_rollout_ref"
# every run on megatron's local layer spec, the one LoRA runs on (the GPU host has no transformer-engine anyway)
LOCAL = (f"{ARA}.actor.megatron.transformer_impl=local", f"{ARA}.ref.megatron.transformer_impl=local")
# the 7B rows: on top of the scale workload and its 7b overrides (full fine-tuning as the scale curve runs it)
LORA_7B = (*LOCAL, f"{ARA}.model.lora_rank=32", f"{ARA}.model.lora_alpha=32", f"{ARA}.actor.optim.lr=1e-4",
           f"{ARA}.actor.megatron.optimizer_offload=false")  # LoRA's optimizer state is the adapters': no offload
VARIANTS_7B = {"full": LOCAL, "lora": LORA_7B, "awake": (*LORA_7B, f"{ARA}.rollout.free_cache_engine=false")}
# SmolLM2: LoRA at 10x full fine-tuning's learning rate (grpo_smollm2_gsm8k: 1e-5), rank 32, alpha 32
LORA_SMOL = (*LOCAL, f"{ARA}.model.lora_rank=32", f"{ARA}.model.lora_alpha=32", f"{ARA}.actor.optim.lr=1e-4")
VARIANTS_SMOL = {"smol": LORA_SMOL, "smol_full": LOCAL}
FULL_SMOL = os.path.join(HERE, "results", "grpo_smollm2.json")
RUN_NAMES = (*(f"7b_{v}" for v in VARIANTS_7B), *VARIANTS_SMOL)  # each run's folder: OUT/lora_NAME


def metrics_rows(folder: str) -> list[dict[str, Any]]:
    """The training steps of a run folder's metrics.jsonl (main_ppo: logs/; the CPU demo: checkpoints/logs/)."""
    for sub in ("logs", os.path.join("checkpoints", "logs")):
        path = os.path.join(folder, sub, "metrics.jsonl")
        if os.path.exists(path):
            return read_steps(path)
    return []


def val_scores(folder: str) -> list[float]:
    for sub in ("logs", os.path.join("checkpoints", "logs")):
        path = os.path.join(folder, sub, "metrics.jsonl")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return [json.loads(line)["val/score"] for line in f if '"val/score"' in line]
    return []


def _median(rows: list[dict[str, Any]], key: str) -> Optional[float]:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def _max(rows: list[dict[str, Any]], *keys: str) -> Optional[float]:
    values = [r[k] for r in rows for k in keys if isinstance(r.get(k), (int, float))]
    return max(values) if values else None


def summary(folder: str) -> dict[str, Any]:
    """One run's numbers: sync seconds (whole, wake, transfer + checks), bytes, peaks, gap, val scores."""
    steps = metrics_rows(folder)
    timed = steps[1:] or steps  # step 1 carries compilation and the first pinning of host memory
    transfer = [r["timing_s/reshard"] - r.get("timing_s/engine_wake_weights", 0.0) for r in timed
                if isinstance(r.get("timing_s/reshard"), (int, float))]
    vals = val_scores(folder)
    return {"steps": len(steps), "sync_s": _median(timed, "timing_s/reshard"),
            "sync_wake_s": _median(timed, "timing_s/engine_wake_weights"),
            "sync_transfer_s": statistics.median(transfer) if transfer else None,
            "sync_stream_s": _median(timed, "timing_s/reshard_stream"),
            "sync_check_s": _median(timed, "timing_s/sync_check"),
            "engine_sleep_s": _median(timed, "timing_s/engine_sleep"),
            "sync_bytes": _median(timed, "reshard/bytes"), "adapter_bytes": _median(timed, "reshard/adapter_bytes"),
            "peak_bytes": _max(steps, "memory/train_peak_bytes", "memory/rollout_used_bytes"),
            "train_peak_bytes": _max(steps, "memory/train_peak_bytes"),
            "rollout_peak_bytes": _max(steps, "memory/rollout_used_bytes"),
            "gap": _median(timed, "rollout_vs_actor/logprob_abs_diff_mean"),
            "step_s": _median(timed, "timing_s/step"), "update_actor_s": _median(timed, "timing_s/update_actor"),
            "val_score_before": vals[0] if vals else None, "val_score_after": vals[-1] if vals else None,
            "val_score_gain": vals[-1] - vals[0] if len(vals) >= 2 else None}


def ratio(x: Optional[float], y: Optional[float]) -> Optional[float]:
    return x / y if x is not None and y else None


def report(in_dir: str, full_smol: str = FULL_SMOL, device: Optional[str] = None) -> dict[str, Any]:
    runs = {name: summary(os.path.join(in_dir, f"lora_{name}")) for name in RUN_NAMES}
    full, lora, awake, smol = runs["7b_full"], runs["7b_lora"], runs["7b_awake"], runs["smol"]
    full_gain, full_source = runs["smol_full"]["val_score_gain"], "lora_smol_full"
    if full_gain is None and os.path.exists(full_smol):  # the earlier full fine-tuning run of the same job
        full_gain, full_source = json.load(open(full_smol))["metrics"].get("val_score_gain"), full_smol
    metrics = {
        "lora_sync_seconds_vs_full": ratio(lora["sync_transfer_s"], full["sync_transfer_s"]),
        "lora_sync_phase_seconds_vs_full": ratio(lora["sync_s"], full["sync_s"]),
        "lora_sync_seconds_vs_full_awake": ratio(awake["sync_transfer_s"], full["sync_transfer_s"]),
        "lora_sync_phase_seconds_vs_full_awake": ratio(awake["sync_s"], full["sync_s"]),
        "lora_peak_memory_vs_full": ratio(lora["peak_bytes"], full["peak_bytes"]),
        "lora_peak_memory_vs_full_awake": ratio(awake["peak_bytes"], full["peak_bytes"]),
        "lora_train_peak_vs_full": ratio(lora["train_peak_bytes"], full["train_peak_bytes"]),
        "lora_gap_vs_full": ratio(lora["gap"], full["gap"]),
        "lora_gap_vs_full_awake": ratio(awake["gap"], full["gap"]),
        "lora_sync_bytes": lora["sync_bytes"], "full_sync_bytes": full["sync_bytes"],
        "lora_val_score_gain": smol["val_score_gain"], "full_val_score_gain": full_gain,
        "smol_lora_gap": smol["gap"],
    }
    return {"device": device, "date": datetime.date.today().isoformat(), "metrics": metrics, "runs": runs,
            "full_val_score_gain_from": full_source}


def _f(value: Optional[float], scale: float = 1.0, fmt: str = "{:.3g}") -> str:
    return "-" if value is None else fmt.format(value / scale)


def markdown(result: dict[str, Any], command: str) -> str:
    m, runs = result["metrics"], result["runs"]
    goals = {"lora_sync_seconds_vs_full": "<= 0.2", "lora_peak_memory_vs_full": "<= 0.5",
             "lora_gap_vs_full": "about 1 (the bf16 floor)", "lora_val_score_gain": ">= 0.05"}
    lines = [f"# lora: LoRA (adapter-only sync) vs full fine-tuning, {result['device']}, {result['date']}", "",
             f"`{command}`", "",
             "| metric | value | goal |", "|---|---|---|"]
    lines += [f"| {k} | {_f(v)} | {goals.get(k, '')} |" for k, v in m.items()]
    lines += ["", "| run | steps | sync s | wake s | transfer+checks s | bytes/step | peak GiB | train peak GiB | "
              "rollout peak GiB | gap | step s | val gain |", "|" + "---|" * 12]
    for name, r in runs.items():
        lines.append(f"| {name} | {r['steps']} | {_f(r['sync_s'])} | {_f(r['sync_wake_s'])} | {_f(r['sync_transfer_s'])} | "
                     f"{_f(r['sync_bytes'], 2**20, '{:.1f} MiB')} | {_f(r['peak_bytes'], 2**30, '{:.1f}')} | "
                     f"{_f(r['train_peak_bytes'], 2**30, '{:.1f}')} | {_f(r['rollout_peak_bytes'], 2**30, '{:.1f}')} | "
                     f"{_f(r['gap'])} | {_f(r['step_s'])} | {_f(r['val_score_gain'])} |")
    lines += ["", f"full_val_score_gain from {result['full_val_score_gain_from']}.", "",
              "Sync: transfer+checks = timing_s/reshard less the engine's wake of its weights (at level-1 sleep the LoRA "
              "engine copies its base back from host memory there, with its base resident it wakes nothing; full "
              "fine-tuning's level-2 wake only maps memory). "
              "The awake run keeps the engine on the GPU through training (free_cache_engine=false).", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("--in-dir", required=True, help="the runs' OUT: lora_7b_full/, lora_7b_lora/, ... under it")
    rep.add_argument("--out", required=True, help="results/lora.json (lora.md beside it)")
    rep.add_argument("--full-smol", default=FULL_SMOL, help="full fine-tuning's SmolLM2 result when lora_smol_full "
                                                            "did not run")
    rep.add_argument("--device", default=None, help="the GPU's name, for the record")
    args = p.parse_args()
    result = report(args.in_dir, args.full_smol, args.device)
    command = "; ".join(f"OUT=$OUT python3 benchmarks/runs.py run lora_{n}" for n in (*RUN_NAMES, "report"))
    result = {"command": command, **result}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(markdown(result, command))
    print(json.dumps(result["metrics"], indent=1))


if __name__ == "__main__":
    main()
