"""Every GPU run of benchmarks/, by name, in one table: what it runs, the GPUs it needs, its time cap, the results
files it writes, its knobs, and its CPU dry run where one exists.

    python benchmarks/runs.py list [--gpus N]
    python benchmarks/runs.py show NAME [ARGS...]                  # the row and the commands it would run
    python benchmarks/runs.py [--out DIR] [--set KNOB=V ...] run NAME [ARGS...]      # on the GPU host
    python benchmarks/runs.py [--out DIR] [--set KNOB=V ...] dry NAME [ARGS...]      # its CPU dry run, here

A row is a function that yields its steps (runner.py performs them: each command under its cap, its log in
OUT/STEP.log; OUT defaults to $OUT, else /tmp/out; results go to OUT/results). The rows live beside the code they
run: rows_one_gpu.py (tests/gpu, rollout, gap, GRPO, agent, speed, MoE, scale, LoRA), rows_two_gpu.py (issue 8's layouts,
issue 21's split placement), rows_moe.py (issue 38: MoE with TE grouped GEMM on one GPU, ep4 on four),
peer_verl/rows.py (verl side by side), and below, the runners that are tables of their
own (four_gpu.py, async_rl.py, agent_tools.py, two_nodes.py with two_nodes_kill.py, reward_model_bench.py), one row per
entry of theirs.
A knob is a row's parameter with a default (`show` lists them): `--set KNOB=V`, or the environment variable KNOB as the
shell runners read it. Shell is for staging only: gpu_run.sh stage (the offline bundle), the bundle's unpack.sh,
peer_verl/run.sh stage|stage_megatron; gpu_run.sh, multi_gpu_run.sh and peer_verl/run.sh forward any other mode here.
Results land in benchmarks/results/NAME.json + .md (DEVELOPERS.md); the history of runs is in those .md files.
tests/unit/test_run_table.py lists every row's commands and checks their arguments and configs on CPU;
tests/e2e/test_run_table_dry.py runs every row's dry run.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import agent_tools  # noqa: E402  (benchmarks/: this script's folder)
import async_rl  # noqa: E402
import four_gpu  # noqa: E402
import rows_moe  # noqa: E402
import rows_one_gpu  # noqa: E402
import rows_two_gpu  # noqa: E402
import two_nodes  # noqa: E402
from peer_verl import rows as peer_rows  # noqa: E402
from rows_one_gpu import ENV, SMOL, build_model  # noqa: E402
from runner import CALL_CAP_S, Actions, Command, Context, Run, listing, perform  # noqa: E402


def command(*argv: str):
    """A row of one Python command (a benchmark of its own, a probe); ARGS of `runs.py run NAME ARGS` are appended."""
    def steps(c: Context) -> Actions:
        yield Command((c.python, *argv, *c.args))
    return steps


def four_gpu_rows() -> list[Run]:
    """four_gpu.py's rows (issue 33): `four_gpu_NAME` runs `four_gpu.py run NAME --out OUT`; the tiny_* rows and the
    all-gather probes also run on CPU (`--cpu`: gloo, the tiny model, the torch engine)."""
    def row(name: str, what: str, gpus: int, cpu: bool) -> Run:
        argv = ("benchmarks/four_gpu.py", "run", name)
        return Run(f"four_gpu_{name}", what, command_out(argv, cpu), gpus=gpus, results=("four_gpu.json",), cpu=cpu,
                   env=ENV)
    rows = [row(name, r.what, r.gpus, r.shape == "tiny") for name, r in four_gpu.RUNS.items()]
    rows += [row(f"allgather_{n}", f"the NCCL all-gather and device-copy bandwidth on {n} GPUs (the sync floor)", n, True)
             for n in (2, 4)]
    return rows


def command_out(argv: tuple[str, ...], cpu: bool):
    def steps(c: Context) -> Actions:
        yield Command((c.python, *argv, "--out", c.out, *(("--cpu",) if c.cpu else ()), *c.args))
    return steps


def report(*argv: str):
    """A runner's report over OUT (its --in-dir) into OUT/results."""
    def steps(c: Context) -> Actions:
        yield Command((c.python, *(a.replace("{OUT}", c.out) for a in argv), *c.args))
    return steps


