"""Issue 37's GPU runs: fully async (2 GPUs train, 2 generate) vs colocated on 4 GPUs vs one-step-off (2 + 2), back to
back on one machine, on a job with long-tailed responses (SmolLM2 GRPO, responses up to 4k tokens, sampled EOS);
and the same three halved to two GPUs (colocated_2, one_step_off_1_1, fully_async_1_1), run first while only 1- and
2-GPU machines are lent.

    python benchmarks/async_rl.py list
    python benchmarks/async_rl.py run NAME [NAME ...] --model DIR --out DIR [--steps 20] [--max-time-s S]
                                  [--cap-s S] [--val-samples N]
    python benchmarks/async_rl.py report --gpus 4 --in-dir DIR --out benchmarks/results/async_rl.json
    python benchmarks/async_rl.py report --gpus 2 --in-dir DIR --out benchmarks/results/async_rl_2gpu.json
    python benchmarks/async_rl.py dry-run [NAME ...] --out DIR   # CPU: the rows on the demo model for 3 steps (gloo)

The report writes OUT and OUT with .md beside it. The 4-GPU runs report into async_rl.json/.md under the issue's
metric names; the 2-GPU runs into their own files, async_rl_2gpu.json/.md, whose metric names all end in `_2gpu`
(`async_vs_colocated_throughput_2gpu`, ...): a lease that collects one set never overwrites the other, and a 2-GPU
number can never be read as the issue's 4-GPU must-show.

Metrics (the issue's names; `_2gpu` appended for the halved runs):
- async_vs_colocated_throughput: tokens/s over the run's training steps (perf/total_num_tokens, prompt + response,
  summed over the steps, over the summed step seconds: timing_s/step, which holds the wait for generation; fully
  async also the weight push between steps, which its timing_s/step leaves out), fully async over colocated;
  one-step-off beside them (one_step_off_vs_colocated_throughput);
- async_val_gain_over_sync: (last - first validation score) of the fully async run over that of the colocated
  (on-policy) run after the same number of samples (steps x train_batch_size x rollout.n; both listed in the report:
  a run stopped by its time guard has fewer), with the async run's version lag beside it. With a few steps the
  gains are small and noisy: read them with the sample counts.
The .md also lists, next to the throughput table, fully async's staleness histogram, version lag, queue depth, each
side's idle time, one-step-off's staleness and overlap, the rollout-correction metrics of every run, and names any of
these the trainer did not log.

Sizing of the 2-GPU runs (runs.py knobs STEPS=3, VAL_SAMPLES=64, TRAIN_TIME_S=120, CAP_S=360), an estimate, nothing
measured yet at 4k tokens: colocated_2 ~240 s, one_step_off_1_1 ~215 s, fully_async_1_1 ~165 s, ~10.5 minutes of an
H200 for the three (~12 if every run compiles vLLM afresh). From: start-up 120 s on a machine's first run of a config,
~70-80 s after (grpo_smollm2.md, rollout_graphs.md, peer_verl.md); greedy validation of 64 problems ~20 s before and
after (most greedy answers loop to 4096 tokens: ~4096 decode steps of ~5 ms); steps of ~24 s (colocated_2), ~25 s
(one-step-off: one GPU's generation) and ~10-15 s (fully async) from a long tail of mean ~600 tokens (at 256 tokens
66% of the samples were cut off: an end-of-sequence rate of ~1/600 a token, so ~0.1% reach 4096), a decode step of
~4 ms + ~0.017 ms a sequence (four_gpu.md; SmolLM2's 512 sequences: 12.8 ms) and ~14 us a token for the update and
~7 us for the two log-prob passes (grpo_smollm2.md). Three steps are too few for the val gain to say much (the
256-token job's train score moved only after ~8 steps): the report gives it with its sample counts and a note when
the on-policy gain is below 0.01.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Optional

from runner import fresh_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARA = "actor_rollout_ref"
TRAIN_BATCH, ROLLOUT_N = 64, 8  # prompts a step x samples a prompt: the SmolLM2 job's
LONG_TAIL = ["data.max_response_length=4096", f"{ARA}.rollout.ignore_eos=false", f"{ARA}.rollout.temperature=1.0",
             f"data.train_batch_size={TRAIN_BATCH}", f"{ARA}.rollout.n={ROLLOUT_N}",
             f"{ARA}.actor.ppo_mini_batch_size=32", f"{ARA}.actor.use_dynamic_bsz=true",
             f"{ARA}.actor.ppo_max_token_len_per_gpu=16384", "trainer.val_before_train=true"]
ASYNC = ["async_training.enable=true", "async_training.require_batches=2", "async_training.staleness_threshold=0.5",
         "async_training.trigger_parameter_sync_step=1", "async_training.partial_rollout=true",
         "async_training.compute_prox_log_prob=true"]
MODES = {"colocated": (), "one_step_off": ("trainer.one_step_off_policy=true",), "fully_async": tuple(ASYNC)}
# the CPU demo (configs/demo.yaml): 32 prompts x 8 samples a step, one rollout process, at most two trainer ranks
CPU_DEMO = ["trainer.device=cpu", "trainer.plot=false", "trainer.test_freq=3", "data.max_response_length=4",
            f"{ARA}.rollout.n_gpus_per_node=1"]
CPU_BATCH, CPU_TRAINER_RANKS = 32, 2
STOP_GRACE_S = 90  # after SIGTERM at --cap-s: the trainer's own stop_grace_s (60 s) to finish its step, and exit


@dataclass(frozen=True)
class Run:
    name: str
    mode: str  # colocated | one_step_off | fully_async (MODES)
    train_gpus: int
    rollout_gpus: int = 0  # 0: the hybrid engine, generation on the training GPUs

    @property
    def gpus(self) -> int:
        return self.train_gpus + self.rollout_gpus

    def overrides(self) -> tuple[str, ...]:
        """The GPU layout and the mode's keys."""
        if not self.rollout_gpus:
            return (f"trainer.n_gpus_per_node={self.train_gpus}", *MODES[self.mode])
        return (f"{ARA}.hybrid_engine=false", f"{ARA}.rollout.n_gpus_per_node={self.rollout_gpus}",
                f"trainer.n_gpus_per_node={self.train_gpus}", f"{ARA}.rollout.calculate_log_probs=true",
                *MODES[self.mode])

    def cpu_overrides(self) -> tuple[str, ...]:
        """The same layout on the demo: at most two trainer ranks, one rollout process (CPU_DEMO), one mini-batch
        a step for fully async (the demo's 32 prompts are one ppo_mini_batch_size)."""
        ranks = f"trainer.n_gpus_per_node={min(self.train_gpus, CPU_TRAINER_RANKS)}"
        split = (f"{ARA}.hybrid_engine=false", f"{ARA}.rollout.calculate_log_probs=true") if self.rollout_gpus else ()
        mode = tuple(o.replace("require_batches=2", "require_batches=1") for o in MODES[self.mode])
        return (ranks, *split, *mode)


