"""Every row of the run table (benchmarks/runs.py) that has a CPU dry run (`runs.py dry NAME` on a machine without a
GPU; issue 36) is exercised here, at one of two levels:

- run (test_dry_run): the row's dry run for real, as `runs.py dry NAME` (its own steps and commands, the tiny models,
  gloo, the torch engine), then a check of what it wrote: run folders, step counts and key metrics, results files,
  or the line it prints (CHECKS). One row of each code path runs (REAL): rows whose listings run the same programs in
  the same order (path_of: scale_*, grpo_*, moe_* GRPO, four_gpu tiny_*, async_rl_*, two_nodes_*, ...) share a path,
  and PREFERRED names the one that runs where it matters which. Reports run over the outputs of the rows of their
  inputs that ran, and are checked for the keys those give.
- resolve (test_resolve, every dry row, the running ones too): the commands the dry run would run, listed with this
  test's knobs and arguments, each checked without running it: a script's arguments through its own parser, a
  trainer's config composed and validated by hybridrl's validation pass (tests/unit/test_run_table.py's checks), and
  the trainer commands a runner builds from its own table (four_gpu.py, async_rl.py, two_nodes.py and two_nodes_kill.py
  with their layout's dp, startup_bench.py, agent_tools.py, the demo CLI) validated the same way.
  test_a_broken_row_fails_to_resolve proves that a row that only resolves fails this test when a trainer key, a
  value, a runner option or a runner's row in it is broken.
So a row that resolves is checked to run the same programs as a row that ran, with a command and config that parse
and validate; what it does not get is its own run (a layout or knob that validates but fails at run time: the
layouts, LoRA, MoE and async modes have their own tests in tests/dist and tests/e2e).

What keeps the runs cheap (benchmarks/results/run_table_dry.md has the numbers): LANES rows at a time, each in its
own process group and OUT; a row that needs another's output waits for it (the shared models' builders, BUILDERS;
the reports' inputs, REPORTS, linked into a fresh OUT); rows that start Ray nodes on fixed ports one at a time
(SERIAL); the tiny models built once and the other rows pointed at them with their knobs (SCALE_MODELS, MODEL,
MODELS, four_gpu's --models); one training step where the row has the knob (2-3 where its metrics need them).
Rows without a CPU form are listed in NO_DRY: a new row goes into one list or the other knowingly, and a new row
with a path of its own runs for real, unless another test runs what its dry run would (ELSEWHERE, with that test).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import agent_tools  # noqa: E402
import async_rl  # noqa: E402
import four_gpu  # noqa: E402
import runner  # noqa: E402
import runs  # noqa: E402
import startup_bench  # noqa: E402
import two_nodes  # noqa: E402
import two_nodes_kill  # noqa: E402

from hybridrl.utils.errors import ConfigError  # noqa: E402
from tests.unit.test_run_table import check_command, check_trainer  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.slow]

LANES = 2  # rows at a time once this module's tests run (this machine: 2 cores)
BACKGROUND_LANES = 1  # rows at a time while the suite's other tests run (start_table; they use ~0.8 of 2 cores)
# Ray's idle workers prestarted for the first driver (one per CPU) take no actor of ours (our runtime env differs):
# ~1.7 CPU-s a Ray start, skipped in the rows' processes
ROW_ENV = {"RAY_prestart_worker_first_driver": "0"}
ROW_TIMEOUT_S = 480
TP, RTP = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "actor_rollout_ref.rollout.tensor_model_parallel_size"

NO_DRY = set("""
adam_mem agent agent_tools_report agentgrpo async_rl_report async_rl_report_2gpu bench checks four_gpu_14b_2gpu four_gpu_14b_4gpu
four_gpu_1p5b_1gpu four_gpu_1p5b_big_1gpu four_gpu_1p5b_big_dp4 four_gpu_1p5b_dp2 four_gpu_1p5b_dp4 four_gpu_7b_1gpu
four_gpu_7b_big_1gpu four_gpu_7b_big_rdp4 four_gpu_7b_big_tp2dp2 four_gpu_7b_pp2_rtp2 four_gpu_7b_pp2dp2_rdp4
four_gpu_7b_pp2dp2_rtp2 four_gpu_7b_tp2 four_gpu_7b_tp2_rdp2 four_gpu_7b_tp2dp2 four_gpu_7b_tp4 four_gpu_report gap
gpu_test_agent_vllm gpu_test_controller_gpu gpu_test_megatron_adam_trajectory gpu_test_megatron_cp gpu_test_megatron_gpu
gpu_test_megatron_layouts_gpu gpu_test_megatron_master_weights gpu_test_megatron_moe_te gpu_test_megatron_te
gpu_test_vllm_hybrid gpu_test_vllm_lora gpu_test_vllm_moe gpu_test_weight_broadcast_nccl grpo moe moe_te_tests moetest
peer_ours_1p5b peer_ours_7b peer_ours_7b_4gpu peer_ours_best_1p5b peer_ours_best_smol peer_ours_best_smol_seed
peer_ours_smol peer_ours_smol_seed peer_ours_smol_verl_order peer_report peer_report_megatron peer_stage
peer_stage_megatron peer_verl_1p5b peer_verl_1p5b_1 peer_verl_1p5b_2 peer_verl_7b peer_verl_7b_4gpu
peer_verl_megatron_1p5b peer_verl_megatron_7b peer_verl_megatron_7b_4gpu peer_verl_megatron_smol peer_verl_smol
peer_verl_smol_1 peer_verl_smol_2 peer_verl_smol_seed pinned probe_decode_step probe_vllm_stop_token report scalemodel
speed speed7b speed7bcmp te two_nodes_report two_nodes_report_2gpu update7b
""".split())

# training steps of the rows with a STEPS knob: 1, or what the row's point needs to show in its metrics
STEPS = {"scale_": "2",  # scale_report times steps 2..N (step 1 carries the start-up)
         "grpo_split_sync": "2",  # the weight broadcast after an update (step 1's is part of the start-up)
         "grpo_one_step_off": "3"}  # step 2 generated during update 1 (staleness 1), step 3 after a broadcast
ARGS = {"multi_grpo": ("mine", "2", f"{TP}=2", f"{RTP}=2")}
BUILDERS = {"m_tiny": "multi_stage", "m_moe_tiny": "moe_1b_te_train"}  # shared model folder -> the row building it
REPORTS = {"lora_report": ("lora_7b_", "lora_smol"), "multi_report": ("parity", "grpo_"), "moe_scale_report": ("moe_",)}
SERIAL = ("two_nodes_",)  # Ray nodes on fixed worker port ranges (two_nodes.py): one such row at a time
# Rows that resolve only although their path has no row that runs: another test runs the same on CPU. The node's death
# (two_nodes_kill.py: two Ray nodes, the worker node killed mid-run, the job resumed on a new one; its dry run took
# 68 s wall (2gpu) and 92 s (4-GPU form) alone on 2 cores, 2026-11-28) is the test named, with the demo job on the
# same two-node layout and launcher; two_nodes_kill.py's own polling, kill and timing code runs only in the rows'
# `runs.py dry` (its parsing and verdict: tests/unit/test_two_nodes_bench.py).
ELSEWHERE = {
    "two_nodes_node_death": "tests/e2e/test_two_nodes.py::"
                            "test_ray_two_nodes_match_one_then_a_lost_node_fails_fast_and_the_job_resumes",
    "two_nodes_node_death_2gpu": "the same (its two 1-CPU nodes are that test's layout)",
}

# Rows whose listing runs the same programs in the same order (path_of) take one code path of the benchmarks; one row
# of each path runs for real (REAL), the others are resolved (test_resolve). INNER splits a path where one runner takes
# two inner paths by row; PREFERRED names the row that runs where a path has several (else the first in the table).
INNER = {"four_gpu_allgather_": "bandwidth probe"}  # four_gpu.py run allgather_N: no trainer
PREFERRED = {
    "lora_7b_lora",  # LoRA: the adapter-only sync (lora_7b_full and _awake: the same trainer command, other keys)
    "grpo_one_step_off",  # split placement, broadcast sync and one-step-off generation: the most of the trainer
    "moe_1b_te_grpo",  # one process (the ep4 rows: four, the same trainer command with other layout keys)
    "four_gpu_tiny_dp2",  # two trainer ranks (tiny_1: startup_7b runs it through four_gpu.py too)
    "two_nodes_two_nodes_socket",  # two Ray nodes (one_node: the same script with one)
}


def program(argv: tuple[str, ...]) -> str:
    """What a command runs: the script or module and its sub-command (torchrun: the script it starts)."""
    rest = list(argv[1:])
    if rest[:1] == ["-c"]:
        return "python -c"
    if rest[:1] == ["-m"] and rest[1] == "torch.distributed.run":
        rest = rest[next(i for i, a in enumerate(rest) if a.endswith(".py")):]
    elif rest[:1] == ["-m"]:
        rest = rest[1:]
    sub = rest[1] if len(rest) > 1 and re.fullmatch(r"[a-z][a-z_-]*", rest[1]) else ""
    return f"{os.path.basename(rest[0])} {sub}".strip()


def path_of(name: str) -> tuple[str, ...]:
    """The row's code path: its actions' kinds and the programs its commands run, in order."""
    words = []
    for action in runs.actions(name, "/OUT", True, ARGS.get(name, ())):
        words += [program(argv) for argv in action.commands()] or [type(action).__name__]
    return (*words, *(tag for prefix, tag in INNER.items() if name.startswith(prefix)))


DRY = [r.name for r in runs.ALL if r.cpu]
PATHS: dict[tuple[str, ...], list[str]] = {}
for _name in DRY:
    PATHS.setdefault(path_of(_name), []).append(_name)
REAL = [next((n for n in names if n in PREFERRED), names[0]) for names in PATHS.values()
        if not all(n in ELSEWHERE for n in names)]
RUN = [name for name in DRY if name in REAL]  # table order


def row_knobs(name: str, models: str) -> tuple[str, ...]:
    values = {"SCALE_MODELS": models, "MODELS": models, "MODEL": f"{models}/m_tiny", "MODEL_1B": f"{models}/m_moe_1b",
              "STEPS": row_steps(name)}
    return tuple(f"{k}={v}" for k, v in values.items() if k in runs.RUNS[name].knobs)


def row_steps(name: str) -> str:
    return next((n for prefix, n in STEPS.items() if name.startswith(prefix)), "1")


def row_args(name: str, models: str) -> tuple[str, ...]:
    if name.startswith("four_gpu_"):
        return ("--models", models, "--steps", "1")
    return ARGS.get(name, ())


def listing(name: str, out: str, models: str) -> list:
    return runs.actions(name, out, True, row_args(name, models), row_knobs(name, models))


def depends(name: str, models: str) -> list[str]:
    """The rows whose output this row reads: the builders of the shared models it names, a report's inputs."""
    actions = listing(name, "/OUT", models)
    folders = set(re.findall(re.escape(models) + r"/([\w.]+)", repr(actions)))
    for argv in (argv for a in actions for argv in a.commands()):
        if "four_gpu.py" in program(argv) and "--models" in argv:  # four_gpu.py --models DIR: it uses DIR/m_SHAPE
            run = argv[argv.index("run") + 1]
            folders |= {f"m_{four_gpu.RUNS[run].shape}"} if run in four_gpu.RUNS else set()
    needs = [BUILDERS[m] for m in sorted(folders)]
    needs += [r for r in RUN if r != name and r.startswith(REPORTS.get(name, ("\0",)))]
    return [n for n in dict.fromkeys(needs) if n != name]