# async_rl.py's knobs by machine size: the 4-GPU runs as they were (20 steps, no guard, the whole test set); the 2-GPU
# runs sized to ~10.5 minutes of an H200 for the three (async_rl.py's docstring has the estimate), each stopped after
# the step past TRAIN_TIME_S s of training (then validated) and, at worst, at CAP_S s of wall clock
ASYNC_KNOBS = {4: {"STEPS": "20", "TRAIN_TIME_S": "", "CAP_S": "", "VAL_SAMPLES": ""},
               2: {"STEPS": "3", "TRAIN_TIME_S": "120", "CAP_S": "360", "VAL_SAMPLES": "64"}}
ASYNC_OPTIONS = {"STEPS": "--steps", "TRAIN_TIME_S": "--max-time-s", "CAP_S": "--cap-s", "VAL_SAMPLES": "--val-samples"}


def async_rl_rows() -> list[Run]:
    """async_rl.py's runs: `async_rl_NAME` runs `async_rl.py run NAME` into OUT/async_rl (its CPU form: `dry-run NAME`,
    3 steps on the demo, knobs unused); the 2-GPU rows (issue 37's runs halved) are read by async_rl_report_2gpu."""
    def steps(name: str):
        def run(c: Context) -> Actions:
            out = c.path("async_rl")
            if c.cpu:
                yield Command((c.python, "benchmarks/async_rl.py", "dry-run", name, "--out", out, *c.args))
                return
            knobs = tuple(w for k, option in ASYNC_OPTIONS.items() if c.knob(k) for w in (option, c.knob(k)))
            yield Command((c.python, "benchmarks/async_rl.py", "run", name, "--model", SMOL, *knobs, "--out", out,
                           *c.args))
        return run
    return [Run(f"async_rl_{name}", f"issue 37: {name} on {r.gpus} GPUs (async_rl.py)", steps(name), gpus=r.gpus,
                cap_s=async_cap_s(ASYNC_KNOBS[r.gpus]), results=(async_rl.RESULTS[r.gpus],), knobs=ASYNC_KNOBS[r.gpus],
                cpu=True, env=ENV) for name, r in async_rl.RUNS.items()]


def async_cap_s(knobs: dict[str, str]) -> int:
    """The longest a row's run can take: its CAP_S, then the SIGTERM's grace (async_rl.run_capped); else one call."""
    return int(knobs["CAP_S"]) + async_rl.STOP_GRACE_S if knobs["CAP_S"] else CALL_CAP_S


def async_rl_report(gpus: int) -> Run:
    results = async_rl.RESULTS[gpus]
    return Run(f"async_rl_report{async_rl.SUFFIX[gpus]}", f"issue 37's report over OUT/async_rl, the {gpus}-GPU runs",
               report("benchmarks/async_rl.py", "report", "--gpus", str(gpus), "--in-dir", "{OUT}/async_rl", "--out",
                      f"{{OUT}}/results/{results}"), gpus=0, results=(results,))


def agent_tools_rows() -> list[Run]:
    def steps(stage: str):
        def run(c: Context) -> Actions:
            yield Command((c.python, "benchmarks/agent_tools.py", "run", stage, "--out", c.path("agent_tools"),
                           "--model", SMOL, *(("--dry",) if c.cpu else ()), *c.args))
        return run
    return [Run(f"agent_tools_{name}", f"issue 41: {s.what}", steps(name), results=("agent_tools.json",), cpu=True,
                env=ENV) for name, s in agent_tools.STAGES.items()]


def two_nodes_steps(argv: tuple[str, ...], folder: str, gpus: int):
    """`SCRIPT [--cpu] ARGS --gpus N --out-dir OUT/FOLDER`: the runs of one GPU count in a folder of their own."""
    def run(c: Context) -> Actions:
        yield Command((c.python, argv[0], *(("--cpu",) if c.cpu else ()), *argv[1:], "--gpus", str(gpus),
                       "--out-dir", c.path(folder), *c.args))
    return run