RUNS = {r.name: r for r in (
    Run("colocated_4", "colocated", 4),
    Run("one_step_off_2_2", "one_step_off", 2, 2),
    Run("fully_async_2_2", "fully_async", 2, 2),
    Run("colocated_2", "colocated", 2),
    Run("one_step_off_1_1", "one_step_off", 1, 1),
    Run("fully_async_1_1", "fully_async", 1, 1),
)}
SUFFIX = {4: "", 2: "_2gpu"}  # metric names of each machine size (the module's docstring says why)
RESULTS = {4: "async_rl.json", 2: "async_rl_2gpu.json"}


def runs_on(gpus: int) -> dict[str, Run]:
    """mode -> the run of that mode on `gpus` GPUs."""
    found = {r.mode: r for r in RUNS.values() if r.gpus == gpus}
    if sorted(found) != sorted(MODES):
        raise SystemExit(f"async_rl.py: no full set of runs on {gpus} GPUs (sets: {sorted(SUFFIX)})")
    return found


def command(run: Run, steps: int, folder: str, model: Optional[str], cpu: bool, *, max_time_s: Optional[float] = None,
            val_samples: Optional[int] = None) -> list[str]:
    """The trainer's command line; the GPU run validates after its last step (test_freq = steps; a stop by
    trainer.max_time_s validates too), so val/score has a first and a last value."""
    common = [f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={folder}",
              "trainer.logger=[console,jsonl]"]
    if cpu:  # the demo's tiny model and data
        return [sys.executable, "-m", "hybridrl.trainer.demo", "--out", folder, "--sft-steps", "20", *CPU_DEMO,
                *run.cpu_overrides(), f"trainer.total_training_steps={steps}"]
    guards = [*([f"trainer.max_time_s={max_time_s:g}"] if max_time_s else []),
              *([f"data.val_max_samples={val_samples}"] if val_samples else [])]
    return [sys.executable, "-m", "hybridrl.trainer.main_ppo", "--config-name", "grpo_smollm2_gsm8k",
            f"{ARA}.model.path={model}", *LONG_TAIL, *run.overrides(), *common, f"trainer.test_freq={steps}", *guards]


