"""Every row of the run table (benchmarks/runs.py) that has a CPU dry run runs it here, as `runs.py dry NAME` does on
a machine without a GPU (issue 36): the row's own steps and commands, with the tiny models, gloo and the torch engine.
Each row's test then checks what the row wrote: its run folders, metrics and results files, or the line it prints.

Run one by one, the 44 dry runs took 33 minutes on 2 cores; here about 20, and at least 12 on 2 idle cores: they
need ~1400 CPU-seconds, two thirds of it Python start-ups and imports (benchmarks/results/run_table_dry.md). What
cuts it, without changing what a row runs:
- LANES rows at a time, each in its own process group and OUT folder: one trainer launch keeps about one core busy
  (two scale rows side by side took 23 s, one after the other 46 s). A row that needs another's output waits for
  it: the shared models' builders (BUILDERS) and the report rows' inputs (REPORTS, run over a fresh OUT holding
  links to their inputs' outputs). Rows that start Ray nodes on fixed ports run one at a time (SERIAL);
- the tiny models are built once, by the rows whose dry run builds them, and the other rows are pointed at them with
  their own knobs (SCALE_MODELS, MODEL, MODELS, four_gpu's --models), as a GPU lease points them at its staged models;
- one training step where the row has the knob (four_gpu's --steps, STEPS: 2 or 3 where its metrics need them);
- a row whose dry run is another row's with only names changed is not run twice (SAME_AS; checked by
  test_rows_run_once_are_the_same_as_another).
Rows without a CPU form are listed in NO_DRY: a new row goes into one list or the other knowingly.
"""
from __future__ import annotations

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
import four_gpu  # noqa: E402
import runs  # noqa: E402
import two_nodes  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.slow]

LANES = 2  # rows at a time (this machine: 2 cores)
ROW_TIMEOUT_S = 480
TP, RTP = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "actor_rollout_ref.rollout.tensor_model_parallel_size"

NO_DRY = set("""
adam_mem agent agent_tools_report agentgrpo async_rl_report bench checks four_gpu_14b_2gpu four_gpu_14b_4gpu
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
speed speed7b speed7bcmp te two_nodes_report update7b
""".split())

# row -> (the row whose dry run it repeats, the name changes between the two listings, in order)
SAME_AS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "scale_3b": ("scale_1.5b", [("scale_3b", "scale_1.5b"), ("scale 3b:", "scale 1.5b:"),
                                ("'shape': '3b'", "'shape': '1.5b'")]),  # the same overrides on CPU and on GPUs
    "multi_grpo": ("grpo_2gpu_tp", [("grpo_mine", "grpo_2gpu_tp")]),  # run with grpo_2gpu_tp's layout (ARGS)
    # on CPU the NCCL_* settings of the _nop2p rows (and NCCL_HOSTID) reach only gloo processes: see the test
    "two_nodes_one_node_nop2p": ("two_nodes_one_node", [("one_node_nop2p", "one_node")]),
    "two_nodes_two_nodes_nop2p": ("two_nodes_two_nodes_socket", [("two_nodes_nop2p", "two_nodes_socket")]),
}
ARGS = {"multi_grpo": ("mine", "2", f"{TP}=2", f"{RTP}=2")}
# training steps of the rows with a STEPS knob: 1, or what the row's point needs to show in its metrics
STEPS = {"scale_": "2",  # scale_report times steps 2..N (step 1 carries the start-up)
         "grpo_split_sync": "2",  # the weight broadcast after an update (step 1's is part of the start-up)
         "grpo_one_step_off": "3"}  # step 2 generated during update 1 (staleness 1), step 3 after a broadcast
BUILDERS = {"m_tiny": "multi_stage", "m_moe_tiny": "moe_1b_te_train"}  # shared model folder -> the row building it
REPORTS = {"lora_report": ("lora_7b_", "lora_smol"), "multi_report": ("parity", "grpo_"), "moe_scale_report": ("moe_",)}
SERIAL = ("two_nodes_",)  # Ray nodes on fixed worker port ranges (two_nodes.py): one such row at a time

DRY = [r.name for r in runs.ALL if r.cpu]
RUN = [name for name in DRY if name not in SAME_AS]


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
    folders = set(re.findall(re.escape(models) + r"/([\w.]+)", repr(listing(name, "/OUT", models))))
    if name.removeprefix("four_gpu_") in four_gpu.RUNS:  # four_gpu.py --models DIR: its runs use DIR/m_SHAPE
        folders.add(f"m_{four_gpu.RUNS[name.removeprefix('four_gpu_')].shape}")
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

    def __init__(self, base: Path, names: list[str]) -> None:
        self.base, self.models = base, str(base / "models")
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
                if len(self.running) >= LANES:
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
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
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