def two_nodes_rows() -> list[Run]:
    """two_nodes.py's rows (issue 43) and two_nodes_kill.py's node's death, then the report: at the issue's 4 GPUs
    (two 2-GPU nodes; OUT/two_nodes -> two_nodes.json) and, `_2gpu`, their halved version on 2 GPUs (two 1-GPU
    nodes: the runs while only 2-GPU machines are lent; OUT/two_nodes_2gpu -> two_nodes_2gpu.json)."""
    rows = []
    for gpus, tag in ((4, ""), (2, "_2gpu")):
        folder, results = f"two_nodes{tag}", two_nodes.results_file(gpus)
        rows += [Run(f"two_nodes_{name}{tag}", f"issue 43: {r.nodes} Ray node(s) on {gpus} GPUs",
                     two_nodes_steps(("benchmarks/two_nodes.py", "run", name), folder, gpus), gpus=gpus,
                     results=(results,), cpu=True, env=ENV) for name, r in two_nodes.RUNS.items()]
        rows.append(Run(f"two_nodes_node_death{tag}", f"issue 43: the worker node killed mid-run on {gpus} GPUs; the "
                        "job fails naming it and resumes on a new node",
                        two_nodes_steps(("benchmarks/two_nodes_kill.py",), folder, gpus), gpus=gpus,
                        results=(results,), cpu=True, env=ENV))
        rows.append(Run(f"two_nodes_report{tag}", f"issue 43's report over OUT/{folder}",
                        report("benchmarks/two_nodes.py", "report", "--gpus", str(gpus), "--in-dir",
                               f"{{OUT}}/{folder}", "--out", f"{{OUT}}/results/{results}"), gpus=0, results=(results,)))
    return rows


def reward_model(c: Context) -> Actions:
    """Issue 42: the policy and its 0.5B-shaped reward model (random weights), GRPO on one GPU, the report."""
    bench = (c.python, "benchmarks/reward_model_bench.py")
    if c.cpu:
        yield Command((*bench, "dry-run", "--out", c.path("reward_model_dry")))
        return
    models, run = "/tmp/rm_models", c.path("reward_model")
    yield Command((*bench, "models", "--dir", models))
    yield Command((*bench, "run", "--models", models, "--out", run, *c.args))
    yield Command((*bench, "report", "--in-dir", run, "--out", c.path("results", "reward_model.json")))


def decode_step_probe(c: Context) -> Actions:
    yield from build_model(c, "model", 300, "/tmp/m_1.5b", "1.5b")
    yield Command((c.python, "benchmarks/probes/decode_step_probe.py", "--model-dir", "/tmp/m_1.5b",
                   "--out", c.path("decode_step_probe.json"), *c.args))


def adapter_sync_probe(c: Context) -> Actions:
    """Issue 40: the LoRA adapter-only sync by part on the GPU: the tiny shape (the CPU-side per-tensor work alone), then
    the 7B shape (the whole actor in bf16, ~15 GB; its 392 adapters as the lora_7b_lora row's). On CPU: the tiny shape."""
    probe = (c.python, "benchmarks/probes/adapter_sync_probe.py", "--device", "cpu" if c.cpu else "cuda")
    yield Command((*probe, "--shape", "tiny", "--out", c.path("adapter_sync_probe_tiny.json"), *c.args))
    if not c.cpu:
        yield Command((*probe, "--shape", "7b", "--out", c.path("adapter_sync_probe_7b.json"), *c.args))


TABLES = [
    *four_gpu_rows(),
    Run("four_gpu_report", "four_gpu.py's report over OUT: medians, dp scaling, sync over its floor",
        report("benchmarks/four_gpu.py", "report", "--in-dir", "{OUT}", "--out", "{OUT}/results/four_gpu.json"),
        gpus=0, results=("four_gpu.json",)),
    *async_rl_rows(),
    async_rl_report(4),
    async_rl_report(2),
    *agent_tools_rows(),
    Run("agent_tools_report", "issue 41's report over OUT/agent_tools",
        report("benchmarks/agent_tools.py", "report", "--out", "{OUT}/agent_tools", "--json",
               "{OUT}/results/agent_tools.json"), gpus=0, results=("agent_tools.json",)),
    *two_nodes_rows(),
    Run("reward_model", "issue 42: GRPO with a reward model on one GPU + its plan", reward_model,
        results=("reward_model.json",), cpu=True, env=ENV),
    Run("pinned", "pinning offload's host memory, torch vs the arena (torch only, no bundle)",
        command("benchmarks/pinned_bench.py"), results=("pinned_bench.json",)),
    Run("adam_mem", "GPU memory of torch's AdamW step beyond its state (torch only)",
        command("benchmarks/adam_mem.py", "2e9"), results=("adam_mem.json",)),
    Run("probe_decode_step", "probes/decode_step_probe.py: where vLLM's decode step time goes", decode_step_probe,
        env=ENV),
    Run("probe_vllm_stop_token", "probes/vllm_stop_token_probe.py: does vLLM keep the stop token",
        command("benchmarks/probes/vllm_stop_token_probe.py"), env=ENV),
    Run("probe_adapter_sync", "probes/adapter_sync_probe.py: the LoRA adapter-only sync's ms a step by part, tiny and 7B "
        "(issue 40)", adapter_sync_probe, cpu=True, env=ENV),
]