def run_rows(names: list[str], out: str, steps: int, model: Optional[str], cpu: bool, *,
             max_time_s: Optional[float] = None, val_samples: Optional[int] = None,
             cap_s: Optional[float] = None) -> None:
    os.makedirs(out, exist_ok=True)
    for name in names:
        folder = os.path.join(out, name)
        fresh_folder(folder)  # the trainer appends to metrics.jsonl: an earlier run's lines would mix in
        cmd = command(RUNS[name], steps, folder, model, cpu, max_time_s=max_time_s, val_samples=val_samples)
        with open(os.path.join(out, f"{name}.log"), "w") as log:
            code, capped = run_capped(cmd, log, cap_s)
        record = {"command": " ".join(cmd), "returncode": code, "capped": capped, "steps_asked": steps,
                  "samples_per_step": (CPU_BATCH if cpu else TRAIN_BATCH) * ROLLOUT_N, "gpus": RUNS[name].gpus}
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(record, f)
        said = brief(summary(folder, record)) if code == 0 or capped else f"see {name}.log"
        print(f"async_rl: {name} exit {code}: {'stopped at --cap-s, ' if capped else ''}{said}", flush=True)


def run_capped(cmd: list[str], log: Any, cap_s: Optional[float]) -> tuple[int, bool]:
    """The trainer in a process group of its own. Past cap_s it gets SIGTERM (it finishes the step in flight, logs
    it and stops, skipping the final validation), and its group SIGKILL STOP_GRACE_S later: a run slower than planned
    still ends with its steps' metrics written, and the next run gets the GPUs. (exit status, whether it was capped)"""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=_python_path()))
    try:
        return proc.wait(timeout=cap_s), False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the driver only: Ray's processes must live while it ends its step
    try:
        return proc.wait(timeout=STOP_GRACE_S), True
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        return proc.wait(), True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _python_path() -> str:
    """The repository first, then what the caller set (on the GPU host /tmp/site: vLLM, megatron-core, Ray)."""
    return os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)


# ------------------------------------------------------------------------------------------------ the report
def metrics_rows(folder: str) -> list[dict[str, Any]]:
    """The trainer's metrics.jsonl (the demo writes it under checkpoints/); a line cut short by a SIGKILL at the cap
    is left out."""
    for sub in ("checkpoints/logs", "logs"):
        path = os.path.join(folder, sub, "metrics.jsonl")
        if os.path.exists(path):
            return [row for row in map(_json_or_none, open(path)) if row is not None]
    return []


def _json_or_none(line: str) -> Optional[dict[str, Any]]:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def run_record(in_dir: str, name: str) -> dict[str, Any]:
    path = os.path.join(in_dir, f"{name}.json")
    return json.load(open(path)) if os.path.exists(path) else {}


def mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def per_step(train: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in train if key in r]


def step_seconds(row: dict[str, Any]) -> float:
    """A step's wall time: timing_s/step, which holds the weight push in every mode (fully async pushes between
    steps and counts it in the step after the push)."""
    return row.get("timing_s/step", 0.0)


# what the issue asks to see beside the throughput, by the mode that logs it (fully_async.py, async_queue.py,
# one_step_off.py, rollout_corr.py): missing ones are named in the report
ASYNC_KEYS = ("fully_async/version_lag/mean", "fully_async/version_lag/max", "fully_async/queue/depth",
              "fully_async/queue/in_flight", "timing_s/trainer_idle", "trainer/idle_ratio", "rollouter/idle_ratio",
              "timing_s/rollouter_sync_pause", "fully_async/dropped_stale_groups", "fully_async/partial/partial_ratio",
              "async/staleness")
ONE_STEP_OFF_KEYS = ("async/staleness", "async/overlapped_gen_s", "timing_s/trainer_idle", "trainer/idle_ratio",
                     "rollouter/idle_ratio")
STALE_CORRECTION = ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_eff_sample_size", "rollout_corr/kl",
                    "rollout_corr/ppl_ratio", "rollout_corr/log_ppl_abs_diff")
EXPECTED = {"colocated": (), "one_step_off": (*ONE_STEP_OFF_KEYS, *STALE_CORRECTION),
            "fully_async": (*ASYNC_KEYS, "fully_async/staleness_hist/0_syncs", *STALE_CORRECTION)}
