"""Issue 42's GPU run: GRPO with a 0.5B-shaped reward model on one GPU, the reward model's time and memory against
`hybridrl plan`.

    python benchmarks/reward_model_bench.py models --dir DIR [--shape 0.5b]     # policy + reward model, random weights
    python benchmarks/reward_model_bench.py run --models DIR --out RUN [--steps 6]
    python benchmarks/reward_model_bench.py report --in-dir RUN --out benchmarks/results/reward_model.json
    python benchmarks/reward_model_bench.py dry-run --out DIR                  # CPU: all three on the tiny shape, 3 steps

The policy is multi_gpu_bench's Qwen2 shape (random weights, the demo's tokenizer and arithmetic data); the reward
model is a Qwen2ForSequenceClassification of the same shape (num_labels=1, random head) with the same tokenizer, so
samples are scored as the policy's tokens (no re-rendering). `run` writes RUN/plan.json (`hybridrl plan --json` for
the same overrides, --reward-model-config the reward model), RUN/run.json and the trainer's RUN/logs/metrics.jsonl.

Metrics (the issue's names first; timings are medians over steps 2..N, step 1 carries start-up effects):
  rm_seconds_per_step        timing_s/reward_model: the reward model's part of the reward (inputs, the workers'
                             onload + forward + offload)
  rm_share_of_step           per step rm / timing_s/step, the median
  reward_peak_bytes          max memory/reward_peak_bytes (device memory resident when the reward model's call starts
                             plus its rise in allocated bytes: onloaded weights + forward)
  plan_reward_bytes          phases.reward.total of the plan
  reward_measured_over_plan  reward_peak_bytes / plan_reward_bytes (the issue: within 1.15)
  {train,rollout,ref}_peak_bytes, plan_*_bytes, *_measured_over_plan    each measured phase against its own plan
                             phase (hybridrl/plan/report.py pairs them): train ~ the largest of train_actor,
                             train_actor_onload, actor_step; rollout ~ rollout; ref ~ ref_log_prob
  peak_measured_over_plan    the largest measured peak / the plan's peak total (a phase over its plan can hide here)
  cache_held_bytes           max over steps and phases of the allocator's cache that empty_cache could not return,
                             inside every measured peak and in no plan component (memory/*_cache_held_bytes, and the
                             rollout's reserved - allocated)
Step 1 runs before the optimizer's state exists (Adam's moments come with the first update), so the maxima are
steps 2..N's. `dry-run` checks the whole path here on CPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ARA = "actor_rollout_ref"
# measured peak -> its metric; the plan phase each is compared with is plan_totals'
PEAKS = {"train": "memory/train_peak_bytes", "rollout": "memory/rollout_used_bytes", "reward": "memory/reward_peak_bytes",
         "ref": "memory/ref_peak_bytes"}
HELD = ("memory/train_cache_held_bytes", "memory/ref_cache_held_bytes", "memory/reward_cache_held_bytes")


def make_models(folder: str, shape: str) -> tuple[str, str]:
    """(policy dir, reward model dir) under `folder`, built when missing."""
    import torch
    from multi_gpu_bench import COMMON, SHAPES, make_model
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    policy, rm = os.path.join(folder, "policy"), os.path.join(folder, "rm")
    if not os.path.isfile(os.path.join(policy, "config.json")):
        make_model(policy, shape)
    if not os.path.isfile(os.path.join(rm, "config.json")):
        tok = AutoTokenizer.from_pretrained(policy)
        cuda = torch.cuda.is_available() and shape != "tiny"
        torch.manual_seed(1)
        config = Qwen2Config(**SHAPES[shape], **COMMON, num_labels=1, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
        with torch.device("cuda" if cuda else "cpu"):
            model = Qwen2ForSequenceClassification(config)
        model.to(torch.bfloat16 if cuda else torch.float32).save_pretrained(rm)
        tok.save_pretrained(rm)
        print(f"reward model: Qwen2ForSequenceClassification {shape} shape, "
              f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, in {rm}", flush=True)
    return policy, rm


def overrides(policy: str, rm: str, out: str, steps: int, cpu: bool) -> list[str]:
    prompts, n, resp = (4, 4, 16) if cpu else (16, 8, 256)
    device = ["trainer.device=cpu", f"{ARA}.rollout.name=torch"] if cpu else ["trainer.device=cuda",
                                                                              f"{ARA}.rollout.name=vllm"]
    return ["--config-name", "grpo_trainer", f"{ARA}.model.path={policy}", f"data.train_files={policy}/data/train.parquet",
            f"data.val_files={policy}/data/test.parquet", "data.max_prompt_length=64", f"data.max_response_length={resp}",
            f"data.train_batch_size={prompts}", f"{ARA}.actor.ppo_mini_batch_size={prompts}", f"{ARA}.rollout.n={n}",
            f"{ARA}.rollout.ignore_eos=true", f"{ARA}.model.use_remove_padding=true", f"{ARA}.actor.use_dynamic_bsz=true",
            f"{ARA}.actor.ppo_max_token_len_per_gpu=16384", f"{ARA}.rollout.gpu_memory_utilization=0.4",
            f"{ARA}.rollout.tensor_model_parallel_size=1", "trainer.n_gpus_per_node=1", *device,
            f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", "trainer.save_freq=-1",
            "trainer.val_before_train=false", "trainer.logger=[console,jsonl]", "trainer.progress_bar=false",
            f"trainer.default_local_dir={out}", "reward_model.enable=true", f"reward_model.model.path={rm}",
            "reward_model.micro_batch_size_per_gpu=16", "reward_model.model.input_tokenizer=null"]


def card_gib(cpu: bool) -> float:
    """GPU 0's memory in GiB: the plan must be for the card the run measures on (an 80 GiB plan against an H200's
    vLLM share, gpu_memory_utilization of 140 GiB, put the rollout phase at 1.63x its plan on 2026-11-28)."""
    if cpu:
        return 80.0
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30


def run(models: str, out: str, steps: int, cpu: bool, gpu_mem_gb: float) -> int:
    policy, rm = os.path.join(models, "policy"), os.path.join(models, "rm")
    if os.path.exists(out) and os.listdir(out):
        print(f"run: {out} is not empty; give a fresh --out", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    args = overrides(policy, rm, out, steps, cpu)
    gpu_mem_gb = gpu_mem_gb or card_gib(cpu)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    plan = subprocess.run([sys.executable, "-m", "hybridrl", "plan", *args, "--json", "--gpu-mem-gb", str(gpu_mem_gb),
                           "--reward-model-config", rm], cwd=ROOT, env=env, capture_output=True, text=True)
    with open(os.path.join(out, "plan.json"), "w") as f:
        f.write(plan.stdout)
    command = [sys.executable, "-m", "hybridrl.trainer.main_ppo", *args]
    with open(os.path.join(out, "run.json"), "w") as f:
        json.dump({"command": " ".join(command), "cpu": cpu, "device": "cpu" if cpu else _device(),
                   "gpu_memory_gib": gpu_mem_gb, "plan_rc": plan.returncode}, f, indent=1)
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def summarize(folder: str) -> dict[str, Any]:
    from scale_report import median_of, read_steps

    steps = read_steps(os.path.join(folder, "logs", "metrics.jsonl"))
    plan = json.load(open(os.path.join(folder, "plan.json")))
    timed = steps[1:] or steps
    out: dict[str, Any] = {"steps": len(steps), "rm_seconds_per_step": median_of(timed, "timing_s/reward_model"),
                           "step_s_median": median_of(timed, "timing_s/step"),
                           "reward_s_median": median_of(timed, "timing_s/reward")}
    shares = [r["timing_s/reward_model"] / r["timing_s/step"] for r in timed
              if r.get("timing_s/reward_model") and r.get("timing_s/step")]
    out["rm_share_of_step"] = statistics.median(shares) if shares else None
    measured = {k: _max(steps, key) for k, key in PEAKS.items()}
    planned = plan_totals(plan.get("phases") or {})
    out["reward_peak_bytes"] = measured["reward"]
    out["plan_reward_bytes"] = planned["reward"]
    out["reward_measured_over_plan"] = _ratio(measured["reward"], planned["reward"])
    for name in ("train", "rollout", "ref"):
        out[f"{name}_peak_bytes"] = measured[name]
        out[f"plan_{name}_bytes"] = planned[name]
        out[f"{name}_measured_over_plan"] = _ratio(measured[name], planned[name])
    peak = max((v for v in measured.values() if v), default=None)
    out["plan_peak_bytes"] = (plan.get("peak") or {}).get("bytes")
    out["peak_measured_over_plan"] = _ratio(peak, out["plan_peak_bytes"])
    rollout_held = [r["memory/rollout_torch_reserved_bytes"] - r["memory/rollout_torch_allocated_bytes"] for r in steps
                    if "memory/rollout_torch_reserved_bytes" in r and "memory/rollout_torch_allocated_bytes" in r]
    held = [v for v in [*(_max(steps, key) for key in HELD), *rollout_held] if v is not None]
    out["cache_held_bytes"] = max(held) if held else None
    out["measured_peaks_bytes"] = measured
    return out


def plan_totals(phases: dict[str, Any]) -> dict[str, Optional[int]]:
    """The plan's total for each measured peak (PEAKS), None where the plan has no such phase."""
    from hybridrl.plan.report import update_peak_total

    def total(name: str) -> Optional[int]:
        return (phases.get(name) or {}).get("total")

    return {"train": update_peak_total(phases), "rollout": total("rollout"), "reward": total("reward"),
            "ref": total("ref_log_prob")}


