"""Side-by-side table of verl 0.9.1 and hybridrl on the same GRPO jobs (the peer_* rows of benchmarks/runs.py).

    python benchmarks/peer_verl/report.py --runs OUT --out benchmarks/results/peer_verl.json   (+ the .md beside it)

Each run folder (peer_verl/rows.py's Train) holds the trainer's per-step metrics (verl's file logger: {"step", "data"} per line;
hybridrl's jsonl logger: flat records), command.txt, launched_at / first_metrics_at / ended_at (epoch seconds) and
gpu_mem_mib.txt (nvidia-smi samples every 0.5 s, the whole GPU: vLLM's pool and the trainer's memory together).

Per-phase seconds are medians over steps 2..N (step 1 carries warm-up on both sides). Phase keys (verl -> ours):
gen, old_log_prob, ref, update_actor, reward, adv and step have the same timing_s/ names on both sides. Weight
sync: verl times it as its own phase timing_s/update_weights (trainer -> vLLM weights and the engine's wake-up);
hybridrl's is timing_s/reshard, which is inside its timing_s/gen (ours_gen = reshard + generate + ...), so the
gen row compares unlike things and the step row is the comparison that counts. tokens/s/GPU is perf/throughput
(both: total tokens of the step / step time / GPUs). Start-up: launch to the first metrics line, less the first
step's time when that line is a training step (no validation before training), so it covers process start to
ready-to-train on both sides (hybridrl's own breakdown: timing_s/startup).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
from typing import Optional

JOBS = {"smol": "SmolLM2-135M-Instruct + gsm_symbolic", "1p5b": "random Qwen2-shaped 1.5B, full-length responses"}
PHASES = ["gen", "update_weights", "reshard", "old_log_prob", "ref", "reward", "adv", "update_actor", "step"]
# first and last training step of each, both trainers' names: "train_score first/last" in the table
LEARNING = {"train_score": "critic/score/mean", "kl_loss": "actor/kl_loss", "entropy": "actor/entropy",
            "response_length": "response_length/mean", "grad_norm": "actor/grad_norm"}
RATIO_NAME = {"smol": "step_time_vs_verl", "1p5b": "step_time_vs_verl_1.5b"}


def read_rows(path: str) -> list[dict]:
    """Flat metric records with "step", from either trainer's jsonl (verl nests them under "data")."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            if isinstance(rec.get("data"), dict):
                rec = {"step": rec.get("step"), **rec["data"]}
            rows.append(rec)
    return rows


_CONSOLE_STEP = re.compile(r"\bstep:(\d+) - (.*)$")
_NUMBER = re.compile(r"^(?:np\.\w+\()?(-?[0-9.eE+-]+|nan|inf)\)?$")


def read_verl_console(path: str) -> list[dict]:
    """verl's console logger lines (`step:N - key:value - ...`, run.sh's NAME.log) as records like the file
    logger's: the fallback when a run's metrics.jsonl did not come back from the GPU host."""
    rows = []
    with open(path, errors="replace") as f:
        for line in f:
            m = _CONSOLE_STEP.search(line.rstrip("\n"))
            if not m:
                continue
            rec: dict = {"step": int(m.group(1))}
            for item in m.group(2).split(" - "):
                key, _, text = item.partition(":")
                number = _NUMBER.match(text.strip())
                if key and number:
                    rec[key.strip()] = float(number.group(1))
            rows.append(rec)
    return rows


def val_score(rec: dict) -> Optional[float]:
    """The mean validation reward: val-core/<source>/reward/mean@1 (both trainers log it); val/score else."""
    # verl 0.9.1 logs the reward under val-aux/ (its val-core/ holds acc); hybridrl under val-core/
    keys = sorted(k for k in rec if k.startswith(("val-core/", "val-aux/")) and "/reward/mean@" in k)
    if keys:
        return float(rec[keys[0]])
    return float(rec["val/score"]) if "val/score" in rec else None


def val_acc(rec: dict) -> Optional[float]:
    keys = sorted(k for k in rec if k.startswith("val-aux/") and "/acc/mean@" in k)
    return float(rec[keys[0]]) if keys else None


def _read_float(path: str) -> Optional[float]:
    try:
        with open(path) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