ALL = rows_one_gpu.ROWS + rows_two_gpu.ROWS + rows_moe.ROWS + peer_rows.ROWS + TABLES
RUNS = {r.name: r for r in ALL}
assert len(RUNS) == len(ALL), "run names must be unique"


def context(run: Run, out: str, cpu: bool = False, args: tuple[str, ...] = (), knobs: tuple[str, ...] = (),
            listing: bool = False) -> Context:
    """The row's context: its knobs from `knobs` (KNOB=V), else the environment, else their defaults."""
    values = {k: os.environ.get(k, default) for k, default in run.knobs.items()}
    for kv in knobs:
        key, _, value = kv.partition("=")
        if key not in run.knobs:
            raise SystemExit(f"runs.py: {run.name} has no knob {key} (its knobs: {', '.join(run.knobs) or 'none'})")
        values[key] = value
    return Context(out=out, cpu=cpu, args=args, knobs=values, env=run.env, listing=listing)


def actions(name: str, out: str = "/tmp/out", cpu: bool = False, args: tuple[str, ...] = (),
            knobs: tuple[str, ...] = ()) -> list:
    """What `runs.py run|dry NAME` would do, as a list of actions (nothing runs)."""
    run = RUNS[name]
    ctx = context(run, out, cpu, args, knobs, listing=True)
    return listing(run.steps(ctx), ctx)


def describe(action) -> str:
    kind = type(action).__name__.lower()
    argvs = action.commands()
    if argvs:
        cap = f" (cap {action.cap_s} s, log {action.name}.log)" if hasattr(action, "cap_s") else ""
        return f"  {kind}{cap}: {shlex.join(argvs[0])}"
    return f"  {kind}: {getattr(action, 'text', '') or getattr(action, 'path', '') or ' '.join(getattr(action, 'paths', ()))}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"), help="logs here, results in OUT/results")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=V", help="a knob of the row (`show` lists them)")
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list")
    ls.add_argument("--gpus", type=int, default=None, help="only the runs that fit this many GPUs")
    for name in ("show", "run", "dry"):
        one = sub.add_parser(name)
        one.add_argument("name", choices=sorted(RUNS), metavar="NAME")
        one.add_argument("args", nargs=argparse.REMAINDER, help="the row's arguments (its usage in `show`)")
    args = p.parse_args(argv)
    if args.cmd == "list":
        for r in ALL:
            if args.gpus is None or r.gpus <= args.gpus:
                print(f"{r.name:34} {r.gpus} GPU  cap {r.cap_s:>4}s  {'dry ' if r.cpu else '    '}{r.what}")
        return 0
    run, extra = RUNS[args.name], tuple(args.args[1:] if args.args[:1] == ["--"] else args.args)
    if args.cmd == "show":
        print(f"{run.name}{' ' + run.params if run.params else ''}: {run.what}\n  gpus: {run.gpus}, cap: {run.cap_s} s, "
              f"CPU dry run: {'yes' if run.cpu else 'no'}\n"
              f"  results: {', '.join('benchmarks/results/' + f for f in run.results) or '-'}\n"
              f"  knobs: {' '.join(f'{k}={v!r}' for k, v in run.knobs.items()) or '-'}\n  OUT={args.out}:")
        for action in actions(run.name, args.out, False, extra, tuple(args.set)):
            print(describe(action))
        return 0
    if args.cmd == "dry" and not run.cpu:
        print(f"runs.py: {run.name} has no CPU dry run (`show {run.name}` lists its commands)", file=sys.stderr)
        return 2
    os.makedirs(os.path.join(args.out, "results"), exist_ok=True)
    ctx = context(run, args.out, args.cmd == "dry", extra, tuple(args.set))
    print(f"runs.py {args.cmd} {run.name}: {run.what}; OUT={args.out}", flush=True)
    return perform(run.steps(ctx), ctx)


if __name__ == "__main__":
    raise SystemExit(main())
