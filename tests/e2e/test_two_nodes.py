"""Two nodes on one host, as a cluster user launches them: the same tiny GRPO job (the CPU demo, 2 worker processes)
on two "nodes" of one worker each and on one node of two, through launch/ray_start.sh (a Ray head and a Ray worker
node it starts), launch/torchrun.sh (two torchrun launches, node ranks 0 and 1) and launch/slurm/ray_job.sbatch
(stand-in sbatch/srun/scontrol in the test's folder that start its tasks here, and the real `ray`).

What is compared: every metric of every step (wall-clock ones aside) against the one-node Ray run. Both layouts are
dp=2 over gloo in float32 with the same seeds, ranks and micro-batches, so they agree to fp32 rounding: rel 1e-5. Seen:
equal to the last digit at steps 1-2; after the resume onto a new worker node every metric equal within 1e-5 but
actor/grad_norm, 4e-6 and 1.4e-5 apart at steps 3 and 4 (a sum of squares over every gradient element, whose partial
sums' order follows each process's intra-op threading): compared within rel 1e-4. Not explained further (noted in the
issue's report): the losses of those steps agree to 1e-5.
The exception is rollout_vs_actor/logprob_*: the gap between the torch engine's and megatron's log-probs of the same
weights, fp32 rounding noise (mean ~1e-7, max 1e-6 to 2e-4 over a step's tokens) that moves with each process's
matmul threading (a Ray node of one CPU runs its worker with one thread); compared within an absolute 1e-3 (a broken
sync shows gaps of 1e-2 and more).

A node's death: the Ray worker node (its raylet and the worker process on it, one session) is killed with SIGKILL
while the job runs step 3; the job must fail within 60 s naming node 1 and its Ray node id; a new worker node joins
and the job, started again with trainer.resume_mode=auto, resumes from step 2 and reproduces the one-node run.

Every process a test starts runs in a session of its own, killed whole in a `finally`; every wait has a timeout.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.e2e.test_faults import CLOCK, SYNC_PATH, metrics_by_step, trainer_args

pytestmark = [pytest.mark.dist, pytest.mark.slow]
from procs import kill_session, raylet_node_id  # noqa: E402  (benchmarks/procs.py, on sys.path through test_faults)

ROOT = Path(__file__).resolve().parents[2]
RAY_START = ROOT / "launch" / "ray_start.sh"
TORCHRUN = ROOT / "launch" / "torchrun.sh"
SBATCH = ROOT / "launch" / "slurm" / "ray_job.sbatch"
STANDINS = ROOT / "tests" / "dist" / "launch_helpers"
LAUNCH = ROOT / "tests" / "e2e" / "fault_helpers" / "launch.py"
RAY = Path(sys.executable).parent / "ray"
STEPS = 4
NOISE = re.compile(r"^rollout_vs_actor/logprob_")  # fp32 rounding noise between two engines, see the docstring
REL = {"actor/grad_norm": 1e-4}  # see the docstring
RUN_TIMEOUT_S = 180


@pytest.fixture
def ray_tmp():
    """A short folder for Ray's session dirs (its socket paths must stay under 108 bytes; pytest's tmp_path is long)."""
    path = Path(tempfile.mkdtemp(prefix="hrl2n", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Proc:
    """A command in its own session, output in a file; `stop()` kills the whole session."""

    def __init__(self, name: str, folder: Path, cmd: list[str], env: dict[str, str]) -> None:
        self.name, self.log = name, folder / f"{name}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout} s\n{self.output[-4000:]}") from None

    def stop(self) -> None:
        kill_session(self.proc.pid)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def base_env(tmp: Path) -> dict[str, str]:
    """This Python's tools first; a Ray token of the test's own (Ray 2.60 turns token authentication on)."""
    token = tmp / "ray_token"
    if not token.exists():
        token.write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "NCCL_", "MASTER_", "SLURM"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", PYTHONPATH=str(ROOT),
               HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
               PYTHON=sys.executable)
    return env


def job_args(prepared: dict, out: Path, *extra: str) -> list[str]:
    return ["--config-name", "demo", f"data.train_files={prepared['train']}", f"data.val_files={prepared['test']}",
            f"actor_rollout_ref.model.path={prepared['model']}", f"trainer.default_local_dir={out}",
            f"trainer.total_training_steps={STEPS}", "trainer.save_freq=2", "trainer.test_freq=-1",
            "trainer.val_before_train=false", "trainer.logger=[jsonl]", "trainer.plot=false",
            "trainer.resume_mode=auto", *extra]


def assert_same_metrics(reference: dict, rows: dict, steps) -> None:
    for step in steps:
        ref, got = reference[step], rows[step]
        keys = sorted(k for k in ref if not CLOCK.match(k) and not SYNC_PATH.match(k))
        assert sorted(k for k in got if not CLOCK.match(k) and not SYNC_PATH.match(k)) == keys, f"step {step}"
        diff = {k: (got[k], ref[k]) for k in keys
                if got[k] != pytest.approx(ref[k], rel=REL.get(k, 1e-5), abs=1e-3 if NOISE.match(k) else 1e-9)}
        assert not diff, f"step {step}: (two nodes, one node) differ: {diff}"


@pytest.fixture(scope="module")
def prepared(demo_prepared):
    """The demo's data and warmed-up tiny model (tests/e2e/conftest.py: once for the session)."""
    return demo_prepared