HIST = "fully_async/staleness_hist/"
# timing_s/gen is the trainer's wait for generation in every mode; timing_s/generate the generation's own time
SHOWN = (*dict.fromkeys((*ASYNC_KEYS, *ONE_STEP_OFF_KEYS)), "timing_s/gen", "timing_s/generate", "timing_s/weight_push",
         *STALE_CORRECTION, "rollout_vs_actor/logprob_abs_diff_mean", "response_length/mean", "response_length/max",
         "response_length/clip_ratio")


def summary(folder: str, record: Optional[dict[str, Any]] = None, mode: Optional[str] = None) -> dict[str, Any]:
    """One run's numbers from its metrics.jsonl: throughput, validation, and the means over steps of SHOWN and of
    every rollout_corr/* and fully_async/staleness_hist/* key."""
    record = record or {}
    rows = metrics_rows(folder)
    train = [r for r in rows if "perf/total_num_tokens" in r]
    vals = [r["val/score"] for r in rows if "val/score" in r]
    seconds = sum(step_seconds(r) for r in train)
    per_step_samples = record.get("samples_per_step")
    keys = dict.fromkeys((*SHOWN, *sorted({k for r in train for k in r if k.startswith(("rollout_corr/", HIST))})))
    means = {k: mean(per_step(train, k)) for k in keys}
    # a step logs only the histogram's buckets up to its largest lag: a bucket it lacks held none of its samples
    hist_rows = [r for r in train if any(k.startswith(HIST) for k in r)]
    means.update({k: mean([r.get(k, 0.0) for r in hist_rows]) for k in keys if k.startswith(HIST)})
    response_tokens = sum(r["response_length/mean"] * per_step_samples for r in train
                          if per_step_samples and "response_length/mean" in r)
    tokens = sum(r["perf/total_num_tokens"] for r in train)
    return {"steps": len(train), "samples": len(train) * per_step_samples if per_step_samples else None,
            "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else None,
            "response_tokens_per_s": response_tokens / seconds if seconds and response_tokens else None,
            "val_first": vals[0] if vals else None, "val_last": vals[-1] if len(vals) >= 2 else None,
            "val_gain": vals[-1] - vals[0] if len(vals) >= 2 else None,
            "version_lag_mean": means["fully_async/version_lag/mean"],
            "version_lag_max": max(per_step(train, "fully_async/version_lag/max"), default=None),
            "queue_depth_max": max(per_step(train, "fully_async/queue/depth"), default=None),
            "means": means, "missing": [k for k in EXPECTED.get(mode, ()) if train and means.get(k) is None],
            "returncode": record.get("returncode"), "capped": record.get("capped")}


def brief(s: dict[str, Any]) -> str:
    """A run's line in the runner's output."""
    return ", ".join(f"{k} {_fmt(s[k])}" for k in ("steps", "samples", "tokens_per_s", "val_gain", "version_lag_mean"))


NOISE_GAIN = 0.01  # a val gain below this is a handful of the 64-256 test problems changing: the ratio says nothing


def ratio(x: Optional[float], y: Optional[float]) -> Optional[float]:
    return x / y if x is not None and y not in (None, 0) else None


