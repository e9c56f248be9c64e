"""GPU host: one worker per GPU with NCCL, an all-reduce through the worker group (Ray and torchrun),
and colocated roles sharing a CUDA tensor. Skipped without CUDA; run by hand on the GPU host:

    python -m pytest -q tests/dist/test_controller_gpu.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.dist,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

HELPERS = Path(__file__).parent.parent / "dist" / "controller_helpers"
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HELPERS))
import controller_workers as cw  # noqa: E402

TIMEOUT_S = 240


@pytest.fixture(scope="module")
def gpus():
    ray = pytest.importorskip("ray")
    from hybridrl.controller import init_ray

    n = torch.cuda.device_count()
    ray.cloudpickle.register_pickle_by_value(cw)
    init_ray(num_cpus=max(4, 2 * n), num_gpus=n, address="local", extra_env={"NCCL_NVLS_ENABLE": "0"})
    yield n
    ray.shutdown()


@pytest.mark.timeout(420)
def test_ray_one_worker_per_gpu_nccl_allreduce(gpus):
    from hybridrl.controller import RayWorkerGroup, ResourcePool

    pool = ResourcePool([gpus], use_gpu=True, name="gpus")
    wg = RayWorkerGroup(pool, cw.RowWorker, role="gpu", call_timeout_s=TIMEOUT_S)
    try:
        assert wg.allreduce_sum(0.5) == [sum(r + 0.5 for r in range(gpus))] * gpus
        places = wg.placement()
        assert {p["backend"] for p in places} == {"nccl"}
        assert len({p["gpu_uuid"] for p in places}) == gpus  # one physical GPU per actor
        # every actor sees the whole node (so NCCL can use P2P/NVLink between them) and selects its own GPU
        assert all(p["sees_gpus"] == gpus for p in places), places
        assert [p["local_rank_env"] for p in places] == [p["device"].split(":")[1] for p in places]
    finally:
        wg.shutdown()
        pool.release()


@pytest.mark.timeout(420)
def test_colocated_roles_share_a_cuda_tensor(gpus):
    from hybridrl.controller import ResourcePool, spawn_colocated

    pool = ResourcePool([1], use_gpu=True, name="fused")
    groups = spawn_colocated(pool, {"actor": cw.ActorRole, "critic": cw.CriticRole}, call_timeout_s=TIMEOUT_S)
    try:
        assert groups["actor"].make_weights(1024, on_device=True) == groups["critic"].peek_actor()
    finally:
        groups["actor"].shutdown()
        pool.release()


@pytest.mark.timeout(420)
def test_torchrun_nccl_allreduce(gpus, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={gpus}", "--standalone",
           str(HELPERS / "run_local_gpu.py"), str(tmp_path)]
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=360)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(gpus)]
    expected = [sum(r + 0.5 for r in range(gpus))] * gpus
    assert all(res["sums"] == expected for res in results)
    assert [p["device"] for p in results[0]["placement"]] == [f"cuda:{r}" for r in range(gpus)]