@pytest.fixture(scope="module")
def one_node(prepared, one_node_reference):
    """The reference: the job on one node of 2 worker processes (a Ray started by the job itself), i.e.
    job_args(prepared, out, "+ray_kwargs.ray_init.address=local"): test_faults.py's uninterrupted run, the same
    command, which tests/e2e/conftest.py runs once for the session."""
    out = one_node_reference["out"]
    assert job_args(prepared, out, "+ray_kwargs.ray_init.address=local") == trainer_args(prepared, out)
    rows = one_node_reference["rows"]
    assert sorted(rows) == list(range(1, STEPS + 1))
    assert len({rows[s]["actor/pg_loss"] for s in rows}) == STEPS  # it trains: steps differ
    return rows


class RayNodes:
    """A Ray head and worker nodes on this host, each started by launch/ray_start.sh in the foreground (RAY_BLOCK=1)
    in a session of its own, with its own temp dir and ports."""

    def __init__(self, tmp: Path, ray_tmp: Path) -> None:
        self.tmp, self.ray_tmp, self.env = tmp, ray_tmp, base_env(tmp)
        self.port, client = free_ports(2)
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[Proc] = []
        self._start("head", f"--ray-client-server-port={client}")

    def _start(self, mode: str, *extra: str) -> Proc:
        i = len(self.nodes)
        agent, lo = free_ports(1)[0], 21000 + 1000 * (os.getpid() % 20) + 100 * i
        env = {**self.env, "NUM_CPUS": "1", "NUM_GPUS": "0", "RAY_BLOCK": "1", "RAY_PORT": str(self.port),
               "RAY_TEMP_DIR": str(self.ray_tmp / f"r{i}"), "NODE_IP": "127.0.0.1",
               "RAY_START_ARGS": " ".join([f"--dashboard-agent-listen-port={agent}", f"--min-worker-port={lo}",
                                           f"--max-worker-port={lo + 99}", *extra])}
        if mode == "worker":
            env["RAY_ADDRESS"] = self.address
        node = Proc(f"ray_{mode}{i}", self.tmp, ["bash", str(RAY_START), mode], env)
        self.nodes.append(node)
        self.wait_for_cpus(sum(1 for n in self.nodes if n.proc.poll() is None))
        return node

    def add_worker(self) -> Proc:
        return self._start("worker")

    def cpus(self) -> int:
        try:
            out = subprocess.run([str(RAY), "status", f"--address={self.address}"], env=self.env, capture_output=True,
                                 text=True, timeout=20)
        except subprocess.TimeoutExpired:  # the head is not up yet
            return 0
        m = re.search(r"/(\d+)\.0 CPU", out.stdout)
        return int(m.group(1)) if out.returncode == 0 and m else 0

    def wait_for_cpus(self, n: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while self.cpus() != n:
            dead = [p.name for p in self.nodes if p.proc.poll() is not None and p is self.nodes[-1]]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(p.output[-2000:] for p in self.nodes)
                raise AssertionError(f"the cluster did not reach {n} CPU(s) (dead: {dead})\n{logs}")
            time.sleep(0.5)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


def ray_job(cluster: RayNodes, name: str, args: list[str], entry: str = "") -> Proc:
    env = {**cluster.env, "RAY_ADDRESS": cluster.address, "NNODES": "2", "GPUS_PER_NODE": "1"}
    if entry:
        env["ENTRYPOINT"] = entry
    return Proc(name, cluster.tmp, ["bash", str(RAY_START), "run", *args], env)


@pytest.mark.timeout(420)
def test_ray_two_nodes_match_one_then_a_lost_node_fails_fast_and_the_job_resumes(prepared, one_node, tmp_path, ray_tmp):
    cluster = RayNodes(tmp_path, ray_tmp)
    jobs: list[Proc] = []
    try:
        worker = cluster.add_worker()
        lost_id = raylet_node_id(worker.proc.pid)
        out, flag, go = tmp_path / "ckpt", tmp_path / "paused", tmp_path / "go"
        # the driver pauses right after step 3's actor update went to the workers (marker 2)
        entry = f"{sys.executable} {LAUNCH} --flag {flag} --go {go} --pause update_actor:3:after --"
        jobs.append(job := ray_job(cluster, "job", job_args(prepared, out), entry))
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not flag.exists():
            assert job.proc.poll() is None and time.monotonic() < deadline, job.output[-4000:]
            time.sleep(0.1)
        text = job.output
        # the two per-node slot groups landed on two Ray nodes; the worker node holds pool node k (rank k)
        placed = re.search(rf"node (\d) \(\S+, \S+, Ray node {lost_id[:12]}\) x 1", text)
        assert placed, text[-4000:]
        k = int(placed.group(1))
        assert "Ray node(s); each Ray node offers more" not in text
        assert_same_metrics(one_node, metrics_by_step(out), steps=(1, 2))

        worker.stop()  # the node dies: its raylet and the worker process on it, at once
        start = time.monotonic()
        go.touch()
        rc = job.wait(90)
        took = time.monotonic() - start
        text = job.output
        assert rc != 0, text[-4000:]
        assert took < 60, f"the job took {took:.1f} s to fail\n{text[-4000:]}"
        # named: the rank on the lost node (dead, or not finishing while its peer's collective failed) and the node
        assert re.search(rf"rank(\(s\) \[| ){k}\b.*on node {k} \(\S+, \S+, Ray node {lost_id[:12]}\)", text), \
            text[-4000:]
        assert sorted(metrics_by_step(out)) == [1, 2]

        cluster.add_worker()  # a replacement node joins; the same command resumes from step 2
        jobs.append(resumed := ray_job(cluster, "resumed", job_args(prepared, out)))
        assert resumed.wait() == 0, resumed.output[-4000:]
        assert f"resumed from {out}/global_step_2 (step 2)" in resumed.output
        assert_same_metrics(one_node, metrics_by_step(out), steps=range(1, STEPS + 1))
    finally:
        for j in jobs:
            j.stop()
        cluster.stop()


@pytest.mark.timeout(300)
def test_torchrun_two_nodes_match_one(prepared, one_node, tmp_path):
    env = {**base_env(tmp_path), "NNODES": "2", "NPROC_PER_NODE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_ports(1)[0])}
    out = tmp_path / "ckpt"
    args = job_args(prepared, out, "trainer.total_training_steps=2", "trainer.save_freq=-1")
    nodes = [Proc(f"node{r}", tmp_path, ["bash", str(TORCHRUN), *args], {**env, "NODE_RANK": str(r)}) for r in (0, 1)]
    try:
        for node in nodes:
            assert node.wait() == 0, node.output[-4000:]
    finally:
        for node in nodes:
            node.stop()
    rows = metrics_by_step(out)
    assert sorted(rows) == [1, 2]
    assert_same_metrics(one_node, rows, steps=(1, 2))


RAY_STANDIN = """#!/usr/bin/env bash
# The real ray, with what makes two "nodes" share this host: each node (SLURMD_NODENAME, set by the srun stand-in)
# its own temp dir and worker ports; `ray stop` only records the call (the real one stops every Ray of this user on
# the host, other tests' too); the batch script's own clean-up stops the `ray start --block` steps.
set -euo pipefail
echo "ray $SLURMD_NODENAME $*" >>"$STANDIN_LOG"
case "$1" in
  stop) exit 0 ;;
  start)
    i="${SLURMD_NODENAME#node}"; lo=$((BASE_PORT + 100 * i))
    exec "$REAL_RAY" "$@" --temp-dir="$STANDIN_DIR/ray-$SLURMD_NODENAME" --min-worker-port="$lo" \\
      --max-worker-port=$((lo + 99)) --dashboard-agent-listen-port=$((BASE_PORT + 50 + i)) --node-ip-address=127.0.0.1 ;;
  *) exec "$REAL_RAY" "$@" ;;
esac
"""


@pytest.mark.timeout(300)
def test_slurm_script_two_nodes_match_one(prepared, one_node, tmp_path, ray_tmp):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "srun", "scontrol"):
        shutil.copy(STANDINS / name, bin_dir / name)
    (bin_dir / "ray").write_text(RAY_STANDIN)
    (bin_dir / "ray").chmod(0o755)
    out = tmp_path / "ckpt"
    gcs, dash = free_ports(2)
    env = {**base_env(tmp_path), "REAL_RAY": str(RAY), "STANDIN_DIR": str(ray_tmp), "STANDIN_LOG": str(tmp_path / "calls"),
           "BASE_PORT": str(23000 + 1000 * (os.getpid() % 10)), "HEAD_IP": "127.0.0.1", "RAY_PORT": str(gcs),
           "RAY_DASHBOARD_PORT": str(dash), "GPUS_PER_NODE": "0",
           "CPUS_PER_NODE": "1", "WORKERS_PER_NODE": "1", "POLL_INTERVAL": "0.5", "STOP_GRACE": "10",
           "RAY_JOIN_TIMEOUT": "90", "HYBRIDRL_ROOT": str(ROOT), "JOB_CMD": f"{sys.executable} -m hybridrl.trainer.main_ppo"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    args = job_args(prepared, out, "trainer.total_training_steps=2", "trainer.save_freq=-1")
    job = Proc("sbatch", tmp_path, ["sbatch", "--nodes=2", str(SBATCH), *args], env)
    try:
        rc = job.wait(240)
        text = job.output
        assert rc == 0, text[-4000:]
    finally:
        job.stop()
    assert "2 of 2 CPUs joined" in text and "the job exited with status 0" in text
    calls = (tmp_path / "calls").read_text().splitlines()
    assert any(c.startswith("ray node1 start --head") for c in calls)
    assert any(c.startswith(f"ray node2 start --block --address=127.0.0.1:{gcs}") for c in calls)
    assert {"ray node1 stop --force", "ray node2 stop --force"} <= set(calls)
    rows = metrics_by_step(out)
    assert sorted(rows) == [1, 2]
    assert_same_metrics(one_node, rows, steps=(1, 2))
