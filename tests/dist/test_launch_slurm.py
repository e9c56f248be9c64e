"""launch/slurm/ray_job.sbatch on a simulated 2-node allocation.

Stand-ins for sbatch, srun, scontrol and ray (tests/dist/launch_helpers/) run every "node" as local processes:
srun runs its command with SLURMD_NODENAME set to the node, the ray stand-in registers that node and blocks like
`ray start --block`, and `ray status` reports the GPUs of the nodes that joined. The job command is a stand-in
that records its node, arguments and environment.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent / "launch_helpers"
SCRIPT = ROOT / "launch" / "slurm" / "ray_job.sbatch"
pytestmark = [pytest.mark.dist, pytest.mark.timeout(60)]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NCCL_", "RAY_"))}
    env.update(PATH=f"{HELPERS}{os.pathsep}{env['PATH']}", STANDIN_STATE=str(state), STANDIN_LOG=str(tmp_path / "log"),
               JOB_CMD=str(HELPERS / "fake_job.sh"), POLL_INTERVAL="0.2", STOP_GRACE="5", HEAD_IP="10.1.2.3",
               HYBRIDRL_ROOT=str(ROOT))
    env.update(extra)
    return env


def _sbatch(tmp_path: Path, *args: str, timeout: float = 30, **extra: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    out = subprocess.run(["sbatch", "--nodes=2", str(SCRIPT), *args], cwd=ROOT, env=_env(tmp_path, **extra),
                         capture_output=True, text=True, timeout=timeout)
    return out, time.monotonic() - start


def _log(tmp_path: Path) -> list[str]:
    return (tmp_path / "log").read_text().splitlines()


def _job(tmp_path: Path) -> list[str]:
    return (tmp_path / "state" / "job.txt").read_text().splitlines()


def _alive(pid_file: Path) -> bool:
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _assert_all_stopped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    deadline = time.monotonic() + 5
    pid_files = [*state.glob("pid-*"), *state.glob("job.pid")]
    while any(_alive(p) for p in pid_files) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p.name for p in pid_files if _alive(p)], "processes left running"


def test_head_workers_join_job_runs_and_cleanup(tmp_path):
    out, _ = _sbatch(tmp_path, "preset=32b_16gpu", "data.train_files=[a.parquet, b.parquet]", NCCL_SOCKET_IFNAME="ib0")
    assert out.returncode == 0, out.stderr
    log = _log(tmp_path)
    head = [line for line in log if line.startswith("ray head ")]
    worker = [line for line in log if line.startswith("ray worker ")]
    assert len(head) == 1 and head[0].startswith("ray head node1 ") and "--port=6379" in head[0]
    assert "--dashboard-host=127.0.0.1" in head[0] and "--num-gpus=8" in head[0]
    assert len(worker) == 1 and worker[0].startswith("ray worker node2 ") and "--address=10.1.2.3:6379" in worker[0]
    # the worker starts only after the head answers, the job only after all 16 GPUs joined
    assert log.index(head[0]) < log.index(worker[0])
    assert "16 of 16 GPUs joined" in out.stderr and "all 2 node(s) joined" in out.stderr
    job = _job(tmp_path)
    assert job[0] == "node=node1" and "RAY_ADDRESS=10.1.2.3:6379" in job
    assert "NCCL_NVLS_ENABLE=0" in job and "NCCL_SOCKET_IFNAME=ib0" in job  # reaches the job step
    args = [line[len("arg="):] for line in job if line.startswith("arg=")]
    assert args == ["trainer.backend=ray", "trainer.nnodes=2", "trainer.n_gpus_per_node=8", "preset=32b_16gpu",
                    "data.train_files=[a.parquet, b.parquet]"]
    # cleanup: ray stop on both nodes, after the job
    assert {"ray stop node1", "ray stop node2"} <= set(log)
    assert max(log.index("ray stop node1"), log.index("ray stop node2")) > log.index(head[0])
    _assert_all_stopped(tmp_path)


def test_job_exit_status_is_the_scripts(tmp_path):
    out, _ = _sbatch(tmp_path, "x=1", STANDIN_JOB_EXIT="7")
    assert out.returncode == 7 and "the job exited with status 7" in out.stderr
    assert "ray stop node2" in _log(tmp_path)


def test_node_failure_fails_fast_naming_the_node(tmp_path):
    out, seconds = _sbatch(tmp_path, "x=1", STANDIN_FAIL_NODE="node2", STANDIN_FAIL_AFTER="2",
                           STANDIN_JOB_SECONDS="120")
    assert out.returncode != 0
    assert seconds < 30
    assert "FAILED: Ray worker on node node2 exited with status 1" in out.stderr
    assert (tmp_path / "state" / "job.txt").exists()  # the job had started; it was stopped, not awaited
    assert "stopping the job step" in out.stderr and "ray stop node1" in _log(tmp_path)
    _assert_all_stopped(tmp_path)


def test_node_that_never_joins_times_out(tmp_path):
    out, seconds = _sbatch(tmp_path, "x=1", STANDIN_NO_JOIN="node2", RAY_JOIN_TIMEOUT="2")
    assert out.returncode != 0 and seconds < 20
    assert "8 of 16 GPUs joined" in out.stderr and "timed out after 2s waiting for 16 GPUs on 2 node(s)" in out.stderr
    assert not (tmp_path / "state" / "job.txt").exists()
    _assert_all_stopped(tmp_path)


def test_scancel_stops_job_and_ray(tmp_path):
    proc = subprocess.Popen(["sbatch", "--nodes=2", str(SCRIPT), "x=1"], cwd=ROOT,
                            env=_env(tmp_path, STANDIN_JOB_SECONDS="120"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    job = tmp_path / "state" / "job.txt"
    deadline = time.monotonic() + 20
    while not job.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert job.exists(), proc.communicate(timeout=10)
    proc.send_signal(signal.SIGTERM)  # what scancel and the time limit send to the batch script
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 143 and "terminated" in err
    assert {"ray stop node1", "ray stop node2"} <= set(_log(tmp_path))
    _assert_all_stopped(tmp_path)


def test_cpu_cluster_waits_for_cpus(tmp_path):
    out, _ = _sbatch(tmp_path, "preset=cpu_2proc", GPUS_PER_NODE="0", CPUS_PER_NODE="4", WORKERS_PER_NODE="2")
    assert out.returncode == 0, out.stderr
    assert "8 of 8 CPUs joined" in out.stderr and "arg=trainer.n_gpus_per_node=2" in _job(tmp_path)


def test_head_only_ray_start_args_reach_the_head_only(tmp_path):
    """One RAY_START_ARGS serves every node: Ray's `ray start` aborts a worker given --include-dashboard (head-only),
    which ended the whole job at its first worker before."""
    out, _ = _sbatch(tmp_path, "x=1", RAY_START_ARGS="--include-dashboard=true --temp-dir=/scratch/ray "
                                                     "--redis-shard-ports 7000")
    assert out.returncode == 0, out.stderr
    log = _log(tmp_path)
    head, worker = (next(line for line in log if line.startswith(f"ray {role} ")) for role in ("head", "worker"))
    assert head.endswith("--include-dashboard=true --temp-dir=/scratch/ray --redis-shard-ports 7000")
    assert worker.endswith("--temp-dir=/scratch/ray") and "dashboard" not in worker and "7000" not in worker
    assert "--include-dashboard=true --redis-shard-ports 7000 only on the head" in out.stderr
    _assert_all_stopped(tmp_path)


def test_a_port_in_ray_start_args_is_refused_naming_ray_port(tmp_path):
    out, _ = _sbatch(tmp_path, "x=1", RAY_START_ARGS="--port=6380")
    assert out.returncode == 2 and "set RAY_PORT" in out.stderr
    assert not [line for line in _log(tmp_path) if line.startswith("ray ")]  # refused before any node started
