"""The run table's CPU dry run (issue 36): every row of benchmarks/runs.py, listed and checked without a GPU.

For each row, its GPU form and, where it has one, its CPU form are listed (runner.listing: nothing runs) and every
command it would run is checked as far as this machine can:
- a trainer's (main_ppo, main_sft, `hybridrl plan`) config is composed and validated by hybridrl's one validation
  pass, a GPU layout as `hybridrl plan` checks one on a machine without a GPU;
- a benchmark script or module gets its arguments parsed by its own argparse parser (the script's top level runs,
  its main stops at the parse);
- a tests/gpu file, a shell script and verl's launcher must exist (shell: `bash -n` too); `python -c` code and a
  script without options compile.
The table runners' rows (four_gpu.py, async_rl.py, agent_tools.py) also have the trainer configs they launch
validated. Every row with a CPU form runs its dry run for real in tests/e2e/test_run_table_dry.py.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import subprocess
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import agent_tools  # noqa: E402
import async_rl  # noqa: E402
import four_gpu  # noqa: E402
import runner  # noqa: E402
import runs  # noqa: E402
import two_nodes  # noqa: E402
import two_nodes_kill  # noqa: E402

from hybridrl.config.cli import normalize_argv, parse_command_line  # noqa: E402
from hybridrl.config.loader import load_config  # noqa: E402
from hybridrl.config.schema.sft import SFTConfig  # noqa: E402
from hybridrl.config.sft_validate import validate_sft  # noqa: E402
from hybridrl.config.validate import validate  # noqa: E402
from hybridrl.trainer.main_sft import without_group_choices  # noqa: E402

# what a row needs to be listed: its positional arguments, or a knob without a default
ARGS = {"multi_grpo": ("mine", "2", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"),
        "scalemodel": ("7b", "0.5b")}
KNOBS = {"SEED": "2"}
TRAINERS = {"hybridrl.trainer.main_ppo", "hybridrl.trainer.main_sft"}


class _Parsed(Exception):
    pass


@contextlib.contextmanager
def _parse_only():
    """The outermost parse_args/parse_known_args call raises _Parsed with its result (a subparser's nested call
    returns as usual); a parse error is argparse's SystemExit."""
    depth = [0]
    originals = {name: getattr(argparse.ArgumentParser, name) for name in ("parse_args", "parse_known_args")}

    def wrap(orig):
        def parse(self, *a, **k):
            depth[0] += 1
            try:
                result = orig(self, *a, **k)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                raise _Parsed(result)
            return result
        return parse

    saved_argv, saved_path, saved_env = sys.argv[:], sys.path[:], dict(os.environ)
    for name, orig in originals.items():
        setattr(argparse.ArgumentParser, name, wrap(orig))
    try:
        with warnings.catch_warnings():  # a script's top level may set filters or environment defaults: not ours
            yield
    finally:
        for name, orig in originals.items():
            setattr(argparse.ArgumentParser, name, orig)
        sys.argv[:], sys.path[:] = saved_argv, saved_path
        os.environ.clear()
        os.environ.update(saved_env)


def parsed(target: str, args: list[str], module: bool = False):
    """What the script (or `-m` module) `target` parses from `args`, stopped right after its argparse parse."""
    with _parse_only():
        sys.argv = [target, *args]
        try:
            if module:  # runpy warns when another test imported it already: running it anew is the point
                warnings.simplefilter("ignore", RuntimeWarning)
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                sys.path.insert(0, os.path.dirname(os.path.join(ROOT, target)))
                runpy.run_path(os.path.join(ROOT, target), run_name="__main__")
        except _Parsed as done:
            return done.args[0]
        except SystemExit as e:
            raise AssertionError(f"{target} refused its arguments {args} (exit {e.code})") from None
    raise AssertionError(f"{target} {args}: it never parsed its arguments")


def check_trainer(module: str, args: list[str], gpu: bool) -> None:
    """Compose and validate the config as the entry point does; a GPU run as if this machine had GPUs and TE."""
    probes = dict(cuda_available=lambda: True, te_available=lambda: True) if gpu else {}
    if module == "hybridrl.trainer.main_sft":
        cl = parse_command_line(args, default_config=None)
        validate_sft(load_config(without_group_choices(cl.overrides), cl.config_name, cl.config_path,
                                 schema=SFTConfig), **probes)
        return
    cl = parse_command_line(normalize_argv(args))
    validate(load_config(cl.overrides, cl.config_name, cl.config_path), **probes)


def check_command(argv: tuple[str, ...], gpu: bool) -> None:
    words = list(argv)
    if words[0] == "env":  # env K=V ... COMMAND
        words = words[1:]
        while "=" in words[0]:
            words = words[1:]
    program, rest = words[0], words[1:]
    if program == "bash":
        script = rest[0] if os.path.isabs(rest[0]) else os.path.join(ROOT, rest[0])
        if script.startswith(ROOT):  # /tmp/b/unpack.sh is the bundle's, carried to the GPU host
            assert subprocess.run(["bash", "-n", script]).returncode == 0, script
        return
    if program == "nvidia-smi":
        return
    assert program == sys.executable, f"{argv}: commands run this Python"
    if rest[0] == "-c":
        compile(rest[1], "<-c>", "exec")
    elif rest[0] == "-m":
        check_module(rest[1], rest[2:], gpu)
    elif rest[0].endswith("launch_verl.py"):  # verl's Hydra command line; settings.py made it (test_peer_verl_settings)
        assert os.path.exists(rest[0])
    else:
        script = os.path.relpath(rest[0], ROOT) if os.path.isabs(rest[0]) else rest[0]
        source = open(os.path.join(ROOT, script), encoding="utf-8").read()
        if "ArgumentParser" in source:
            parsed(script, rest[1:])
        else:  # a script without options (a probe importing vLLM at its top): it compiles
            compile(source, script, "exec")