def _median(xs: list[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def summarize(run_dir: str, trainer: str) -> dict:
    metrics_path = os.path.join(run_dir, "logs", "metrics.jsonl") if trainer == "ours" else \
        os.path.join(run_dir, "metrics.jsonl")
    console = os.path.abspath(run_dir) + ".log"  # run.sh's NAME.log beside the run's folder NAME
    from_console = trainer == "verl" and not os.path.exists(metrics_path) and os.path.exists(console)
    # the file logger's output was lost: its console twin has the same values
    rows = read_verl_console(console) if from_console else read_rows(metrics_path)
    if os.path.exists(metrics_path + ".2"):  # run.sh's PART 2: verl resumed from its last checkpoint
        rows += read_rows(metrics_path + ".2")
    # a resumed run repeats the steps after its last checkpoint: the first record of a step wins (the repeat is
    # the restart's warm-up step, and the first part ran in the same lease as the other trainer)
    by_step: dict = {}
    for r in rows:
        if "timing_s/step" in r:
            by_step.setdefault(r["step"], r)
    train = [by_step[k] for k in sorted(by_step)]
    vals = [(r, val_score(r)) for r in rows if val_score(r) is not None]
    tail = [r for r in train if r["step"] >= 2] or train
    out: dict = {"steps": len(train)}
    if from_console:
        out["metrics_from"] = os.path.basename(console)
    for p in PHASES:
        out[f"{p}_s"] = _median([float(r[f"timing_s/{p}"]) for r in tail if f"timing_s/{p}" in r])
    out["tokens_per_s_per_gpu"] = _median([float(r["perf/throughput"]) for r in tail if "perf/throughput" in r])
    if vals:
        out["val_score_before"] = vals[0][1]
        out["val_score_after"] = vals[-1][1] if len(vals) > 1 else None
        out["val_acc_before"], out["val_acc_after"] = val_acc(vals[0][0]), val_acc(vals[-1][0]) if len(vals) > 1 else None
        if out["val_score_after"] is not None:
            out["val_score_gain"] = out["val_score_after"] - out["val_score_before"]
    if train:  # how far each trainer's policy moved, beside how well it scores (learning speed, peer_verl.md)
        for key, metric in LEARNING.items():
            out[f"{key}_first"], out[f"{key}_last"] = train[0].get(metric), train[-1].get(metric)
    launched = _read_float(os.path.join(run_dir, "launched_at"))
    first = _read_float(os.path.join(run_dir, "first_metrics_at"))
    ended = _read_float(os.path.join(run_dir, "ended_at"))
    if launched is not None and first is not None:
        first_row = rows[0] if rows else {}
        out["startup_s"] = first - launched - float(first_row.get("timing_s/step", 0.0) if first_row in train else 0.0)
    if launched is not None and ended is not None:
        out["wall_s"] = ended - launched
        launched2, ended2 = (_read_float(os.path.join(run_dir, f"{n}.2")) for n in ("launched_at", "ended_at"))
        first2 = _read_float(os.path.join(run_dir, "first_metrics_at.2"))
        if launched2 is not None and ended2 is not None:  # the two parts' wall times; the restart's start-up
            out["wall_s"] += ended2 - launched2
            out["restarts"] = 1
            if first2 is not None:
                out["restart_startup_s"] = first2 - launched2
    startup_own = [r["timing_s/startup"] for r in rows if "timing_s/startup" in r]
    if startup_own:
        out["startup_own_s"] = float(startup_own[0])
    try:
        with open(os.path.join(run_dir, "gpu_mem_mib.txt")) as f:
            mem = [float(x) for x in f.read().split() if x.replace(".", "", 1).isdigit()]
        out["peak_gpu_mem_gib"] = max(mem) / 1024 if mem else None
    except OSError:
        out["peak_gpu_mem_gib"] = None
    allocated = [float(r["perf/max_memory_allocated_gb"]) for r in train if "perf/max_memory_allocated_gb" in r]
    if allocated:
        out["trainer_max_allocated_gb"] = max(allocated)
    for key in ("command", "device"):  # device.txt: the GPU's name (run.sh); pairs may come from different leases
        try:
            with open(os.path.join(run_dir, f"{key}.txt")) as f:
                out[key] = f.read().strip() or None
        except OSError:
            pass
    return out


def read_val_gens(run_dir: str) -> dict[int, dict[str, dict]]:
    """{step: {input text: record}} from trainer.validation_data_dir (both trainers write verl's {step}.jsonl)."""
    out: dict[int, dict[str, dict]] = {}
    d = os.path.join(run_dir, "val_gens")
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if name.endswith(".jsonl"):
            out[int(name[:-6])] = {r["input"]: r for r in read_rows_plain(os.path.join(d, name))}
    return out


def read_rows_plain(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def val_generation_check(verl_dir: str, ours_dir: str, rescore=None) -> Optional[dict]:
    """Greedy validation before training, prompt by prompt: the same model and prompts should give (nearly) the
    same outputs and scores on both sides. `rescore(output, gts)`: the shared reward applied to verl's outputs
    here, which separates "different generations" from "a different reward path" when the scores disagree.
    Also the learning-parity test: each side's val gain with its standard error (paired over prompts)."""
    verl, ours = read_val_gens(verl_dir), read_val_gens(ours_dir)
    if not verl or not ours:
        return None
    v0, o0 = verl[min(verl)], ours[min(ours)]
    common = sorted(set(v0) & set(o0))
    out: dict = {"prompts_verl": len(v0), "prompts_ours": len(o0), "prompts_matched": len(common)}
    if not common:
        return out
    out["identical_outputs_before"] = sum(v0[k]["output"] == o0[k]["output"] for k in common) / len(common)
    out["verl_score_before"] = statistics.fmean(float(v0[k]["score"]) for k in common)
    out["ours_score_before"] = statistics.fmean(float(o0[k]["score"]) for k in common)
    if rescore is not None:
        rescored = [float(rescore(v0[k]["output"], v0[k]["gts"])) for k in common]
        out["verl_outputs_rescored_before"] = statistics.fmean(rescored)
        # verl's own score of each output against the shared reward's: False means verl ran another reward
        out["reward_paths_agree"] = all(abs(a - float(v0[k]["score"])) < 1e-6 for a, k in zip(rescored, common))
    for side, gens in (("verl", verl), ("ours", ours)):
        if len(gens) < 2:
            continue
        first, last = gens[min(gens)], gens[max(gens)]
        keys = sorted(set(first) & set(last))
        gains = [float(last[k]["score"]) - float(first[k]["score"]) for k in keys]
        if len(gains) > 1:
            out[f"{side}_val_gain"] = statistics.fmean(gains)
            out[f"{side}_val_gain_se"] = statistics.stdev(gains) / len(gains) ** 0.5
    if "verl_val_gain" in out and "ours_val_gain" in out:
        se = (out["verl_val_gain_se"] ** 2 + out["ours_val_gain_se"] ** 2) ** 0.5
        out["gain_difference"] = out["ours_val_gain"] - out["verl_val_gain"]
        # parity: hybridrl's gain is not below verl's by more than two standard errors of the difference
        out["learning_parity"] = out["gain_difference"] >= -2 * se
    return out


def shared_rescore():
    """reward.py's compute_score on the SmolLM2 job's data source, or None where hybridrl is not importable."""
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("peer_reward", os.path.join(os.path.dirname(__file__), "reward.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except ImportError:
        return None

    def rescore(output: str, gts) -> float:
        r = mod.compute_score("openai/gsm8k", output, gts)
        return r["score"] if isinstance(r, dict) else r
    return rescore


def compare(runs: str) -> dict:
    """{job: {"verl": summary, "ours": summary}} for the jobs whose both runs exist, plus the headline ratios."""
    table: dict = {}
    for job in JOBS:
        pair = {}
        for trainer in ("verl", "ours"):
            d = os.path.join(runs, f"{trainer}_{job}")
            try:
                pair[trainer] = summarize(d, trainer)
            except FileNotFoundError as e:
                pair[trainer] = {"missing": str(e)}
        check = val_generation_check(os.path.join(runs, f"verl_{job}"), os.path.join(runs, f"ours_{job}"),
                                     shared_rescore() if job == "smol" else None)
        if check:
            pair["val_generations"] = check
        table[job] = pair
    headline = {}
    for job, pair in table.items():
        v, o = pair["verl"].get("step_s"), pair["ours"].get("step_s")
        headline[RATIO_NAME[job]] = o / v if v and o else None
        check = pair.get("val_generations") or {}
        if "learning_parity" in check and check.get("reward_paths_agree", True):
            headline[f"learning_parity_{job}"] = check["learning_parity"]
    rows = spread(runs, {f"{t}_smol": table["smol"][t] for t in ("verl", "ours") if "missing" not in table["smol"][t]})
    verdict = spread_parity(rows, (table["smol"].get("val_generations") or {}).get("verl_val_gain_se"))
    if verdict is not None and "learning_parity_smol" in headline:
        # several hybridrl runs that differ only in data order measure its run-to-run noise: they decide
        headline["learning_parity_smol_single_pair"] = headline["learning_parity_smol"]
        headline["learning_parity_smol"] = verdict
    return {"headline": headline, "jobs": table, "spread": rows}


DATA_ORDER_KEYS = {"data.seed", "data.train_files", "data.shuffle"}


def spread_parity(rows: list[dict], verl_se: Optional[float], verl_name: str = "verl_smol",
                  ours_name: str = "ours_smol") -> Optional[bool]:
    """Parity against hybridrl's own spread: verl's val gain within two standard deviations (hybridrl's run-to-run
    sd over runs that differ from ours_smol only in data order, and verl's standard error) of their mean; None
    with fewer than three such runs."""
    verl = [r["val_score_gain"] for r in rows if r["run"] == verl_name and r["val_score_gain"] is not None]
    ours = [r["val_score_gain"] for r in rows if r["run"].startswith(ours_name) and r["val_score_gain"] is not None
            and all(d.split("=", 1)[0] in DATA_ORDER_KEYS for d in r["differs"])]
    if not verl or len(ours) < 3:
        return None
    sd = (statistics.stdev(ours) ** 2 + (verl_se or 0.0) ** 2) ** 0.5
    return verl[0] - statistics.mean(ours) <= 2 * sd


RUN_PATH_KEYS = {"actor_rollout_ref.model.path", "trainer.default_local_dir", "trainer.validation_data_dir",
                 "trainer.experiment_name"}  # where a run wrote, and the model cache's folder: not a setting
SPREAD_KEYS = ["val_score_gain", "train_score_last", "kl_loss_last", "entropy_last", "response_length_last"]


def spread(runs: str, summarized: dict[str, dict], verl_name: str = "verl_smol", ours_name: str = "ours_smol") -> list[dict]:
    """verl's SmolLM2 run beside every hybridrl one (ours_smol and run.sh's ours_smol_* variants: other data
    orders, verl's order, diagnosis overrides), each with the overrides that set it apart from ours_smol.
    `summarized`: runs compare() has read already, by folder name."""
    base = os.path.join(runs, ours_name)
    found = os.listdir(runs) if os.path.isdir(runs) else []
    names = [verl_name, ours_name] + sorted(n for n in found if n.startswith(ours_name + "_")
                                            and os.path.isdir(os.path.join(runs, n)))
    try:
        with open(os.path.join(base, "command.txt")) as f:
            base_args = set(f.read().split())
    except OSError:
        base_args = set()
    rows = []
    for name in names:
        summary = summarized.get(name)
        if summary is None:
            try:
                summary = summarize(os.path.join(runs, name), "verl" if name.startswith("verl") else "ours")
            except FileNotFoundError:
                continue
        args = summary.get("command", "").split()
        differs = [a for a in args if "=" in a and a not in base_args and a.split("=", 1)[0] not in RUN_PATH_KEYS] \
            if name.startswith(ours_name + "_") else []
        rows.append({"run": name, "differs": differs, **{k: summary.get(k) for k in SPREAD_KEYS}})
    return rows if len(rows) > 2 else []


def _fmt(x, digits=3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def markdown(result: dict, device: str) -> str:
    lines = ["# verl 0.9.1 vs hybridrl: the same GRPO job on the same GPU", "",
             f"Device: {device}. Medians over steps 2..N; ratio = hybridrl / verl (below 1: hybridrl is faster).", ""]
    for name, value in result["headline"].items():
        lines.append(f"- **{name}** = {_fmt(value)}")
    rows = [(f"{p} (s/step)", f"{p}_s") for p in PHASES] + [
        ("tokens/s/GPU", "tokens_per_s_per_gpu"), ("peak GPU memory (GiB, nvidia-smi)", "peak_gpu_mem_gib"),
        ("start-up (s)", "startup_s"), ("wall (s)", "wall_s"), ("steps", "steps"),
        ("val score before", "val_score_before"), ("val score after", "val_score_after"),
        ("val score gain", "val_score_gain"), ("val acc before", "val_acc_before"), ("val acc after", "val_acc_after"),
    ] + [(f"{key.replace('_', ' ')} {end}", f"{key}_{end}") for key in LEARNING for end in ("first", "last")]
    for job, pair in result["jobs"].items():
        check = pair.get("val_generations")
        if check:
            lines += ["", f"Validation generations, {JOBS[job]} (greedy, prompt by prompt): "
                      + ", ".join(f"{k} {_fmt(v)}" for k, v in check.items())]
            if check.get("reward_paths_agree") is False:
                lines += ["", "**The two trainers did not use the same reward**: verl's scores of its own outputs "
                          "differ from the shared reward function's, so the learning comparison is not valid."]
    for job, pair in result["jobs"].items():
        lines += ["", f"## {JOBS[job]}", ""]
        devices = {pair[t].get("device") for t in ("verl", "ours")} - {None}
        if devices:
            lines += [f"Device: {' / '.join(sorted(devices))}" + (" (**the two runs used different GPUs**)"
                                                                   if len(devices) > 1 else ""), ""]
        lines += ["| metric | verl (FSDP) | hybridrl (Megatron) | hybridrl / verl |", "| --- | --- | --- | --- |"]
        for label, key in rows:
            v, o = pair["verl"].get(key), pair["ours"].get(key)
            ratio = o / v if isinstance(v, (int, float)) and isinstance(o, (int, float)) and v else None
            if v is None and o is None:
                continue
            lines.append(f"| {label} | {_fmt(v)} | {_fmt(o)} | {_fmt(ratio) if key.endswith('_s') else ''} |")
        for trainer in ("verl", "ours"):
            if "command" in pair[trainer]:
                lines += ["", f"{trainer}: `{pair[trainer]['command']}`"]
            if "metrics_from" in pair[trainer]:
                lines += ["", f"{trainer}: metrics read from its console log {pair[trainer]['metrics_from']} "
                          "(metrics.jsonl did not come back)"]
            if "missing" in pair[trainer]:
                lines += ["", f"{trainer}: no run ({pair[trainer]['missing']})"]
    if result.get("spread"):
        lines += ["", "## SmolLM2 learning: verl's run beside every hybridrl run", "",
                  "| run | overrides beyond ours_smol | " + " | ".join(k.replace("_", " ") for k in SPREAD_KEYS) + " |",
                  "| --- | --- |" + " --- |" * len(SPREAD_KEYS)]
        for r in result["spread"]:
            lines.append(f"| {r['run']} | {' '.join(r['differs']) or '-'} | "
                         + " | ".join(_fmt(r[k]) for k in SPREAD_KEYS) + " |")
    lines += ["", "Phase mapping (verl -> hybridrl): see benchmarks/peer_verl/report.py's docstring and "
              "benchmarks/peer_verl/README.md.", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ issue 34 (--megatron)
# (metric, hybridrl's run, verl's run, what): run.sh's mode names; each trainer with its best settings (settings.py)
MEGATRON_PAIRS = [
    ("step_time_vs_verl_megatron_1.5b", "ours_best_1p5b", "verl_megatron_1p5b", "random Qwen2.5-1.5B, one GPU"),
    ("step_time_vs_verl_megatron_7b", "ours_7b", "verl_megatron_7b", "random Qwen2.5-7B, one GPU"),
    ("step_time_vs_verl_megatron_7b_4gpu", "ours_7b_4gpu", "verl_megatron_7b_4gpu",
     "random Qwen2.5-7B, 4 GPUs: tp2 x dp2 training, vLLM tp2 x dp2"),
    ("step_time_vs_verl_fsdp_7b_4gpu", "ours_7b_4gpu", "verl_7b_4gpu",
     "random Qwen2.5-7B, 4 GPUs: hybridrl tp2 x dp2 vs verl's FSDP over 4, vLLM tp2 x dp2 on both"),
    ("step_time_vs_verl_megatron_smol", "ours_best_smol", "verl_megatron_smol", "SmolLM2-135M-Instruct + gsm_symbolic"),
]
TARGET = 0.8  # issue 34: each step_time_vs_verl_megatron_* at most this
# the phase table: (label, summary key); weight sync is verl's own phase and inside hybridrl's gen (reshard)
PHASE_ROWS = [("step (s)", "step_s"), ("gen (s; hybridrl's includes its weight sync)", "gen_s"),
              ("weight sync (s; verl update_weights, hybridrl reshard)", "sync_s"),
              ("old log-probs (s)", "old_log_prob_s"), ("ref log-probs (s)", "ref_s"), ("update (s)", "update_actor_s"),
              ("reward + adv (s)", "reward_adv_s"), ("tokens/s/GPU", "tokens_per_s_per_gpu"), ("start-up (s)", "startup_s"),
              ("peak GPU memory (GiB, fullest GPU, nvidia-smi)", "peak_gpu_mem_gib"), ("steps", "steps"),
              ("wall (s)", "wall_s")]
FAILURE = re.compile(r"(Error|Exception|Traceback|OutOfMemory|out of memory|Killed|NameError|CUDA error|rc=\d)")


def failure_excerpt(runs: str, name: str, lines: int = 8) -> list[str]:
    """The last lines of a run's log (run.sh's NAME.log) that name an error: why a run gave no metrics."""
    path = os.path.join(runs, f"{name}.log")
    try:
        with open(path, errors="replace") as f:
            text = f.read().splitlines()
    except OSError:
        return []
    hits = [ln.strip()[:300] for ln in text if FAILURE.search(ln) and "warn" not in ln.lower()]
    return hits[-lines:]


def _with_derived(summary: dict, trainer: str) -> dict:
    out = dict(summary)
    out["sync_s"] = summary.get("update_weights_s") if trainer == "verl" else summary.get("reshard_s")
    parts = [summary.get("reward_s"), summary.get("adv_s")]
    out["reward_adv_s"] = sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None
    return out


def compare_megatron(runs: str) -> dict:
    pairs, headline, failures = {}, {}, {}
    for metric, ours_name, verl_name, what in MEGATRON_PAIRS:
        pair: dict = {"what": what, "ours_run": ours_name, "verl_run": verl_name}
        for trainer, name in (("ours", ours_name), ("verl", verl_name)):
            try:
                pair[trainer] = _with_derived(summarize(os.path.join(runs, name), trainer), trainer)
                if not pair[trainer].get("steps"):
                    pair[trainer]["failure"] = failure_excerpt(runs, name)
            except FileNotFoundError as e:
                pair[trainer] = {"missing": str(e), "failure": failure_excerpt(runs, name)}
            if pair[trainer].get("failure"):
                failures[name] = pair[trainer]["failure"]
        o, v = pair["ours"].get("step_s"), pair["verl"].get("step_s")
        headline[metric] = o / v if o and v else None
        if metric.startswith("step_time_vs_verl_megatron_") and metric != "step_time_vs_verl_megatron_smol":
            headline[f"{metric}_meets_{TARGET}"] = headline[metric] <= TARGET if headline[metric] is not None else None
        pairs[metric] = pair
    # learning parity on SmolLM2 against verl's Megatron backend, judged against hybridrl's own spread
    check = val_generation_check(os.path.join(runs, "verl_megatron_smol"), os.path.join(runs, "ours_best_smol"),
                                 shared_rescore())
    rows = spread(runs, {}, verl_name="verl_megatron_smol", ours_name="ours_best_smol")
    if check:
        pairs["step_time_vs_verl_megatron_smol"]["val_generations"] = check
        if "learning_parity" in check and check.get("reward_paths_agree", True):
            headline["learning_parity_smol_megatron_single_pair"] = check["learning_parity"]
    verdict = spread_parity(rows, (check or {}).get("verl_val_gain_se"), "verl_megatron_smol", "ours_best_smol")
    if verdict is not None:
        headline["learning_parity_smol_megatron"] = verdict
    return {"headline": headline, "pairs": pairs, "spread": rows, "failures": failures}


def markdown_megatron(result: dict, device: str) -> str:
    lines = ["# verl 0.9.1's Megatron backend vs hybridrl: the same GRPO jobs (issue 34)", "",
             f"Device: {device}. Medians over steps 2..N; ratio = hybridrl / verl (below 1: hybridrl is faster). "
             f"Target: each step_time_vs_verl_megatron_* <= {TARGET}. Settings: benchmarks/peer_verl/settings.py "
             "(each trainer's best documented settings; what verl could not use is in its README).", ""]
    for name, value in result["headline"].items():
        lines.append(f"- **{name}** = {_fmt(value)}")
    for metric, pair in result["pairs"].items():
        lines += ["", f"## {pair['what']} ({metric})", ""]
        devices = {pair[t].get("device") for t in ("verl", "ours")} - {None}
        if devices:
            lines += [f"Device: {' / '.join(sorted(devices))}" + (" (**the two runs used different GPUs**)"
                                                                   if len(devices) > 1 else ""), ""]
        lines += [f"| phase | verl ({pair['verl_run']}) | hybridrl ({pair['ours_run']}) | hybridrl / verl |",
                  "| --- | --- | --- | --- |"]
        for label, key in PHASE_ROWS:
            v, o = pair["verl"].get(key), pair["ours"].get(key)
            if v is None and o is None:
                continue
            ratio = o / v if isinstance(v, (int, float)) and isinstance(o, (int, float)) and v else None
            lines.append(f"| {label} | {_fmt(v)} | {_fmt(o)} | {_fmt(ratio)} |")
        check = pair.get("val_generations")
        if check:
            lines += ["", "Validation generations (greedy, prompt by prompt): "
                      + ", ".join(f"{k} {_fmt(v)}" for k, v in check.items())]
        for trainer in ("verl", "ours"):
            side = pair[trainer]
            if "missing" in side or side.get("failure"):
                lines += ["", f"{pair[trainer + '_run']}: **no timed steps**"
                          + (f" ({side['missing']})" if "missing" in side else "") + ". Log lines naming the error:"]
                lines += [f"    {ln}" for ln in side.get("failure") or ["(none found; see the run's log)"]]
            if "command" in side:
                lines += ["", f"{pair[trainer + '_run']}: `{side['command']}`"]
    if result.get("spread"):
        lines += ["", "## SmolLM2 learning: verl's Megatron run beside every hybridrl run", "",
                  "| run | overrides beyond ours_best_smol | " + " | ".join(k.replace("_", " ") for k in SPREAD_KEYS)
                  + " |", "| --- | --- |" + " --- |" * len(SPREAD_KEYS)]
        for r in result["spread"]:
            lines.append(f"| {r['run']} | {' '.join(r['differs']) or '-'} | "
                         + " | ".join(_fmt(r[k]) for k in SPREAD_KEYS) + " |")
    lines += ["", "Phase mapping: benchmarks/peer_verl/report.py's docstring; runs and settings: "
              "benchmarks/peer_verl/README.md.", ""]
    return "\n".join(lines)


def main_megatron(args) -> None:
    result = compare_megatron(args.runs)
    per_run = sorted({p[t]["device"] for p in result["pairs"].values() for t in ("verl", "ours") if p[t].get("device")})
    device = args.device or (" / ".join(per_run) if per_run else "unknown")
    commands = [p[t]["command"] for p in result["pairs"].values() for t in ("verl", "ours") if "command" in p[t]]
    record = {"command": " ; ".join(dict.fromkeys(commands)), "device": device,
              "date": datetime.date.today().isoformat(),
              "metrics": {**result["headline"], "pairs": result["pairs"], "smol_learning_spread": result["spread"],
                          "failures": result["failures"]}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    md = markdown_megatron(result, device)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(md)
    print(md)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, help="run.sh's $OUT: verl_smol/, ours_smol/, verl_1p5b/, ours_1p5b/")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default=None)
    ap.add_argument("--megatron", action="store_true",
                    help="issue 34's table (verl's Megatron and FSDP backends vs hybridrl's best settings)")
    args = ap.parse_args(argv)
    if args.megatron:
        main_megatron(args)
        return
    result = compare(args.runs)
    device = args.device
    per_run = sorted({p[t]["device"] for p in result["jobs"].values() for t in ("verl", "ours") if p[t].get("device")})
    if device is None and per_run:
        device = " / ".join(per_run)
    if device is None:
        try:
            import torch

            device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        except ImportError:
            device = "unknown"
    commands = [p[t]["command"] for p in result["jobs"].values() for t in ("verl", "ours") if "command" in p[t]]
    record = {"command": " ; ".join(commands), "device": device, "date": datetime.date.today().isoformat(),
              "metrics": {**result["headline"], "jobs": result["jobs"], "smol_learning_spread": result["spread"]}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    md = markdown(result, device)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