@pytest.fixture(scope="session")
def table(request, tmp_path_factory):
    """The dry rows this session's selected tests name, started at the first test that asks."""
    names = [item.callspec.params["name"] for item in request.session.items
             if getattr(item, "originalname", "") == "test_dry_run" and hasattr(item, "callspec")]
    started = time.monotonic()
    t = Table(tmp_path_factory.mktemp("run_table_dry"), names)
    yield t
    t.stop()
    print(f"\nrun table dry runs: {len(t.results)} rows in {time.monotonic() - started:.0f} s, {LANES} at a time: "
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
    m = read_json(r.out / "results" / "lora.json")["metrics"]
    for key in ("lora_sync_seconds_vs_full", "lora_sync_seconds_vs_full_awake", "lora_gap_vs_full", "lora_sync_bytes",
                "full_sync_bytes", "lora_val_score_gain", "full_val_score_gain"):
        assert m[key] is not None, key
    assert m["lora_sync_bytes"] < m["full_sync_bytes"]


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
    for name in RUN:
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
    m = read_json(r.out / "results" / "moe_scale.json")["metrics"]
    for key in ("moe_routing_agreement", "moe_routing_agreement_4gpu", "moe_routing_agreement_r3_4gpu",
                "moe_r3_gap_over_noreplay_4gpu", "moe_tokens_per_s_per_gpu_4gpu"):
        assert m[key] is not None, key


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
    name = r.name.removeprefix("two_nodes_")
    run = read_json(r.out / "two_nodes" / name / "run.json")
    assert run["rc"] == 0 and run["nodes"] == two_nodes.RUNS[name].nodes, run
    assert len(steps(r.out / "two_nodes" / name / "ckpt" / "logs" / "metrics.jsonl")) == 2


def check_reward_model(r: Result) -> None:
    m = read_json(r.out / "reward_model_dry" / "reward_model.json")["metrics"]
    assert m["steps"] == 3 and m["rm_seconds_per_step"] > 0 and m["plan_reward_bytes"] > 0, m


CHECKS: dict[str, Callable[[Result], None]] = {  # name prefix -> what the row must have written
    "scale_": check_scale, "lora_report": check_lora_report, "lora_": check_lora, "multi_stage": check_multi_stage,
    "parity": check_parity, "grpo_": check_grpo, "multi_report": check_multi_report,
    "moe_1b_te_train": check_moe_train, "moe_scale_report": check_moe_report, "moe_": check_moe_grpo,
    "four_gpu_": check_four_gpu, "async_rl_": check_async_rl, "agent_tools_": check_agent_tools,
    "two_nodes_": check_two_nodes, "reward_model": check_reward_model,
}


# ------------------------------------------------------------------------------------------------ the table's lists
def test_rows_without_a_dry_run_are_known():
    assert {r.name for r in runs.ALL if not r.cpu} == NO_DRY


def test_rows_run_once_are_the_same_as_another():
    """A row left out of test_dry_run lists the same steps and commands as the row that runs, names aside."""
    models = "/MODELS"
    for name, (same, renames) in SAME_AS.items():
        assert runs.RUNS[name].cpu and same in RUN, name
        text = repr(listing(name, "/OUT", models))
        for old, new in renames:
            assert old in text, (name, old)
            text = text.replace(old, new)
        assert text == repr(listing(same, "/OUT", models)), name
    for nop2p, base in (("one_node_nop2p", "one_node"), ("two_nodes_nop2p", "two_nodes_socket")):
        a, b = two_nodes.RUNS[nop2p], two_nodes.RUNS[base]  # what two_nodes.py runs differently for the two names
        differ = {k for k in a.env.keys() | b.env.keys() if a.env.get(k) != b.env.get(k)}
        assert a.nodes == b.nodes and differ and all(k.startswith("NCCL_") for k in differ), (nop2p, differ)
        # per_node_hostid sets NCCL_HOSTID; --cpu runs the demo job, whose ranks talk over gloo, not NCCL
    assert two_nodes.CPU_JOB[:2] == ["--config-name", "demo"]


def test_shared_models_have_builders():
    """Every shared model folder a row names is built by a row that runs before it, and that row builds it."""
    models = "/MODELS"
    for name in RUN:
        for folder in re.findall(r"/MODELS/([\w.]+)", repr(listing(name, "/OUT", models))):
            assert folder in BUILDERS, (name, folder)
    for folder, builder in BUILDERS.items():
        argvs = [a.argv for a in listing(builder, "/OUT", models) if hasattr(a, "argv")]
        assert any("model" in argv and f"{models}/{folder}" in argv for argv in argvs), (builder, folder)


@pytest.mark.parametrize("name", RUN)
def test_dry_run(name, table):
    r = table.result(name)
    assert r.rc == 0, f"{name}: rc={r.rc}\n{r.stdout[-4000:]}"
    assert f"runs.py dry {name}:" in r.stdout
    failed = [m for m in re.findall(r"^== (\S+) rc=(\d+)", r.stdout, re.M) if m[1] != "0"]
    assert not failed, failed
    check = next((f for prefix, f in CHECKS.items() if name.startswith(prefix)), None)
    assert check is not None, f"{name}: no check of what its dry run writes (CHECKS)"
    check(r)
