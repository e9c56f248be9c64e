"""Issue 41's GPU run `agent_tools`: SFT warm-start on calculator tool-call traces, then GRPO with the agent loop,
with and without the tool; one table of named stages, one runner, one report (benchmarks/results/agent_tools.json
+ .md).

    python benchmarks/agent_tools.py list
    python benchmarks/agent_tools.py run traces sft grpo_tools grpo_no_tools --out DIR --model /tmp/smol
    python benchmarks/agent_tools.py report --out-dir DIR --json benchmarks/results/agent_tools.json
    python benchmarks/agent_tools.py run ... --dry          # print the commands only

Stages (one GPU; each under the 10-minute call limit, `trainer.max_time_s` guards the RL ones):
- traces: gsm_symbolic calculator traces (hybridrl.data.gen_tool_traces; CPU, seconds) into DIR/traces;
- sft: configs/sft_smollm2_calc.yaml on the traces from SmolLM2-135M-Instruct into DIR/sft;
- grpo_tools: configs/agent_smollm2_calc.yaml (agent loop, the calculator) from DIR/sft's last huggingface/ export;
- grpo_no_tools: the same GRPO run from the same export without the tool (no agent loop, no schema in the prompt).
The report's metrics (the issue's must-shows): tool_call_rate_after (val/agent/tool_call_rate of grpo_tools' last
validation, >= 0.5), turns_per_sample (val/agent/turns_per_sample there, > 1.5) and val_score_tools_minus_no_tools
(last val/score of grpo_tools minus that of grpo_no_tools, > 0).
Not run yet: the CPU session that built this had no GPU time (the stages were checked with --dry).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PY = sys.executable
TRACES_DIR = os.path.join(HERE, "data", "calc_traces")  # gen_tool_traces --train 2000 --test 100 --seed 7
COMMITTED_TRACES = 2000


@dataclass(frozen=True)
class Stage:
    what: str
    command: Callable[[argparse.Namespace], list[str]]


def _sft_export(out: str) -> str:
    """DIR/sft/global_step_N/huggingface of the SFT run's last complete step."""
    root = os.path.join(out, "sft")
    marker = os.path.join(root, "latest_checkpointed_iteration.txt")
    step = open(marker).read().strip() if os.path.isfile(marker) else "N"
    return os.path.join(root, f"global_step_{step}", "huggingface")


def _traces(args: argparse.Namespace) -> list[str]:
    """Generate the traces, or, on a host without reasoning_gym (the GPU host), copy benchmarks/data/calc_traces:
    the same generator's output for the default arguments (tests/unit/test_calc_traces.py regenerates and compares)."""
    out = os.path.join(args.out, "traces")
    if importlib.util.find_spec("reasoning_gym") is None:
        if args.traces != COMMITTED_TRACES:
            raise SystemExit(f"agent_tools traces: reasoning_gym is not installed and the committed traces hold "
                             f"{COMMITTED_TRACES} rows, not --traces {args.traces}; install reasoning-gym")
        print(f"agent_tools traces: reasoning_gym is not installed here; the committed {TRACES_DIR}", flush=True)
        return [PY, "-c", "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2])", TRACES_DIR, out]
    return [PY, "-m", "hybridrl.data.gen_tool_traces", "--task", "gsm_symbolic", "--out_dir", out,
            "--train", str(args.traces), "--test", "100", "--seed", "7"]


def _grpo(args: argparse.Namespace, name: str, extra: list[str]) -> list[str]:
    return [PY, "-m", "hybridrl.trainer.main_ppo", "--config-name", "agent_smollm2_calc",
            f"actor_rollout_ref.model.path={_sft_export(args.out)}", "actor_rollout_ref.model.gguf_file=null",
            f"trainer.default_local_dir={os.path.join(args.out, name)}", f"trainer.max_time_s={args.rl_time_s}",
            f"trainer.total_training_steps={args.rl_steps}", f"trainer.test_freq={args.rl_steps}",
            f"trainer.experiment_name={name}", *extra]


STAGES = {
    "traces": Stage("calculator traces of gsm_symbolic (CPU; the committed copy where reasoning_gym is missing)",
                    lambda a: _traces(a)),
    "sft": Stage("SFT of SmolLM2 on the traces (1 GPU)", lambda a: [
        PY, "-m", "hybridrl.trainer.main_sft", "--config-name", "sft_smollm2_calc", f"model.path={a.model}",
        f"model.gguf_file={GGUF}", f"data.train_files=[{os.path.join(a.out, 'traces', 'train.parquet')}]",
        f"data.val_files=[{os.path.join(a.out, 'traces', 'test.parquet')}]",
        f"trainer.default_local_dir={os.path.join(a.out, 'sft')}", "trainer.resume_mode=disable"]),
    "grpo_tools": Stage("GRPO with the agent loop and the calculator, from the SFT export (1 GPU)",
                        lambda a: _grpo(a, "grpo_tools", [])),
    "grpo_no_tools": Stage("the same GRPO without the tool (no agent loop, no schema in the prompt)", lambda a: _grpo(
        a, "grpo_no_tools", ["actor_rollout_ref.rollout.multi_turn.enable=false", "data.tool_config_path=null",
                             "data.return_raw_chat=false"])),
}


