"""launch/torchrun.sh and launch/ray_start.sh: the commands they build (dry run), their refusals, and one real
2-process torchrun that reaches main_ppo with the launcher's arguments."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = ROOT / "launch" / "torchrun.sh"
RAY_START = ROOT / "launch" / "ray_start.sh"
pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]


def _run(script: Path, *args: str, timeout: float = 30, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "GLOO_", "MASTER_", "NNODES", "NODE_RANK"))}
    return subprocess.run(["bash", str(script), *args], cwd=ROOT, env={**base, **env}, capture_output=True, text=True,
                          timeout=timeout)


def _dry(script: Path, *args: str, **env: str) -> tuple[dict[str, str], list[str]]:
    out = _run(script, *args, HYBRIDRL_DRY_RUN="1", **env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    env_lines = dict(line.split("=", 1) for line in lines[:-1])
    return env_lines, shlex.split(lines[-1])


def test_torchrun_one_node():
    env, cmd = _dry(TORCHRUN, "preset=cpu_2proc", "data.train_files=[a.parquet, b.parquet]", NPROC_PER_NODE="2",
                    PYTHON="py")
    assert cmd == ["py", "-m", "hybridrl.torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=2",
                   "--max_restarts=0", "-m", "hybridrl.trainer.main_ppo", "trainer.backend=local", "trainer.nnodes=1",
                   "trainer.n_gpus_per_node=2", "preset=cpu_2proc", "data.train_files=[a.parquet, b.parquet]"]
    assert env["NCCL_NVLS_ENABLE"] == "0"


def test_torchrun_two_nodes_passes_network_settings():
    env, cmd = _dry(TORCHRUN, "x=1", NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1", MASTER_PORT="29123",
                    NPROC_PER_NODE="8", NCCL_SOCKET_IFNAME="ib0", GLOO_SOCKET_IFNAME="ib0", NCCL_IB_DISABLE="1",
                    NCCL_NET_GDR_LEVEL="PHB", NCCL_NVLS_ENABLE="1")
    assert cmd[3:11] == ["--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=29123",
                         "--nproc_per_node=8", "--max_restarts=0", "-m", "hybridrl.trainer.main_ppo"]
    assert cmd[11:] == ["trainer.backend=local", "trainer.nnodes=2", "trainer.n_gpus_per_node=8", "x=1"]
    assert env == {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0", "NCCL_IB_DISABLE": "1",
                   "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_NVLS_ENABLE": "1", "NCCL_DEBUG": "WARN"}


@pytest.mark.parametrize("env, message", [
    ({"NNODES": "2", "NPROC_PER_NODE": "8"}, "needs MASTER_ADDR"),
    ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "h", "NPROC_PER_NODE": "8"}, "NODE_RANK=2 must be in 0..1"),
    ({"NPROC_PER_NODE": "two"}, "not a positive integer"),
])
def test_torchrun_refuses_incomplete_settings(env, message):
    out = _run(TORCHRUN, "x=1", **env)
    assert out.returncode == 2 and message in out.stderr


def test_torchrun_really_starts_two_ranks_of_main_ppo(tmp_path):
    """`--cfg job` makes main_ppo print its resolved config and exit: both ranks run it with the launcher's keys."""
    out = _run(TORCHRUN, "--cfg", "job", "preset=cpu_2proc", "data.train_batch_size=8",
               "actor_rollout_ref.actor.ppo_mini_batch_size=4", timeout=100, NPROC_PER_NODE="2", PYTHON=sys.executable,
               TORCHRUN_ARGS=f"--log-dir {tmp_path} --redirects 1")  # each rank's stdout in its own file
    assert out.returncode == 0, out.stderr[-3000:]
    logs = sorted(tmp_path.rglob("stdout.log"))
    assert len(logs) == 2
    for log in logs:
        tree = yaml.safe_load(log.read_text())
        assert tree["trainer"]["backend"] == "local" and tree["trainer"]["n_gpus_per_node"] == 2
        assert tree["trainer"]["device"] == "cpu" and tree["data"]["train_batch_size"] == 8


def test_ray_start_submits_with_the_controllers_runtime_env(tmp_path):
    (tmp_path / "reward.py").write_text("def compute_score(*a): return 0\n")
    (tmp_path / "model.safetensors").write_bytes(b"0" * 16)
    env, cmd = _dry(RAY_START, "preset=70b_32gpu", RAY_ADDRESS="http://127.0.0.1:8265", NNODES="4",
                    GPUS_PER_NODE="8", WORKING_DIR=str(tmp_path), PYTHON=sys.executable, NCCL_IB_HCA="mlx5_0",
                    HF_TOKEN="hf_secret", SUBMIT_ARGS="--no-wait")
    assert cmd[:3] == ["ray", "job", "submit"] and cmd[3] == "--address=http://127.0.0.1:8265"
    runtime_env = json.loads(cmd[4][len("--runtime-env-json="):])
    assert runtime_env["working_dir"] == str(tmp_path) and "*.safetensors" in runtime_env["excludes"]
    assert runtime_env["env_vars"]["NCCL_IB_HCA"] == "mlx5_0" and "HF_TOKEN" not in runtime_env["env_vars"]
    assert cmd[5:] == ["--no-wait", "--", "python", "-m", "hybridrl.trainer.main_ppo", "trainer.backend=ray",
                       "trainer.nnodes=4", "trainer.n_gpus_per_node=8", "preset=70b_32gpu"]
    assert "hf_secret" not in " ".join(cmd) and env["NCCL_IB_HCA"] == "mlx5_0"


def test_ray_start_needs_an_address():
    out = _run(RAY_START, "x=1", RUNTIME_ENV_JSON="{}")
    assert out.returncode == 2 and "RAY_ADDRESS" in out.stderr


def test_ray_start_keeps_head_only_flags_off_a_worker():
    args = "--include-dashboard true --min-worker-port=21000"
    _, head = _dry(RAY_START, "head", RAY_START_ARGS=args)
    _, worker = _dry(RAY_START, "worker", RAY_ADDRESS="10.0.0.1:6379", RAY_START_ARGS=args)
    assert head[-3:] == ["--include-dashboard", "true", "--min-worker-port=21000"]
    assert "--include-dashboard=false" not in head  # the user's choice, not a second flag
    assert worker == ["ray", "start", "--address=10.0.0.1:6379", "--disable-usage-stats", "--min-worker-port=21000"]
    out = _run(RAY_START, "head", RAY_START_ARGS="--port 6380")
    assert out.returncode == 2 and "set RAY_PORT" in out.stderr