def check_module(module: str, args: list[str], gpu: bool) -> None:
    if module in TRAINERS:
        check_trainer(module, args, gpu)
    elif module == "pytest":
        files = [a for a in args if a.endswith(".py")]
        assert files and all(os.path.exists(os.path.join(ROOT, f)) for f in files), args
    elif module == "hybridrl":
        assert args[0] == "plan", args
        _, overrides = parsed("hybridrl.plan.cli", args[1:], module=True)
        check_trainer("hybridrl.trainer.main_ppo", overrides, gpu=True)  # plan: GPUs unless trainer.device=cpu
    elif module == "torch.distributed.run":
        script = next(i for i, a in enumerate(args) if a.endswith(".py"))
        parsed(args[script], args[script + 1:])
    else:
        parsed(module, args, module=True)


def forms(name: str):
    run = runs.RUNS[name]
    yield False
    if run.cpu:
        yield True


@pytest.mark.parametrize("name", sorted(runs.RUNS))
def test_every_row_lists_commands_that_parse(name, tmp_path):
    run = runs.RUNS[name]
    knobs = tuple(f"{k}={v}" for k, v in KNOBS.items() if k in run.knobs)
    for cpu in forms(name):
        actions = runs.actions(name, str(tmp_path), cpu, ARGS.get(name, ()), knobs)
        commands = [argv for a in actions for argv in a.commands()]
        assert commands, f"{name}: no commands"
        for argv in commands:
            check_command(argv, gpu=not cpu)


def test_the_table_runners_launch_valid_configs(tmp_path):
    """The trainer configs four_gpu.py, async_rl.py, agent_tools.py and two_nodes.py would launch (their rows' inner
    commands)."""
    for name, row in four_gpu.RUNS.items():
        cpu = row.shape == "tiny"
        for gib in (80.0, 140.0):
            overrides = four_gpu.trainer_overrides(row, "/tmp/m", str(tmp_path / name), 6, 500, cpu, gib)
            check_trainer("hybridrl.trainer.main_ppo", overrides, gpu=not cpu)
    for row in async_rl.RUNS.values():
        cmd = async_rl.command(row, 20, str(tmp_path / row.name), "/tmp/smol", cpu=False)
        check_trainer("hybridrl.trainer.main_ppo", cmd[3:], gpu=True)
    ns = argparse.Namespace(out=str(tmp_path), model="/tmp/smol", traces=2000, rl_steps=20, rl_time_s=240)
    for stage in agent_tools.STAGES.values():
        cmd = stage.command(ns)
        check_module(cmd[2], cmd[3:], gpu=True)
    for gpus in two_nodes.GPUS:  # ray_start.sh's layout arguments first; the batch must split over dp = gpus
        for run, extra in [*((r, ()) for r in two_nodes.RUNS.values()),
                           (two_nodes.RUNS["two_nodes_socket"], two_nodes_kill.CKPT_ARGS)]:
            layout = ["trainer.backend=ray", f"trainer.nnodes={run.nodes}",
                      f"trainer.n_gpus_per_node={two_nodes.gpus_per_node(gpus, run.nodes)}"]
            args = two_nodes.job_args(False, "/tmp/m", ("/tmp/m/data/train.parquet", "/tmp/m/data/test.parquet"),
                                      str(tmp_path / "ckpt"), extra)
            check_trainer("hybridrl.trainer.main_ppo", layout + args, gpu=True)


def test_a_listing_changes_nothing(tmp_path):
    """show/listing writes nothing: every write of a row is an action it yields."""
    for name in ("scale_7b", "multi_grpo", "grpo", "peer_ours_smol", "moe", "moe_8b_ep4", "moe_1b_te_train"):
        runs.actions(name, str(tmp_path / "out"), False, ARGS.get(name, ()))
    assert not (tmp_path / "out").exists()


def test_a_failed_step_fails_the_run(tmp_path):
    def steps(c):
        yield runner.Step("ok", 10, (sys.executable, "-c", "print('fine')"))
        yield runner.Step("bad", 10, (sys.executable, "-c", "raise SystemExit(3)"))
        yield runner.Note("after")
    ctx = runner.Context(out=str(tmp_path))
    assert runner.perform(steps(ctx), ctx) == 3
    assert (tmp_path / "ok.log").read_text() == "fine\n"


def test_bash_quote_is_printf_q():
    words = ["CUDA_VISIBLE_DEVICES=0,1", "trainer.logger=[console,jsonl]", "a b", "#x", "", "it's", "x=$HOME"]
    expect = subprocess.run(["bash", "-c", 'printf "%q\\n" "$@"', "_", *words], capture_output=True, text=True).stdout
    assert [runner.bash_quote(w) for w in words] == expect.splitlines()