def validations(run_dir: str) -> list[dict]:
    """The run's validation rows in step order (step 0 is before training)."""
    path = os.path.join(run_dir, "logs", "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    return [r for r in (json.loads(line) for line in open(path)) if "val/score" in r]


def after_training(run_dir: str) -> Optional[dict]:
    """The last validation after at least one step, or None (a run cut before its end validates only at step 0)."""
    vals = [r for r in validations(run_dir) if r.get("step", 0) > 0]
    return vals[-1] if vals else None


def report(out_dir: str, path: str, device: Optional[str]) -> dict:
    tools_dir, plain_dir = os.path.join(out_dir, "grpo_tools"), os.path.join(out_dir, "grpo_no_tools")
    tools, plain = after_training(tools_dir), after_training(plain_dir)
    if tools is None:
        raise SystemExit(f"{tools_dir}: no validation after training in logs/metrics.jsonl")
    before = {name: (validations(d) or [{}])[0].get("val/score") for name, d in (("tools", tools_dir),
                                                                                ("no_tools", plain_dir))}
    metrics = {"tool_call_rate_after": tools.get("val/agent/tool_call_rate", 0.0),
               "turns_per_sample": tools.get("val/agent/turns_per_sample", 0.0),
               # None when the run without the tool ended before its last validation: nothing to compare
               "val_score_tools_minus_no_tools": tools["val/score"] - plain["val/score"] if plain else None,
               "val_score_tools": tools["val/score"], "val_score_no_tools": plain["val/score"] if plain else None,
               "val_score_tools_before": before["tools"], "val_score_no_tools_before": before["no_tools"],
               "rl_steps_tools": tools.get("step"), "rl_steps_no_tools": plain.get("step") if plain else None}
    result = {"command": f"python benchmarks/agent_tools.py run {' '.join(STAGES)} --out {out_dir}",
              "device": device or "unknown", "date": datetime.date.today().isoformat(), "metrics": metrics}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    checks = [("tool_call_rate_after >= 0.5", metrics["tool_call_rate_after"] >= 0.5),
              ("turns_per_sample > 1.5", metrics["turns_per_sample"] > 1.5),
              ("val_score_tools_minus_no_tools > 0", metrics["val_score_tools_minus_no_tools"] is not None
               and metrics["val_score_tools_minus_no_tools"] > 0)]
    lines = ["# agent_tools: SFT warm-start on calculator traces, then GRPO with and without the tool", "",
             f"{result['date']}, {result['device']}: `{result['command']}`", "", "| metric | value |", "| --- | --- |"]
    lines += [f"| {k} | {'-' if v is None else f'{v:.4f}'} |" for k, v in metrics.items()]
    lines += ["", *[f"- {name}: {'yes' if ok else 'NO'}" for name, ok in checks]]
    if plain is None:
        lines += ["", "grpo_no_tools has no validation after training (the run ended before it): not compared."]
    with open(path[:-5] + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["list", "run", "report"])
    p.add_argument("stages", nargs="*")
    p.add_argument("--out", default="/tmp/res/agent_tools")
    p.add_argument("--model", default="/tmp/smol", help="folder of SmolLM2's GGUF (gpu_run.sh stage)")
    p.add_argument("--traces", type=int, default=2000)
    p.add_argument("--rl-steps", type=int, default=20)
    p.add_argument("--rl-time-s", type=int, default=240)
    p.add_argument("--json", default=os.path.join(HERE, "results", "agent_tools.json"))
    p.add_argument("--device", default=None)
    p.add_argument("--dry", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    if args.mode == "list":
        for name, stage in STAGES.items():
            print(f"{name:14s} {stage.what}")
        return 0
    if args.mode == "report":
        report(args.out, args.json, args.device)
        return 0
    unknown = [s for s in args.stages if s not in STAGES]
    if unknown or not args.stages:
        raise SystemExit(f"stages {unknown or '(none)'}: choose from {', '.join(STAGES)}")
    for name in args.stages:
        cmd = STAGES[name].command(args)
        print(f"agent_tools {name}: {' '.join(cmd)}", flush=True)
        if not args.dry:
            subprocess.run(cmd, cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