def report(in_dir: str, gpus: int = 4) -> dict[str, Any]:
    """The issue's metrics over the runs of one machine size (names: SUFFIX)."""
    runs = runs_on(gpus)
    s = {r.name: summary(os.path.join(in_dir, r.name), run_record(in_dir, r.name), mode) for mode, r in runs.items()}
    a, o, c = (s[runs[m].name] for m in ("fully_async", "one_step_off", "colocated"))
    x = SUFFIX[gpus]
    notes = []
    if a["samples"] != c["samples"]:
        notes.append(f"the val gains are after different sample counts (fully async {a['samples']}, colocated "
                     f"{c['samples']}): a time guard or cap stopped one early")
    if c["val_gain"] is not None and abs(c["val_gain"]) < NOISE_GAIN:
        notes.append(f"the on-policy val gain {c['val_gain']:.4f} is below {NOISE_GAIN}: "
                     f"async_val_gain_over_sync{x} is noise at this many samples")
    return {"metrics": {f"async_vs_colocated_throughput{x}": ratio(a["tokens_per_s"], c["tokens_per_s"]),
                        f"one_step_off_vs_colocated_throughput{x}": ratio(o["tokens_per_s"], c["tokens_per_s"]),
                        f"async_val_gain_over_sync{x}": ratio(a["val_gain"], c["val_gain"]),
                        f"async_version_lag_mean{x}": a["version_lag_mean"],
                        f"async_val_samples{x}": a["samples"], f"sync_val_samples{x}": c["samples"]},
            "gpus": gpus, "runs": s, "notes": notes, "date": datetime.date.today().isoformat()}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def markdown(result: dict[str, Any]) -> str:
    """The .md beside the report's JSON: the metrics, then the throughput table and, next to it, the staleness,
    queue, idle and rollout-correction means of each run."""
    gpus, runs = result["gpus"], result["runs"]
    names = list(runs)
    lines = [f"# Issue 37: fully async vs colocated vs one-step-off on {gpus} GPUs ({result['date']})", "",
             "Generated by `benchmarks/async_rl.py report`; SmolLM2-135M GRPO, responses up to 4096 tokens with "
             "sampled EOS.", "", "| metric | value |", "| --- | --- |"]
    lines += [f"| `{k}` | {_fmt(v)} |" for k, v in result["metrics"].items()]
    lines += ["", *(f"Note: {n}." for n in result["notes"]), *([""] if result["notes"] else []),
              "## Throughput and validation", "",
              "tokens_per_s: perf/total_num_tokens (prompt + response) over the summed step seconds (timing_s/step, "
              "the wait for generation included; fully async: + the weight push between steps); samples: steps x "
              "train_batch_size x rollout.n; val: greedy, data.val_max_samples of the test set.", "",
              "| " + " | ".join(["", *names]) + " |", "|" + " --- |" * (len(names) + 1)]
    for key in ("steps", "samples", "seconds", "tokens_per_s", "response_tokens_per_s", "val_first", "val_last",
                "val_gain", "returncode", "capped"):
        lines.append(f"| {key} | " + " | ".join(_fmt(runs[n][key]) for n in names) + " |")
    lines += ["", "## Staleness, queue, idle time, rollout correction (means over steps)", "",
              "| " + " | ".join(["", *names]) + " |", "|" + " --- |" * (len(names) + 1)]
    logged = {k for n in names for k, v in runs[n]["means"].items() if v is not None}
    keys = [k for k in (*SHOWN, *sorted(k for k in logged if k.startswith(HIST))) if k in logged]
    lines += [f"| {k} | " + " | ".join(_fmt(runs[n]["means"].get(k)) for n in names) + " |" for k in keys]
    lines += ["", "Every rollout_corr/* key's mean is in the JSON (runs.NAME.means).",
              "version_lag_max / queue_depth_max (fully async): " + ", ".join(
        f"{n} {_fmt(runs[n]['version_lag_max'])} / {_fmt(runs[n]['queue_depth_max'])}" for n in names), ""]
    missing = {n: runs[n]["missing"] for n in names if runs[n]["missing"]}
    lines.append("Metrics the trainer did not log: " + ("; ".join(f"{n}: {', '.join(m)}" for n, m in missing.items())
                                                        if missing else "none") + ".")
    return "\n".join(lines) + "\n"


def write_report(in_dir: str, gpus: int, out: str) -> dict[str, Any]:
    result = report(in_dir, gpus)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(markdown(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["list", "run", "report", "dry-run"])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--out", default="/tmp/async_rl")
    parser.add_argument("--in-dir")
    parser.add_argument("--model")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-time-s", type=float, help="trainer.max_time_s: stop after the step past it, validate")
    parser.add_argument("--cap-s", type=float, help="a run's wall-clock cap: SIGTERM then, SIGKILL 90 s later")
    parser.add_argument("--val-samples", type=int, help="data.val_max_samples (default: the whole test set)")
    parser.add_argument("--gpus", type=int, choices=sorted(SUFFIX), default=4, help="report: which runs")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in RUNS]
    if unknown:
        parser.error(f"no run {unknown}; the runs: {', '.join(RUNS)}")
    if args.mode == "list":
        for r in RUNS.values():
            print(f"{r.name:18s} {r.gpus} GPUs  {' '.join(r.overrides())}")
    elif args.mode == "run":
        if not args.model:
            parser.error("run needs --model (SmolLM2-135M-Instruct's folder)")
        run_rows(args.names or list(RUNS), args.out, args.steps, args.model, cpu=False, max_time_s=args.max_time_s,
                 val_samples=args.val_samples, cap_s=args.cap_s)
    elif args.mode == "dry-run":
        names = args.names or list(RUNS)
        run_rows(names, args.out, 3, None, cpu=True)
        for gpus in sorted({RUNS[n].gpus for n in names}):
            print(json.dumps(report(args.out, gpus)["metrics"], indent=1))
    else:
        if not args.in_dir:
            parser.error("report needs --in-dir (the runs' --out)")
        print(json.dumps(write_report(args.in_dir, args.gpus, args.out)["metrics"], indent=1))


if __name__ == "__main__":
    main()
