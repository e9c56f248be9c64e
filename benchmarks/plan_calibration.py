"""The step-time model of `hybridrl plan --search` (hybridrl/plan/step_time.py) against every measured GRPO step kept in
benchmarks/results/ (issue 43: `plan_step_time_error_max`).

    python benchmarks/plan_calibration.py collect    # the run folders below -> benchmarks/results/plan_calibration.json
    python benchmarks/plan_calibration.py accuracy   # that file + the model -> plan_accuracy.json + .md (with the fit)

collect: one row per kept run (SOURCES): its trainer overrides (run.json, less paths and trainer.* keys), the GPUs,
the median of timing_s/step over steps 2..N and the medians of its phases (phases_s: the keys of PHASES), and the
runs left out, each with its reason (LEFT_OUT). Rows with no run folder kept (the two 2 x H200 rows of four_gpu.json
before their folder, scale_*) come from the existing file as they are.

accuracy: the predicted step (Costs() as committed) against the measured one on every row; then the fit that checks
the constants are not fitted to the rows they are checked on: FITTED constants (Costs fields) are fitted by
Nelder-Mead on the squared log error of the step (and, where measured, of generate, gen, update and the log-prob
passes) over the rows of all leases but one, and the step error is reported on the held-out lease's rows
(leave-one-lease-out); then the same fit over every row, which is what Costs() should hold (the md prints both).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
from dataclasses import fields, replace
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RES = os.path.join(ROOT, "benchmarks", "results")
CALIBRATION = os.path.join(RES, "plan_calibration.json")

# measured phase -> timing_s key(s) whose medians it is (summed)
PHASES = {"gen": ["timing_s/gen"], "generate": ["timing_s/generate"], "sync": ["timing_s/reshard_stream"],
          "sync_check": ["timing_s/sync_check"], "engine_wake_weights": ["timing_s/engine_wake_weights"],
          "engine_wake_kv_cache": ["timing_s/engine_wake_kv_cache"], "engine_sleep": ["timing_s/engine_sleep"],
          "old_log_prob": ["timing_s/old_log_prob"], "ref": ["timing_s/ref"], "reward": ["timing_s/reward"],
          "update": ["timing_s/update_actor"], "fwd_bwd": ["timing_s/actor_forward_backward"],
          "optimizer_onload": ["timing_s/actor_onload_wait"], "sync_received_gb": ["reshard/remote_bytes"]}
KEEP_PREFIXES = ("data.max_", "data.train_batch_size", "actor_rollout_ref.", "reward_model.", "+actor_rollout_ref.",
                 "algorithm.")
DROP = ("path=", "_files=", "rollout.name=")

L1 = "4 x H200, 2026-11-27 (first lease: four_gpu runs: TE, packed micro-batches, vLLM CUDA graphs, " \
     "gpu_memory_utilization 0.4; medians of steps 2-5)"
L2 = "4 x H200, 2026-11-27 (second lease: four_gpu runs at verl's batch sizes, TE, packed micro-batches, vLLM CUDA " \
     "graphs, gpu_memory_utilization 0.4, ignore_eos; medians of steps 2-5)"
L3 = "4 x H200, 2026-11-27 (third lease, call 2: TE, packed micro-batches, vLLM CUDA graphs, gpu_memory_utilization " \
     "0.4, ignore_eos; medians of steps 2-5)"
L6 = "4 x H200, 2026-11-28 (sixth lease: cross-GPU sync with zero-copy views; medians of steps 2-N)"
L7 = ("4 x H200, 2026-11-28 (seventh lease: the zero-copy A/B, view to view and staged; medians of steps 2-N; "
      "the machine ran tests/gpu and one-GPU rows before, not beside)")

# the reward model's shape (a 0.5B-shaped Qwen2ForSequenceClassification, reward_model.md), relative to the repository
RM_PATH = "reward_model.model.path=benchmarks/plan_models/Qwen2.5-0.5B-RM"
# name, lease (the hold-out group), model, GPU, files prefix (…metrics.jsonl, …run.json or a folder), what it was
SOURCES: list[dict[str, Any]] = [
    *[dict(name=f"h200x4_{n}", lease="h200x4_1", model=m, gpu="H200", prefix=f"four_gpu_h200x4/{p}_", note=L1)
      for n, p, m in (("7b_1gpu", "7b_1gpu", "Qwen2.5-7B"), ("7b_tp2dp2", "7b_tp2dp2.nofuse", "Qwen2.5-7B"),
                      ("7b_tp4", "7b_tp4.nofuse", "Qwen2.5-7B"), ("7b_tp4_eager", "7b_tp4.eager", "Qwen2.5-7B"), ("7b_pp2dp2", "7b_pp2dp2_rdp4", "Qwen2.5-7B"),
                      ("1p5b_1gpu", "1p5b_1gpu.noseed", "Qwen2.5-1.5B"), ("1p5b_dp4", "1p5b_dp4.noseed", "Qwen2.5-1.5B"))],
    *[dict(name=f"h200x4_2_{p}", lease="h200x4_2", model=m, gpu="H200", prefix=f"four_gpu_h200x4_2/{p}_", note=L2)
      for p, m in (("1p5b_big_1gpu", "Qwen2.5-1.5B"), ("1p5b_big_dp4", "Qwen2.5-1.5B"), ("7b_big_1gpu", "Qwen2.5-7B"),
                   ("7b_big_tp2dp2", "Qwen2.5-7B"), ("7b_big_rdp4", "Qwen2.5-7B"))],
    *[dict(name=f"h200x4_3_{p}", lease="h200x4_3", model=m, gpu="H200", prefix=f"four_gpu_h200x4_3/{p}_", note=L3)
      for p, m in (("14b_4gpu", "Qwen2.5-14B"), ("7b_pp2dp2_rtp2", "Qwen2.5-7B"), ("7b_big_rdp4", "Qwen2.5-7B"))],
    *[dict(name=f"h200x4_6_{p}", lease="h200x4_6", model="Qwen2.5-7B", gpu="H200",
           prefix=f"four_gpu_h200x4_6/r/{p}/", note=L6) for p in ("7b_big_rdp4", "7b_pp2dp2_rtp2")],
    *[dict(name=f"h200x4_7_{p}", lease="h200x4_7", model="Qwen2.5-7B", gpu="H200",
           prefix=f"four_gpu_h200x4_7/r/{p}/", note=L7) for p in ("7b_big_rdp4", "7b_big_rdp4.staged")],
    dict(name="h200x2_1p5b_1gpu", lease="h200x2", model="Qwen2.5-1.5B", gpu="H200", prefix="four_gpu_h200x2/1p5b_1gpu_",
         note="2 x H200, 2026-11-27 (four_gpu_h200x2.json; medians of steps 2-6)", replaces="1p5b_1gpu"),
    dict(name="h200x2_1p5b_dp2", lease="h200x2", model="Qwen2.5-1.5B", gpu="H200", prefix="four_gpu_h200x2/1p5b_dp2_",
         note="2 x H200, 2026-11-27 (four_gpu_h200x2.json; medians of steps 2-6)", replaces="1p5b_dp2"),
    *[dict(name=f"scale_{s}", lease="scale_h200", model=m, gpu="H200", prefix=f"megatron_scale/{s}_",
           extra=["actor_rollout_ref.actor.megatron.optimizer_offload=true"],
           note="megatron_scale.json, 1 x H200, 2026-11-26 (the optimizer state went to the host every step then; "
                "medians of steps 2-4)")
      for s, m in (("0.5b", "Qwen2.5-0.5B"), ("1.5b", "Qwen2.5-1.5B"), ("3b", "Qwen2.5-3B"), ("7b", "Qwen2.5-7B"))],
]

# Measured GRPO steps not in the calibration, each with why.
LEFT_OUT: list[dict[str, str]] = [
    dict(name="four_gpu_h200x4_3/7b_big_tp2dp2.car, 7b_big_1gpu.car",
         why="third lease, call 3: that call ran slower throughout, its one-GPU base included, for a cause not found "
             "(four_gpu.md, top section)"),
    dict(name="four_gpu_h200x4_6/r/1p5b_big_1gpu.keep, 1p5b_big_dp4.keep",
         why="the engine kept awake (rollout.free_cache_engine=false): its KV cache shares the GPU with the training "
             "state, generate took 16.2 s against 10.4 s asleep; the model has no term for a KV cache that limits the "
             "batch"),
    dict(name="four_gpu_h200x4/7b_tp2dp2, 7b_tp4 (no suffix)", why="failed runs (their _error.txt), no steps"),
    dict(name="four_gpu_h200x4_6/o_i40/lora_7b_lora, four_gpu_h100x4_4/call1/lora_7b_lora",
         why="LoRA: the model has no LoRA term (adapter-only update and sync)"),
    dict(name="four_gpu_h200x4_6/o_i40/lora_7b_full",
         why="no run.json kept (overrides only in rows_one_gpu.lora_7b); ran on one GPU beside other rows: not added "
             "in this pass"),
    dict(name="megatron_scale_h100/*",
         why="2026-11-25 code on H100: the 0.5B step (6.3 s) was 2.6x the next day's H200 run (2.46 s), more than "
             "the cards differ; the code changed in between (packed micro-batches, no reference onload)"),
    dict(name="four_gpu_h200x4_6/o_i41/reward_model, four_gpu_h100x4_4/call1/reward_model",
         why="each ran on one GPU while other rows ran on the host's other GPUs (reward_model.md, four_gpu_h100x4_4/"
             "README.md): generate took 2.07 s (H200) and 2.50 s (H100) for the 0.5B job that decoded in 0.99 s "
             "alone (scale_0.5b), the decode's host side (scheduler, launches) shared; the model has no term for "
             "other jobs on the host (predicted 0.50x and 0.43x of their steps)"),
    dict(name="megatron_scale_rope_off/*", why="an ablation with the fused RoPE kernel off; the model has no such knob"),
    dict(name="two_gpu_2026_11_24/*, two_gpu_direct/*",
         why="2026-11-24 code, 2-3 steps a run, before the direct copy and packed micro-batches; run.json keeps only "
             "the layout, not the job"),
    dict(name="moe_grpo/*",
         why="2026-11-25 code on H100 with fixed micro-batches of 8 and the local spec; its update set "
             "sequential_experts_efficiency (0.1), and its model's config is not kept in the repository"),
    dict(name="grpo_smollm2, rollout_graphs/*, peer_verl/*, pinned_grpo/*, one_gpu_sdpa/*, agent_loop/*",
         why="SmolLM2-135M with EOS (responses shorter than the cap, the model takes max_response_length decode "
             "steps), multi-turn agent or older code; not a shape the plan's table holds"),
]


def _records(path: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return [r for r in rows if "timing_s/step" in r]


def _files(prefix: str) -> tuple[str, str]:
    base = os.path.join(RES, prefix)
    if prefix.endswith("/"):
        metrics = os.path.join(base, "logs", "metrics.jsonl")
        if not os.path.exists(metrics):
            metrics = os.path.join(base, "metrics.jsonl")
        return metrics, os.path.join(base, "run.json")
    return base + "metrics.jsonl", base + "run.json"


def _overrides(run: dict[str, Any]) -> tuple[list[str], int]:
    words = run.get("overrides") or []
    if not words:
        command = run.get("command", "")
        words = command.split() if isinstance(command, str) else list(command)
    kept = [w for w in words if w.startswith(KEEP_PREFIXES) and not any(d in w for d in DROP)]
    gpus = run.get("gpus") or next((int(w.split("=")[1]) for w in words if w.startswith("trainer.n_gpus_per_node=")), 1)
    return kept, int(gpus)


def row_from(src: dict[str, Any]) -> dict[str, Any]:
    metrics, run_json = _files(src["prefix"])
    steps = _records(metrics)
    timed = steps[1:]
    overrides, gpus = _overrides(json.load(open(run_json)))
    overrides += src.get("extra", [])  # what the code of the day did without a key for it (the source's note)
    phases = {}
    for phase, keys in PHASES.items():
        values = [sum(r[k] for k in keys) for r in timed if all(isinstance(r.get(k), (int, float)) for k in keys)]
        if values:
            value = statistics.median(values)
            phases[phase] = round(value / 1e9 if phase == "sync_received_gb" else value, 3)
    if not phases.get("sync_received_gb"):
        phases.pop("sync_received_gb", None)
    return {"name": src["name"], "lease": src["lease"], "source": f"benchmarks/results/{src['prefix']}*, {src['note']}",
            "model": src["model"], "gpu": src["gpu"], "gpus": gpus, "steps_timed": len(timed),
            "step_s": round(statistics.median(r["timing_s/step"] for r in timed), 3), "phases_s": phases,
            "overrides": overrides}


def collect(path: str = CALIBRATION) -> dict[str, Any]:
    old = json.load(open(path))
    rows = [row_from(s) for s in SOURCES]
    out = {"what": old["what"].split(" Collected by")[0] + " Collected by benchmarks/plan_calibration.py collect; "
           "'lease' groups the rows for the hold-out fit.", "left_out": LEFT_OUT, "rows": rows}
    with open(path, "w") as f:
        f.write("{\n")
        f.write(f' "what": {json.dumps(out["what"])},\n "left_out": [\n')
        f.write(",\n".join("  " + json.dumps(x) for x in LEFT_OUT) + "\n ],\n \"rows\": [\n")
        f.write(",\n".join("  " + json.dumps(r) for r in rows) + "\n ]\n}\n")
    return out


# ----------------------------------------------------------------------------------------------------- accuracy
def load_rows(path: str = CALIBRATION) -> list[dict[str, Any]]:
    return json.load(open(path))["rows"]


def prepare(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Any, Any, Any]]:
    """Each row with its validated RunConfig, model shape and GPU (the slow part, done once)."""
    from hybridrl.config import load_config, validate
    from hybridrl.plan.model_shape import resolve
    from hybridrl.plan.step_time import gpu_named

    out = []
    for row in rows:
        overrides = [w.replace("=benchmarks/", f"={ROOT}/benchmarks/") for w in row["overrides"]]
        cfg = load_config(overrides + [f"trainer.n_gpus_per_node={row['gpus']}", "trainer.nnodes=1",
                                              "actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda"],
                          "grpo_trainer", None)
        run = validate(cfg, cuda_available=lambda: True, te_available=lambda: True)
        out.append((row, run, resolve(row["model"]), gpu_named(row["gpu"])))
    return out


def predict(prepared, costs=None) -> list[dict[str, float]]:
    from hybridrl.plan.step_time import Costs, step_seconds

    costs = costs or Costs()
    return [step_seconds(run, shape, gpu, costs) for _, run, shape, gpu in prepared]


def errors(prepared, costs=None) -> list[float]:
    return [p["step"] / row["step_s"] - 1 for (row, *_), p in zip(prepared, predict(prepared, costs))]


# Costs fields the fit moves (scalars, or the values of (hidden, value) tables)
FITTED = ("decode_step_s", "per_sequence_s", "allreduce_latency_s", "uncaptured_layer_s", "engine_wake_sleep_s",
          "wake_s_per_gpu_doubling", "train_mfu", "forward_mfu", "other_s")
# measured phase -> predicted key(s), each weighted as the step is
PHASE_FIT = {"generate": ("generate",), "gen": ("gen",), "update": ("update",), "old_log_prob": ("log_probs",)}


def _vector(costs) -> list[float]:
    v = []
    for name in FITTED:
        value = getattr(costs, name)
        v.extend([x for _, x in value] if isinstance(value, tuple) else [value])
    return v


def _costs(base, v: list[float]):
    changes, i = {}, 0
    for name in FITTED:
        value = getattr(base, name)
        if isinstance(value, tuple):
            changes[name] = tuple((h, v[i + k]) for k, (h, _) in enumerate(value))
            i += len(value)
        else:
            changes[name] = v[i]
            i += 1
    return replace(base, **changes)


def loss(prepared, costs) -> float:
    total = 0.0
    for (row, *_), p in zip(prepared, predict(prepared, costs)):
        total += math.log(p["step"] / row["step_s"]) ** 2
        ph = row.get("phases_s", {})
        for measured, keys in PHASE_FIT.items():
            m = ph.get(measured)
            if measured == "old_log_prob" and m is not None:
                m += ph.get("ref", 0.0)
            value = sum(p.get(k, 0.0) for k in keys)
            if m and value > 0:
                total += 0.5 * math.log(value / m) ** 2
    return total


def nelder_mead(f: Callable[[list[float]], float], x0: list[float], iters: int = 1500, step: float = 0.15) -> list[float]:
    """Minimise f over log-scaled positive parameters (each x = x0 * exp(u))."""
    n = len(x0)

    def g(u):
        return f([x * math.exp(min(max(ui, -5), 5)) for x, ui in zip(x0, u)])

    simplex = [[0.0] * n] + [[step if j == i else 0.0 for j in range(n)] for i in range(n)]
    values = [g(u) for u in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centroid = [sum(s[j] for s in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst)]
        fr = g(reflected)
        if fr < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            fe = g(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            fc = g(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (s - b) for b, s in zip(best, x)] for x in simplex[1:]]
                values = [values[0]] + [g(u) for u in simplex[1:]]
    u = simplex[min(range(n + 1), key=values.__getitem__)]
    return [x * math.exp(min(max(ui, -5), 5)) for x, ui in zip(x0, u)]


def fit(prepared, base=None, iters: int = 1500):
    from hybridrl.plan.step_time import Costs

    base = base or Costs()
    v = nelder_mead(lambda v: loss(prepared, _costs(base, v)), _vector(base), iters)
    return _costs(base, v)


def accuracy(out_json: str, iters: int) -> dict[str, Any]:
    from hybridrl.plan.step_time import Costs

    prepared = prepare(load_rows())
    preds = predict(prepared)
    table = []
    for (row, *_), p in zip(prepared, preds):
        table.append({"name": row["name"], "lease": row.get("lease", ""), "model": row["model"], "gpu": row["gpu"],
                      "gpus": row["gpus"], "measured_s": row["step_s"], "predicted_s": round(p["step"], 3),
                      "error": round(p["step"] / row["step_s"] - 1, 4),
                      "predicted_phases_s": {k: round(v, 3) for k, v in p.items() if k != "step"}})
    worst = max(table, key=lambda t: abs(t["error"]))
    # leave-one-lease-out: fit on the other leases' rows, the error on this lease's
    held = {}
    leases = sorted({row.get("lease", "") for row, *_ in prepared})
    for lease in leases:
        train = [p for p in prepared if p[0].get("lease", "") != lease]
        test = [p for p in prepared if p[0].get("lease", "") == lease]
        costs = fit(train, Costs(), iters)
        for (row, *_), e in zip(test, errors(test, costs)):
            held[row["name"]] = round(e, 4)
    for t in table:
        t["held_out_error"] = held.get(t["name"])
    all_fit = fit(prepared, Costs(), iters)
    fitted_errors = errors(prepared, all_fit)
    metrics = {"plan_step_time_error_max": round(abs(worst["error"]), 4),
               "plan_step_time_error_max_held_out": round(max(abs(e) for e in held.values()), 4),
               "plan_step_time_error_max_refit_all": round(max(abs(e) for e in fitted_errors), 4),
               "rows": len(table), "leases": len(leases)}
    result = {"command": "python benchmarks/plan_calibration.py accuracy", "device": "CPU (the model over measured "
              "H200/H100 rows)", "date": datetime.date.today().isoformat(), "metrics": metrics,
              "worst_row": worst["name"], "rows": table,
              "costs_committed": {f.name: getattr(Costs(), f.name) for f in fields(Costs) if f.name in FITTED},
              "costs_refit_all": {f.name: getattr(all_fit, f.name) for f in fields(Costs) if f.name in FITTED}}
    with open(out_json, "w") as f:
        json.dump(result, f, indent=1)
    _write_md(result, out_json[:-5] + ".md")
    return result


def _fmt(v) -> str:
    if isinstance(v, tuple):
        return ", ".join(f"{h}: {x:.3g}" for h, x in v)
    return f"{v:.3g}"


def _write_md(result: dict[str, Any], path: str) -> None:
    m = result["metrics"]
    lines = [f"# plan_accuracy: the plan's step-time model against measured GRPO steps ({result['date']})", "",
             f"`{result['command']}` over benchmarks/results/plan_calibration.json ({m['rows']} rows, {m['leases']} "
             "leases; the runs left out and why are in that file's `left_out`). Model: hybridrl/plan/step_time.py, "
             "Costs() as committed.", "",
             f"- **plan_step_time_error_max = {m['plan_step_time_error_max']:.3f}** ({result['worst_row']}); goal <= 0.2",
             f"- held out (leave-one-lease-out: the FITTED constants re-fitted on the other leases' rows, the error on "
             f"this lease's): max {m['plan_step_time_error_max_held_out']:.3f}",
             f"- re-fitted on every row: max {m['plan_step_time_error_max_refit_all']:.3f}", "",
             "| row | lease | model | GPUs | measured s | predicted s | error | held-out error |", "|---|---|---|---|---|---|---|---|"]
    for t in result["rows"]:
        lines.append(f"| {t['name']} | {t['lease']} | {t['model']} | {t['gpus']} x {t['gpu']} | {t['measured_s']:.2f} | "
                     f"{t['predicted_s']:.2f} | {t['error']:+.3f} | {t['held_out_error']:+.3f} |")
    lines += ["", "Fitted constants (Costs fields), committed against re-fitted on every row:", "",
              "| constant | committed | re-fit on all rows |", "|---|---|---|"]
    for name, value in result["costs_committed"].items():
        lines.append(f"| {name} | {_fmt(value)} | {_fmt(result['costs_refit_all'][name])} |")
    lines += ["", "The fit: Nelder-Mead on log-scaled constants, loss = squared log error of the step + half that of "
              "generate, gen, update and the log-prob passes where measured (benchmarks/plan_calibration.py). "
              "tests/unit/test_plan_accuracy.py recomputes every row's error from the committed calibration data "
              "and fails past 0.2."]
    open(path, "w").write("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("collect")
    a = sub.add_parser("accuracy")
    a.add_argument("--out", default=os.path.join(RES, "plan_accuracy.json"))
    a.add_argument("--iters", type=int, default=1500)
    s = sub.add_parser("errors", help="print each row's error with the committed constants")
    del s
    args = p.parse_args(argv)
    if args.cmd == "collect":
        rows = collect()["rows"]
        print(f"{len(rows)} rows -> {CALIBRATION}")
    elif args.cmd == "accuracy":
        r = accuracy(args.out, args.iters)
        print(json.dumps(r["metrics"]))
    else:
        prepared = prepare(load_rows())
        for (row, *_), p_, e in zip(prepared, predict(prepared), errors(prepared)):
            ph = row.get("phases_s", {})
            print(f"{row['name']:28s} meas {row['step_s']:6.2f} pred {p_['step']:6.2f} err {e:+.3f} | "
                  + " ".join(f"{k} {ph.get(k, float('nan')):.2f}/{p_.get(v, float('nan')):.2f}" for k, v in
                             (("generate", "generate"), ("gen", "gen"), ("update", "update"), ("old_log_prob", "log_probs"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