# ------------------------------------------------------------------------------------------------ running the rows
@dataclass
class Result:
    name: str
    rc: Optional[int]  # None: not run (a row it needs failed) or stopped at ROW_TIMEOUT_S
    out: Path  # the row's OUT
    stdout: str
    seconds: float


class Table:
    """Runs the given rows and the rows they need, LANES at a time, in table order, each as `runs.py dry NAME` in a
    process group of its own under base/NAME (its OUT); result() waits for a row's."""

    def __init__(self, base: Path, names: list[str], lanes: int = LANES) -> None:
        self.base, self.models, self.lanes = base, str(base / "models"), lanes
        self.started = time.monotonic()
        self.needs: dict[str, list[str]] = {}
        todo = list(names)
        while todo:
            name = todo.pop()
            if name not in self.needs:
                self.needs[name] = depends(name, self.models)
                todo += self.needs[name]
        # the models' builders first, then the rows that must run one at a time (a chain best not left for the
        # end), then table order
        needed = set(BUILDERS.values())
        self.pending = sorted((n for n in RUN if n in self.needs),
                              key=lambda n: (n not in needed, not n.startswith(SERIAL), RUN.index(n)))
        self.results: dict[str, Result] = {}
        self.running: dict[str, tuple[subprocess.Popen, float]] = {}
        self.changed = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="run-table-dry", daemon=True)
        self.thread.start()

    def result(self, name: str) -> Result:
        with self.changed:
            self.changed.wait_for(lambda: name in self.results)
            return self.results[name]

    def stop(self) -> None:
        self.stopping = True
        self.thread.join()

    def _loop(self) -> None:
        while (self.pending or self.running) and not self.stopping:
            for name in list(self.pending):
                if len(self.running) >= self.lanes:
                    break
                if any(n not in self.results for n in self.needs[name]) or any(
                        name.startswith(s) and r.startswith(s) for s in SERIAL for r in self.running):
                    continue
                self.pending.remove(name)
                failed = [n for n in self.needs[name] if self.results[n].rc != 0]
                if failed:
                    self._done(Result(name, None, self.base / name, f"not run: {failed} failed", 0.0))
                    continue
                try:
                    self.running[name] = (self._start(name), time.monotonic())
                except Exception:  # a broken setup fails this row's test, not the thread
                    self._done(Result(name, None, self.base / name, traceback.format_exc(), 0.0))
            for name, (proc, start) in list(self.running.items()):
                late = time.monotonic() - start > ROW_TIMEOUT_S
                if proc.poll() is None and not late:
                    continue
                if proc.returncode is None:
                    _kill_group(proc)
                del self.running[name]
                text = (self.base / f"{name}.stdout").read_text(errors="replace")
                self._done(Result(name, None if late else proc.returncode, self.base / name,
                                  text + (f"\n[stopped after {ROW_TIMEOUT_S} s]" if late else ""),
                                  time.monotonic() - start))
            time.sleep(0.2)
        for proc, _ in self.running.values():
            _kill_group(proc)

    def _start(self, name: str) -> subprocess.Popen:
        out = self.base / name
        out.mkdir()
        for source in (self.base / n for n in self.needs[name] if name in REPORTS):
            for entry in source.iterdir():  # a report reads its inputs' run folders and files from its OUT
                if entry.name != "results":
                    assert not (out / entry.name).exists(), f"{name}: {entry.name} is in two inputs' OUT"
                    (out / entry.name).symlink_to(entry)
        cmd = [sys.executable, str(ROOT / "benchmarks" / "runs.py"), "--out", str(out),
               *(w for kv in row_knobs(name, self.models) for w in ("--set", kv)), "dry", name,
               *row_args(name, self.models)]
        env = dict(os.environ, **ROW_ENV, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
        with open(self.base / f"{name}.stdout", "w") as log:
            return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def _done(self, result: Result) -> None:
        with self.changed:
            self.results[result.name] = result
            self.changed.notify_all()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def start_table(session: pytest.Session, tmp_path_factory: pytest.TempPathFactory) -> Optional[Table]:
    """The dry rows this session's selected tests name, started with the session (tests/conftest.py) and run
    BACKGROUND_LANES at a time beside the other tests, LANES at a time from this module's first test on; None when
    no test_dry_run is selected."""
    names = [item.callspec.params["name"] for item in session.items
             if getattr(item, "originalname", "") == "test_dry_run" and hasattr(item, "callspec")]
    return Table(tmp_path_factory.mktemp("run_table_dry"), names, BACKGROUND_LANES) if names else None


@pytest.fixture(scope="session")
def table(_run_table_dry):
    t = _run_table_dry
    assert t is not None
    t.lanes = LANES
    yield t
    t.stop()
    print(f"\nrun table dry runs: {len(t.results)} rows in {time.monotonic() - t.started:.0f} s since the session "
          f"started ({BACKGROUND_LANES} at a time, then {LANES}): "
          + ", ".join(f"{r.name} {r.seconds:.0f}s" for r in t.results.values()))


# ------------------------------------------------------------------------------------------------ what each row wrote
def read_json(path: Path) -> dict:
    assert path.exists(), f"{path} missing"
    return json.loads(path.read_text())


def steps(path: Path) -> list[dict]:
    assert path.exists(), f"{path} missing"
    return [r for r in map(json.loads, path.read_text().splitlines()) if "timing_s/step" in r]


def check_scale(r: Result) -> None:
    shape = r.name.removeprefix("scale_")
    run = read_json(r.out / r.name / "run.json")
    assert (run["shape"], run["model_shape"], run["device"]) == (shape, "tiny", "cpu"), run
    assert read_json(r.out / r.name / "plan.json").get("ok") is not False
    assert len(steps(r.out / r.name / "logs" / "metrics.jsonl")) == int(row_steps(r.name))
    m = read_json(r.out / "results" / "megatron_scale.json")["metrics"]
    assert m[f"{shape}_plan_ok"] is True and m[f"{shape}_step_s_median"] > 0 and m[f"{shape}_tokens_per_s_per_gpu"] > 0


def check_lora(r: Result) -> None:
    demo = r.name.startswith("lora_smol")  # the demo CLI: its trainer writes OUT/lora_NAME/checkpoints
    rows = steps(r.out / r.name / ("checkpoints" if demo else "") / "logs" / "metrics.jsonl")
    assert len(rows) == (2 if demo else 1)
    if not r.name.endswith("full"):
        assert all(row["reshard/adapter_bytes"] > 0 for row in rows), "LoRA syncs only its adapters"


def check_lora_report(r: Result) -> None:
    """Over the lora rows that ran (lora_7b_lora, lora_smol): their own keys; the ratios to the full rows need those."""
    m = read_json(r.out / "results" / "lora.json")["metrics"]
    for key in ("lora_sync_bytes", "lora_val_score_gain", "smol_lora_gap"):
        assert m[key] is not None, key
    assert m["lora_sync_bytes"] > 0


def check_multi_stage(r: Result) -> None:
    model = r.out.parent / "models" / "m_tiny"
    assert (model / "config.json").exists() and (model / "data" / "train.parquet").exists()


def check_parity(r: Result) -> None:
    for layout in ("tp1_pp1_dp1", "tp2_pp1_dp1", "tp1_pp2_dp1", "tp1_pp1_dp2"):
        rec = read_json(r.out / f"parity_{layout}.json")
        assert rec["update_applied"] and rec["grad_norm"] > 0, (layout, rec)
    assert read_json(r.out / "allgather.json")["busbw_bytes_per_s"] > 0


def check_grpo(r: Result) -> None:
    run = read_json(r.out / r.name / "run.json")
    rows = steps(r.out / r.name / "logs" / "metrics.jsonl")
    assert len(rows) == int(row_steps(r.name)), run
    assert all("rollout_vs_actor/logprob_abs_diff_mean" in row for row in rows)
    if r.name in ("grpo_split_sync", "grpo_one_step_off"):  # the rollout on a GPU of its own: a broadcast sync
        assert rows[-1]["weight_broadcast/bytes"] > 0
    if r.name == "grpo_one_step_off":
        assert rows[1]["async/staleness"] == 1 and "async/overlapped_gen_s" in rows[-1]


def check_multi_report(r: Result) -> None:
    m = read_json(r.out / "results" / "two_gpu.json")["metrics"]
    for layout in ("tp2", "pp2", "dp2"):  # float32 on gloo: every layout is the one-process run to rounding
        assert m[f"{layout}_pg_loss_rel_gap"] < 1e-5 and m[f"{layout}_grad_norm_rel_gap"] < 1e-5, layout
    assert m["allgather_busbw_bytes_per_s"] > 0
    for name in RUN:  # the grpo rows that ran
        if name.startswith("grpo_"):
            assert m[f"{name.removeprefix('grpo_')}_tokens_per_s_per_gpu"] > 0, name


def check_moe_train(r: Result) -> None:
    assert '"moe_mfu_active"' in r.stdout  # train_bench's CPU dry run prints its result (no file, no timings)
    assert (r.out.parent / "models" / "m_moe_tiny" / "config.json").exists()


def check_moe_grpo(r: Result) -> None:
    run = read_json(r.out / r.name / "run.json")
    assert run["name"] == r.name and run["model_shape"] == "moe_tiny", run
    assert read_json(r.out / r.name / "plan.json").get("ok") is not False
    rows = steps(r.out / r.name / "logs" / "metrics.jsonl")
    assert rows and all(row["rollout_vs_actor/routing_agreement"] > 0.9 for row in rows)


def check_moe_report(r: Result) -> None:
    """Over the moe rows that ran (moe_1b_te_grpo): its one-GPU keys."""
    m = read_json(r.out / "results" / "moe_scale.json")["metrics"]
    assert m["moe_routing_agreement"] > 0.9, m


def check_four_gpu(r: Result) -> None:
    name = r.name.removeprefix("four_gpu_")
    if name.startswith("allgather_"):
        rec = read_json(r.out / f"{name}.json")
        assert rec["world"] == int(name.split("_")[1]) and rec["busbw_bytes_per_s"] > 0
        return
    run = read_json(r.out / name / "run.json")
    assert run["gpus"] == (1 if name == "tiny_1" else 2) and run["device"] == "cpu", run
    assert len(steps(r.out / name / "logs" / "metrics.jsonl")) == 1
    if name == "tiny_search":
        assert read_json(r.out / name / "search.json")["ranked"]


def check_async_rl(r: Result) -> None:
    name = r.name.removeprefix("async_rl_")
    assert read_json(r.out / "async_rl" / f"{name}.json")["returncode"] == 0
    assert len(steps(r.out / "async_rl" / name / "checkpoints" / "logs" / "metrics.jsonl")) == 3
    assert f"async_rl: {name} exit 0" in r.stdout


def check_agent_tools(r: Result) -> None:
    stage = r.name.removeprefix("agent_tools_")  # its dry form prints the stage's command (agent_tools.py --dry)
    assert re.search(rf"^agent_tools {stage}: \S+python\S* -m hybridrl\.", r.stdout, re.M), r.stdout


def check_two_nodes(r: Result) -> None:
    name, halved = r.name.removeprefix("two_nodes_").removesuffix("_2gpu"), r.name.endswith("_2gpu")
    folder = r.out / ("two_nodes_2gpu" if halved else "two_nodes") / name
    run = read_json(folder / "run.json")
    assert run["rc"] == 0 and run["nodes"] == two_nodes.RUNS[name].nodes and run["gpus"] == (2 if halved else 4), run
    assert len(steps(folder / "ckpt" / "logs" / "metrics.jsonl")) == 2


def check_startup(r: Result) -> None:
    m = read_json(r.out / "results" / "startup.json")["metrics"]
    keys = ("startup_cold_to_first_step_s", "startup_to_first_step_s") if r.name == "startup_smol" else (
        "startup_7b_to_first_step_s",)
    assert all(m[k] > 0 for k in keys), m
    assert not any(k.startswith("startup_goal_met") for k in m), m  # CPU seconds say nothing of the GPU's goals


def check_adapter_sync_probe(r: Result) -> None:
    rec = read_json(r.out / "adapter_sync_probe_tiny.json")
    assert rec["shape"] == "tiny" and rec["tensors"] > 0 and rec["adapter_bytes"] > 0 and rec["ms"]["sync"] > 0, rec


def check_reward_model(r: Result) -> None:
    m = read_json(r.out / "reward_model_dry" / "reward_model.json")["metrics"]
    assert m["steps"] == 3 and m["rm_seconds_per_step"] > 0 and m["plan_reward_bytes"] > 0, m


CHECKS: dict[str, Callable[[Result], None]] = {  # name prefix -> what the row must have written
    "scale_": check_scale, "lora_report": check_lora_report, "lora_": check_lora, "multi_stage": check_multi_stage,
    "parity": check_parity, "grpo_": check_grpo, "multi_report": check_multi_report,
    "moe_1b_te_train": check_moe_train, "moe_scale_report": check_moe_report, "moe_": check_moe_grpo,
    "four_gpu_": check_four_gpu, "async_rl_": check_async_rl, "agent_tools_": check_agent_tools,
    "two_nodes_": check_two_nodes, "reward_model": check_reward_model, "startup_": check_startup,
    "probe_adapter_sync": check_adapter_sync_probe,
}


# ------------------------------------------------------------------------------------------------ resolving a row
def resolve(name: str, models: str = "/MODELS", out: str = "/OUT") -> int:
    """Level "resolve": the commands the row's dry run would run (its listing with this test's knobs and arguments,
    nothing runs), each checked as tests/unit/test_run_table.py checks a row (a script's arguments through its own
    parser, a trainer's config composed and validated by hybridrl's validation pass, `hybridrl plan`'s too), and the
    trainer commands a runner builds from its own table (four_gpu.py, async_rl.py, two_nodes.py, two_nodes_kill.py,
    startup_bench.py, agent_tools.py, the demo CLI) composed and validated the same way. Returns how many commands it checked."""
    commands = [argv for a in listing(name, out, models) for argv in a.commands()]
    assert commands, f"{name}: no commands"
    inner: list[tuple[str, ...]] = []
    for argv in commands:
        check_command(argv, gpu=False)
        inner += inner_commands(argv, models, out)
    for argv in inner:
        if "hybridrl.trainer.demo" in argv:
            check_demo(argv)
        else:
            check_command(argv, gpu=False)
    return len(commands) + len(inner)


def inner_commands(argv: tuple[str, ...], models: str, out: str) -> list[tuple[str, ...]]:
    """The trainer commands a runner script would start for this command line (its own table's rows)."""
    prog, words = program(argv), list(argv)
    py = sys.executable
    if prog == "four_gpu.py run" and words[words.index("run") + 1] in four_gpu.RUNS:
        run = words[words.index("run") + 1]
        row = four_gpu.RUNS[run]
        steps = int(words[words.index("--steps") + 1]) if "--steps" in words else 6
        return [(py, "-m", "hybridrl.trainer.main_ppo", *four_gpu.trainer_overrides(
            row, f"{models}/m_{row.shape}", f"{out}/{run}", steps, 500, True))]
    if prog == "async_rl.py dry-run":  # its names: the positional words before the first option
        names = list(itertools.takewhile(lambda w: not w.startswith("-"), words[words.index("dry-run") + 1:]))
        assert names and all(n in async_rl.RUNS for n in names), f"async_rl.py has no row among {names}"
        return [tuple(async_rl.command(async_rl.RUNS[n], 3, f"{out}/{n}", None, cpu=True)) for n in names]
    if prog in ("two_nodes.py", "two_nodes_kill.py"):  # its runs (the kill's: two_nodes_socket, saving every step)
        gpus = int(words[words.index("--gpus") + 1]) if "--gpus" in words else 4
        names = [w for w in words[words.index("run") + 1:] if w in two_nodes.RUNS] if "run" in words else []
        extra = two_nodes_kill.CKPT_ARGS if prog == "two_nodes_kill.py" else ()
        return [two_nodes_trainer(two_nodes.RUNS[n], gpus, models, out, extra)
                for n in names or (["two_nodes_socket"] if extra else list(two_nodes.RUNS))]
    if prog == "startup_bench.py smol":
        return [tuple(startup_bench.smol_command(f"{out}/startup_smol_cold", "/tmp/smol", cpu=True))]
    if prog == "agent_tools.py run":  # --dry prints the stage's GPU command: checked as the GPU runs it
        ns = argparse.Namespace(out=out, model="/tmp/smol", traces=2000, rl_steps=20, rl_time_s=240)
        stage = agent_tools.STAGES[words[words.index("run") + 1]]
        check_command(tuple(stage.command(ns)), gpu=True)
    if prog.startswith("hybridrl.trainer.demo"):
        return [argv]
    return []


def two_nodes_trainer(run: two_nodes.Run, gpus: int, models: str, out: str, extra: tuple[str, ...]) -> tuple[str, ...]:
    """The trainer command `launch/ray_start.sh run` starts for a two_nodes.py run: its layout's trainer.nnodes and
    n_gpus_per_node (dp = the GPU count: the batch must split over it), then the job's arguments."""
    layout = ("trainer.backend=ray", f"trainer.nnodes={run.nodes}",
              f"trainer.n_gpus_per_node={two_nodes.gpus_per_node(gpus, run.nodes)}")
    args = two_nodes.job_args(True, f"{models}/m", ("/d/train.parquet", "/d/test.parquet"), f"{out}/ckpt", extra)
    return (sys.executable, "-m", "hybridrl.trainer.main_ppo", *layout, *args)


def check_demo(argv: tuple[str, ...]) -> None:
    """The demo CLI's command line: its own options parsed, its config (with the paths it gives) validated."""
    words = list(argv[argv.index("hybridrl.trainer.demo") + 1:])
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sft-steps", type=int)
    parser.add_argument("--config-name", default="demo")
    args, overrides = parser.parse_known_args(words)
    assert all("=" in o and not o.startswith("-") for o in overrides), overrides
    check_trainer("hybridrl.trainer.main_ppo", [
        "--config-name", args.config_name, f"data.train_files={args.out}/data/train.parquet",
        f"data.val_files={args.out}/data/test.parquet", f"actor_rollout_ref.model.path={args.out}/model", *overrides],
        gpu=False)


# ------------------------------------------------------------------------------------------------ the table's lists
def test_rows_without_a_dry_run_are_known():
    assert {r.name for r in runs.ALL if not r.cpu} == NO_DRY


def test_every_path_runs_once_for_real():
    """Each dry row is in one path; each path has exactly one row that runs for real, the others resolve (a path
    of ELSEWHERE rows only: none, another test runs it)."""
    assert sorted(n for names in PATHS.values() for n in names) == sorted(DRY)
    assert set(ELSEWHERE) <= set(DRY) and not set(ELSEWHERE) & set(REAL)
    for names in PATHS.values():
        assert len([n for n in names if n in REAL]) == (0 if all(n in ELSEWHERE for n in names) else 1), names
    assert PREFERRED <= set(REAL), PREFERRED - set(REAL)
    # the two_nodes rows that resolve: what two_nodes.py runs differently for them is the node count (one_node) or
    # the NCCL_* settings, which on CPU reach only gloo processes (per_node_hostid sets NCCL_HOSTID)
    base = two_nodes.RUNS["two_nodes_socket"]
    for name, r in two_nodes.RUNS.items():
        differ = {k for k in r.env.keys() | base.env.keys() if r.env.get(k) != base.env.get(k)}
        assert all(k.startswith("NCCL_") for k in differ) and r.nodes in (1, 2), (name, differ)
    assert two_nodes.CPU_JOB[:2] == ["--config-name", "demo"]
    # the _2gpu rows: the 4-GPU row's command with --gpus 2 and a folder of their own; on CPU that is two nodes of
    # one worker process (one node of two), dp 2 (tests/e2e/test_two_nodes.py's layout) where the 4-GPU form has 4
    for name in (n for n in DRY if n.startswith("two_nodes_") and n.endswith("_2gpu")):
        def argvs(row: str) -> list[tuple[str, ...]]:
            return [argv for a in runs.actions(row, "/OUT", True) for argv in a.commands()]
        halved = [tuple(w.replace("/OUT/two_nodes_2gpu", "/OUT/two_nodes") for w in argv) for argv in argvs(name)]
        full = [tuple("2" if (i and argv[i - 1] == "--gpus") else w for i, w in enumerate(argv))
                for argv in argvs(name.removesuffix("_2gpu"))]
        assert halved == full, (name, halved, full)


def test_shared_models_have_builders():
    """Every shared model folder a row names is built by a row that runs before it, and that row builds it."""
    models = "/MODELS"
    for name in RUN:
        for folder in re.findall(r"/MODELS/([\w.]+)", repr(listing(name, "/OUT", models))):
            assert folder in BUILDERS, (name, folder)
    for folder, builder in BUILDERS.items():
        argvs = [a.argv for a in listing(builder, "/OUT", models) if hasattr(a, "argv")]
        assert any("model" in argv and f"{models}/{folder}" in argv for argv in argvs), (builder, folder)


@pytest.mark.parametrize("name", DRY)
def test_resolve(name):
    assert resolve(name) >= 1


def broken(name: str, break_argv: Callable[[tuple[str, ...]], tuple[str, ...]]) -> runner.Run:
    """The row with every command changed by break_argv."""
    row = runs.RUNS[name]

    def steps(c: runner.Context) -> runner.Actions:
        gen, result = row.steps(c), None
        while True:
            try:
                action = gen.send(result)
            except StopIteration:
                return
            if hasattr(action, "argv"):
                action = dataclasses.replace(action, argv=break_argv(action.argv))
            result = yield action
    return dataclasses.replace(row, steps=steps)


BREAKS = {  # how -> (the change to every command of the row, what the failure must name)
    "a trainer key misspelt": (lambda argv: tuple(a.replace("ppo_mini_batch_size=", "ppo_mini_batchsize=") for a in argv),
                               "ppo_mini_batchsize"),
    "a trainer value out of range": (
        lambda argv: (*argv, "actor_rollout_ref.rollout.n=0") if "hybridrl.trainer.main_ppo" in argv else argv, "rollout.n"),
    "a runner option unknown": (lambda argv: (*argv, "--no-such-option"), "--no-such-option"),
    "a runner's row unknown": (lambda argv: tuple("fully_async_2_3" if a == "fully_async_2_2" else a for a in argv),
                               "fully_async_2_3"),
    "a demo override of no key": (lambda argv: (*argv, "trainer.no_such_key=1"), "no_such_key"),
}


@pytest.mark.parametrize("name, how", [
    ("grpo_2gpu_dp", "a trainer key misspelt"), ("scale_7b", "a trainer value out of range"),
    ("four_gpu_tiny_search", "a runner option unknown"), ("async_rl_fully_async_2_2", "a runner's row unknown"),
    ("lora_smol_full", "a demo override of no key"),
])
def test_a_broken_row_fails_to_resolve(name, how, monkeypatch):
    """A row that only resolves (it does not run here) and whose command or config is broken fails test_resolve,
    naming what is broken."""
    assert name not in REAL
    change, named = BREAKS[how]
    assert resolve(name)  # as the table has it
    monkeypatch.setitem(runs.RUNS, name, broken(name, change))
    with pytest.raises((AssertionError, ConfigError), match=re.escape(named)):
        resolve(name)


@pytest.mark.parametrize("name", RUN)
def test_dry_run(name, table):
    """Level "run": the row's dry run for real, and what it wrote."""
    r = table.result(name)
    assert r.rc == 0, f"{name}: rc={r.rc}\n{r.stdout[-4000:]}"
    assert f"runs.py dry {name}:" in r.stdout
    failed = [m for m in re.findall(r"^== (\S+) rc=(\d+)", r.stdout, re.M) if m[1] != "0"]
    assert not failed, failed
    check = next((f for prefix, f in CHECKS.items() if name.startswith(prefix)), None)
    assert check is not None, f"{name}: no check of what its dry run writes (CHECKS)"
    check(r)