def _max(steps: list[dict[str, Any]], key: str) -> Optional[float]:
    return max((r[key] for r in steps if isinstance(r.get(key), (int, float))), default=None)


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None


def report(in_dir: str, out: str, command: str, device: str = "") -> dict[str, Any]:
    summary = summarize(in_dir)
    info = json.load(open(os.path.join(in_dir, "run.json")))
    device = device or info.get("device") or ("cpu" if info.get("cpu") else _device())
    record = {"command": command or info["command"], "device": device, "date": datetime.date.today().isoformat(),
              "metrics": {k: v for k, v in summary.items() if k != "measured_peaks_bytes"},
              "detail": {"measured_peaks_bytes": summary["measured_peaks_bytes"], "trainer": info["command"]}}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    rows = "\n".join(f"| {k} | {v} |" for k, v in record["metrics"].items())
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(f"# reward_model ({device}, {record['date']})\n\nGRPO with a reward model on one device "
                f"(benchmarks/reward_model_bench.py; metrics in its docstring).\n\n| metric | value |\n| --- | --- |\n"
                f"{rows}\n")
    print(json.dumps(record["metrics"], indent=1))
    return record


def _device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("models")
    m.add_argument("--dir", required=True)
    m.add_argument("--shape", default="0.5b")
    r = sub.add_parser("run")
    r.add_argument("--models", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--steps", type=int, default=6)
    r.add_argument("--cpu", action="store_true")
    r.add_argument("--gpu-mem-gb", type=float, default=None,
                   help="the card the plan is for, GiB (default: this machine's GPU 0; 80 on CPU)")
    rep = sub.add_parser("report")
    rep.add_argument("--in-dir", required=True)
    rep.add_argument("--out", required=True)
    rep.add_argument("--command", default="")
    rep.add_argument("--device", default="", help="the GPU the run measured on, when the report is made elsewhere")
    d = sub.add_parser("dry-run")
    d.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.mode == "models":
        make_models(args.dir, args.shape)
        return 0
    if args.mode == "run":
        return run(args.models, args.out, args.steps, args.cpu, args.gpu_mem_gb)
    if args.mode == "report":
        report(args.in_dir, args.out, args.command, args.device)
        return 0
    make_models(os.path.join(args.out, "models"), "tiny")
    rc = run(os.path.join(args.out, "models"), os.path.join(args.out, "run"), 3, True, 80.0)
    if rc:
        return rc
    report(os.path.join(args.out, "run"), os.path.join(args.out, "reward_model.json"), "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
