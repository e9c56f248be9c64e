"""The single controller on a local Ray cluster (4 CPU slots on 2 cores), and the same workers under torchrun.

One Ray cluster for the module; the pools (CPU shares per process in brackets):
  mesh   [4 x 0.25]  TPWorker, a 2 x 2 (tp x dp) gloo mesh
  A      [2 x 0.5]   "actor" + "critic" fused in one process per slot
  B      [2 x 0.5]   "rows" and a separate "critic" group sharing the slots (max_colocate_count=2)
  victim [2 x 0.25]  failure tests (a constructor that raises, a timeout, kill -9)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import torch

from hybridrl.controller import (
    RayWorkerGroup,
    ResourcePool,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
    init_ray,
    make_worker_group,
    spawn_colocated,
)

HELPERS = Path(__file__).parent / "controller_helpers"
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HELPERS))
import controller_workers as cw  # noqa: E402

pytestmark = pytest.mark.dist
CALL_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster():
    # The helper module is not importable by name inside Ray workers: ship its classes by value.
    ray.cloudpickle.register_pickle_by_value(cw)
    init_ray(num_cpus=4, address="local")  # always a fresh cluster, never one found on the machine
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def mesh(cluster):
    pool = ResourcePool([4], num_cpus_per_process=0.25, name="mesh")
    wg = RayWorkerGroup(pool, cw.TPWorker, role="tp", call_timeout_s=CALL_TIMEOUT_S)
    wg.init_mesh(2)
    yield wg
    wg.shutdown()
    pool.release()


@pytest.fixture(scope="module")
def pools(cluster):
    pool_a = ResourcePool([2], num_cpus_per_process=0.5, name="A")
    pool_b = ResourcePool([2], num_cpus_per_process=0.5, max_colocate_count=2, name="B")
    fused = spawn_colocated(pool_a, {"actor": cw.ActorRole, "critic": cw.CriticRole}, call_timeout_s=CALL_TIMEOUT_S)
    rows = RayWorkerGroup(pool_b, cw.RowWorker, (3,), role="rows", call_timeout_s=CALL_TIMEOUT_S)
    critic = make_worker_group("ray", cw.CriticRole, role="critic", resource_pool=pool_b, call_timeout_s=CALL_TIMEOUT_S)
    yield {"actor": fused["actor"], "critic": fused["critic"], "rows": rows, "critic_b": critic}
    for p in (pool_a, pool_b):
        p.release()


@pytest.mark.timeout(120)
def test_four_workers_in_two_pools(pools):
    rows, actor = pools["rows"].info(), pools["actor"].whoami()
    assert [(i["rank"], i["world_size"], i["local_rank"], i["role"], i["env_rank"], i["scale"]) for i in rows] == [
        (0, 2, 0, "rows", 0, 3), (1, 2, 1, "rows", 1, 3)]
    assert [(role, rank) for role, rank, _ in actor] == [("actor", 0), ("actor", 1)]
    pids = [i["pid"] for i in rows] + [pid for _, _, pid in actor]
    assert len(set(pids)) == 4 and pids == pools["rows"].pids + pools["actor"].pids
    assert pools["rows"].echo([1, 2], tag=["a", "b"]) == [(0, 1, "a"), (1, 2, "b")]
    assert pools["rows"].only_zero() == 0 and pools["rows"].rank_plus(10) == 10  # user mode: even ranks


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rows,group", [(7, "rows"), (5, "rows"), (5, "mesh"), (7, "mesh")])
def test_dp_compute_proto_matches_one_process(pools, mesh, rows, group):
    wg = mesh if group == "mesh" else pools["rows"]
    data = cw.make_rows(rows, seed=rows)
    out, ref = wg.compute(data), cw.row_fn(data)
    assert len(out) == rows
    assert torch.equal(out.batch["y"], ref.batch["y"]) and out.batch["row_id"].tolist() == list(range(rows))
    assert list(out.non_tensor_batch["src"]) == list(ref.non_tensor_batch["src"]) and out.meta_info == {"step": 3}


@pytest.mark.timeout(120)
def test_mesh_2x2_only_collecting_ranks_return(mesh):
    assert [(d.dp_rank, d.dp_size, d.is_collect) for d in mesh.dispatch_info()] == [
        (0, 2, True), (0, 2, False), (1, 2, True), (1, 2, False)]
    data = cw.make_rows(5, seed=2)
    out = mesh.forward(data)
    assert torch.equal(out.batch["y"], cw.tp_reference(data))  # real tp all-reduce inside the method
    assert out.batch["src_tp_rank"].tolist() == [0] * 5  # only tp rank 0 of each dp group sent rows
    assert out.batch["src_dp_rank"].tolist() == [0, 0, 0, 1, 1] and out.batch["row_id"].tolist() == list(range(5))
    seen = mesh.last_rows()
    assert seen[0] == seen[1] == [0, 1, 2] and seen[2] == seen[3] == [3, 4, 0]  # a dp group shares its slice (+1 pad)


@pytest.mark.timeout(120)
def test_colocated_roles_share_process_and_tensors(pools):
    actor, critic = pools["actor"], pools["critic"]
    assert actor.pids == critic.pids
    made, peeked = actor.make_weights(8), critic.peek_actor()
    assert made == peeked  # same pid, same Python object (id), same storage (data_ptr) on every rank
    first, second = actor.init_dist(), critic.init_dist()
    assert [f[0] for f in first] == [True, True] and [s[0] for s in second] == [False, False]  # once per process
    assert [s[1:] for s in second] == [(0, 2), (1, 2)]
    data = cw.make_rows(7)
    for g in (critic, pools["critic_b"]):  # fused critic and a critic in its own pool
        assert torch.equal(g.update_critic(data).batch["y"], cw.row_fn(data).batch["y"])
    assert set(pools["critic_b"].pids).isdisjoint(critic.pids)


@pytest.mark.timeout(120)
def test_every_role_process_profiles_a_step_once(pools, tmp_path):
    """global_profiler through the groups: the fused actor + critic processes open one window each (the second
    role's call is a no-op), and the critic group of its own pool has its own; each process writes one table."""
    from hybridrl.trainer.profiling import StepProfile

    prof = StepProfile([pools["actor"], pools["critic"], pools["critic_b"]], [4], str(tmp_path))
    prof.open(4)
    assert pools["rows"].allreduce_sum(0.5) == [2.0, 2.0]  # some work in the window (another group's processes)
    assert prof.close(4)["profile/active"] == 1.0
    names = sorted(os.listdir(tmp_path / "step_4"))
    tables = [n for n in names if n.endswith(".txt")]
    assert tables == ["actor_rank0.txt", "actor_rank1.txt", "critic_rank0.txt", "critic_rank1.txt", "driver.txt"], names
    assert all((tmp_path / "step_4" / n).read_text().startswith("step 4:") for n in tables)


@pytest.mark.timeout(120)
def test_allreduce_through_the_group(pools):
    assert pools["rows"].allreduce_sum(0.5) == [2.0, 2.0]  # (0 + .5) + (1 + .5) over gloo


@pytest.mark.timeout(120)
def test_worker_exception_shows_remote_traceback_with_rank_and_role(pools):
    with pytest.raises(WorkerError) as err:
        pools["rows"].fail_on(1)
    e = err.value
    assert (e.rank, e.role, e.method) == (1, "rows", "fail_on") and not isinstance(e, WorkerDiedError)
    assert "'rows' rank 1" in str(e) and "deliberate failure on rank 1" in str(e)
    assert "controller_workers.py" in e.remote_traceback and "in fail_on" in e.remote_traceback
    assert pools["rows"].info()[1]["rank"] == 1  # a raising worker stays usable


@pytest.mark.timeout(180)
def test_failures_constructor_timeout_and_kill9(cluster):
    pool = ResourcePool([2], num_cpus_per_process=0.25, name="victim")
    try:
        with pytest.raises(WorkerError, match=r"'broken' rank 1 .*cannot build on rank 1") as err:
            RayWorkerGroup(pool, cw.BrokenInit, role="broken", call_timeout_s=CALL_TIMEOUT_S)
        assert "BrokenInit.__init__" in str(err.value)
        check_kill9(RayWorkerGroup(pool, cw.RowWorker, role="victim", call_timeout_s=CALL_TIMEOUT_S))
    finally:
        pool.release()


def check_kill9(wg: RayWorkerGroup) -> None:
    with pytest.raises(WorkerTimeoutError, match=r"rank\(s\) \[0, 1\] did not finish within 1"):
        wg.get(wg.sleep(3), timeout=1)

    pending = wg.sleep(120)  # queued behind the 3 s sleep; rank 1 is killed while it waits or sleeps
    start = time.monotonic()
    os.kill(wg.pids[1], signal.SIGKILL)
    with pytest.raises(WorkerDiedError) as err:
        wg.get(pending)
    assert time.monotonic() - start < 60
    e = err.value
    assert (e.rank, e.role) == (1, "victim") and f"pid {wg.pids[1]}" in str(e) and "died" in str(e)
    with pytest.raises(WorkerDiedError, match="rank 1"):
        wg.info()
    wg.shutdown()
    with pytest.raises(WorkerDiedError, match="shut down"):
        wg.info()


@pytest.mark.timeout(60)
def test_pool_that_cannot_be_placed_fails_fast(cluster):
    pool = ResourcePool([2], use_gpu=True, name="no_gpus", ready_timeout_s=2)
    with pytest.raises(RuntimeError, match=r"'no_gpus': could not reserve \[2\] slots .*GPU.* within 2 s"):
        RayWorkerGroup(pool, cw.RowWorker, role="x")
    with pytest.raises(RuntimeError, match="already hosts 1 group"):
        full = ResourcePool([1], num_cpus_per_process=0.01, name="one")
        g = RayWorkerGroup(full, cw.BrokenInit, (5,), role="one")
        try:
            RayWorkerGroup(full, cw.BrokenInit, (5,), role="two")
        finally:
            g.shutdown()
            full.release()


LIST_UPLOAD = """
import sys, ray
from pathlib import Path
from hybridrl.controller import init_ray

@ray.remote(num_cpus=0)
def listing():
    return sorted(str(p.relative_to(Path.cwd())) for p in Path.cwd().rglob("*") if p.is_file())

init_ray(address=sys.argv[1], working_dir=sys.argv[2])
print("FILES", ray.get(listing.remote(), timeout=60))
"""


@pytest.mark.timeout(120)
def test_runtime_env_leaves_weights_out_of_the_upload(cluster, tmp_path):
    job = tmp_path / "job"
    (job / "checkpoints").mkdir(parents=True)
    (job / "reward_fn.py").write_text("def score(x):\n    return 1.0\n")
    (job / "model.safetensors").write_bytes(os.urandom(10 * 1024 * 1024))
    (job / "checkpoints" / "actor.pt").write_bytes(b"0" * 1024)
    # A second driver joins this cluster with the job-level runtime env (Ray uploads working_dir per job).
    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", LIST_UPLOAD, address, str(job)], env=env, capture_output=True,
                          text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "FILES ['reward_fn.py']" in proc.stdout


@pytest.mark.timeout(180)
def test_torchrun_backend_runs_the_same_workers(pools, mesh, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           str(HELPERS / "run_local.py"), str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert sorted(results) == [0, 1] and results[0] == results[1]  # every rank's driver saw the same
    local = results[0]

    dp7 = pools["rows"].compute(cw.make_rows(7, seed=1))
    mesh5 = mesh.forward(cw.make_rows(5, seed=2))
    assert local["dp7_y"] == dp7.batch["y"].tolist() and local["dp7_row_id"] == dp7.batch["row_id"].tolist()
    assert local["dp7_src"] == list(dp7.non_tensor_batch["src"])
    assert local["mesh5_y"] == mesh5.batch["y"].tolist() and local["mesh5_src_tp"] == [0] * 5  # tp2 x dp1 there
    assert local["info"] == [[0, 2, "rows"], [1, 2, "rows"]]
    assert local["rank_zero"] == pools["rows"].only_zero() and local["even_sum"] == pools["rows"].rank_plus(10)
    assert local["colocated_same"] is True
    assert local["error"] == {"rank": 1, "role": "rows", "method": "fail_on", "traceback_has_line": True}
