"""Dispatch modes, @register and the group call path, in one process (no Ray, no torch.distributed).

`InProcessGroup` runs N WorkerHosts sequentially in this process: the same planning, execution,
failure and collect code as the real backends, minus the transport.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from hybridrl.controller import (
    Dispatch,
    DispatchInfo,
    DispatchPlan,
    Execute,
    GroupFuture,
    GroupInfo,
    Worker,
    WorkerError,
    get_dispatch_mode,
    register,
    register_dispatch_mode,
    register_mesh_dispatch_mode,
)
from hybridrl.controller.decorator import registered_methods
from hybridrl.controller.dispatch import collect_outputs, plan_call
from hybridrl.controller.group import WorkerGroup
from hybridrl.controller.host import RoleSpec, WorkerHost
from hybridrl.controller.worker import DistContext
from hybridrl.protocol import DataProto

sys.path.insert(0, str(Path(__file__).parent / "controller_helpers"))
import controller_workers as cw  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_environ():
    """WorkerHost.setup publishes RANK/MASTER_PORT/... the torchrun way; keep that out of later tests."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


class InProcessGroup(WorkerGroup):
    def __init__(self, worker_cls: type, world_size: int, role: str = "w", mesh: list | None = None) -> None:
        self.hosts = []
        for r in range(world_size):
            host = WorkerHost()
            ctx = DistContext(rank=r, world_size=world_size, local_rank=r, local_world_size=world_size)
            assert host.setup(ctx, {role: RoleSpec(worker_cls)}) is None
            if mesh:
                host._roles[role].set_dispatch_info(*mesh[r])
            self.hosts.append(host)
        super().__init__(role, worker_cls, world_size, call_timeout_s=None)

    def _submit(self, method, plan):
        ret = set(plan.returning_ranks())
        return {r: self.hosts[r].execute(self.role, method, a, k, r in ret) for r, (a, k) in plan.calls.items()}

    def _gather(self, handle, method, timeout):
        return handle

    def _fetch_dispatch_info(self, mesh):
        return [h.dispatch_info(self.role, mesh) for h in self.hosts]

    def shutdown(self):
        pass


def run_mode(name: str, info: GroupInfo, fn, *args, **kwargs):
    """Plan, run `fn` per rank on its slice, collect: the dispatch contract without workers."""
    mode = get_dispatch_mode(name)
    plan = plan_call(mode, info, args, kwargs)
    outs = {r: fn(r, *a, **k) for r, (a, k) in plan.calls.items()}
    return collect_outputs(mode, info, {r: outs[r] for r in plan.returning_ranks()}, plan), plan


def assert_same(a: DataProto, b: DataProto) -> None:
    assert set(a.batch) == set(b.batch) and all(torch.equal(a.batch[k], b.batch[k]) for k in a.batch)
    assert set(a.non_tensor_batch) == set(b.non_tensor_batch)
    assert all(list(a.non_tensor_batch[k]) == list(b.non_tensor_batch[k]) for k in a.non_tensor_batch)
    assert a.meta_info == b.meta_info


@pytest.mark.parametrize("rows,workers", [(7, 2), (5, 4), (7, 4), (5, 2), (1, 4), (8, 4), (3, 3)])
def test_dp_compute_proto_pads_and_strips(rows, workers):
    data = cw.make_rows(rows)
    out, plan = run_mode("DP_COMPUTE_PROTO", GroupInfo(workers), lambda r, d: cw.row_fn(d), data)
    assert plan.state.pad_size == (-rows) % workers and plan.state.padded_rows == rows + plan.state.pad_size
    assert len({len(a[0]) for a, _ in plan.calls.values()}) == 1  # equal slices
    assert_same(out, cw.row_fn(data))


def test_dp_compute_proto_splits_every_proto_and_broadcasts_the_rest():
    a, b = cw.make_rows(5), cw.make_rows(5, seed=9)
    out, _ = run_mode("DP_COMPUTE_PROTO", GroupInfo(2), lambda r, x, scale, y: x.batch["x"] * scale + y.batch["x"],
                      a, 3, y=b)
    assert torch.equal(out, a.batch["x"] * 3 + b.batch["x"])
    with pytest.raises(ValueError, match="differ in length"):
        plan_call(get_dispatch_mode("DP_COMPUTE_PROTO"), GroupInfo(2), (a, cw.make_rows(4)), {})
    with pytest.raises(TypeError, match="DataProto"):
        plan_call(get_dispatch_mode("DP_COMPUTE_PROTO"), GroupInfo(2), (1,), {})


def test_simple_modes():
    info = GroupInfo(3)
    assert run_mode("ONE_TO_ALL", info, lambda r, x: (r, x), "a")[0] == [(0, "a"), (1, "a"), (2, "a")]
    assert run_mode("ALL_TO_ALL", info, lambda r, x, y: (r, x, y), [1, 2, 3], y=list("abc"))[0] == [(0, 1, "a"), (1, 2, "b"), (2, 3, "c")]
    out, plan = run_mode("RANK_ZERO", info, lambda r: r * 10 + 1)
    assert out == 1 and list(plan.calls) == [0]
    with pytest.raises(ValueError, match="one entry per worker"):
        plan_call(get_dispatch_mode("ALL_TO_ALL"), info, ([1, 2],), {})


MESH_2X2 = (DispatchInfo(0, 2, True), DispatchInfo(0, 2, False), DispatchInfo(1, 2, True), DispatchInfo(1, 2, False))


def test_mesh_mode_feeds_dp_groups_and_collects_in_dp_order():
    # ranks 2,3 form dp group 0 and ranks 0,1 dp group 1, collectors 3 and 0: collection follows dp rank.
    mesh = (DispatchInfo(1, 2, True), DispatchInfo(1, 2, False), DispatchInfo(0, 2, False), DispatchInfo(0, 2, True))
    data = cw.make_rows(7)
    out, plan = run_mode("MESH_COMPUTE_PROTO", GroupInfo(4, mesh=mesh), lambda r, d: cw.row_fn(d), data)
    assert plan.collect_ranks == (3, 0)
    slices = {r: a[0].batch["row_id"].tolist() for r, (a, _) in plan.calls.items()}
    assert slices[2] == slices[3] == [0, 1, 2, 3] and slices[0] == slices[1] == [4, 5, 6, 0]
    assert_same(out, cw.row_fn(data))


def test_mesh_mode_reports_the_slowest_part_of_every_timing():
    # the joined output carries the first collected part's metrics; the driver waited for the slowest part
    mesh = (DispatchInfo(1, 2, True), DispatchInfo(1, 2, False), DispatchInfo(0, 2, False), DispatchInfo(0, 2, True))
    seconds = {0: 2.5, 3: 1.0}

    def fn(rank, d):
        out = cw.row_fn(d)
        out.meta_info["metrics"] = {"timing_s/generate": seconds.get(rank, 9.0), "rollout/tokens": float(rank)}
        return out

    out, plan = run_mode("MESH_COMPUTE_PROTO", GroupInfo(4, mesh=mesh), fn, cw.make_rows(6))
    assert plan.collect_ranks == (3, 0)
    assert out.meta_info["metrics"] == {"timing_s/generate": 1.0, "rollout/tokens": 3.0, "timing_s/generate_slowest": 2.5}
    one_replica = (DispatchInfo(0, 1, True), DispatchInfo(0, 1, False))  # one part: nothing slower to report
    alone, _ = run_mode("MESH_COMPUTE_PROTO", GroupInfo(2, mesh=one_replica), fn, cw.make_rows(3))
    assert alone.meta_info["metrics"] == {"timing_s/generate": 2.5, "rollout/tokens": 0.0}


@pytest.mark.parametrize("mesh,match", [
    ((DispatchInfo(0, 2, True), None, DispatchInfo(1, 2, True), DispatchInfo(1, 2, False)), "did not declare"),
    ((DispatchInfo(0, 2, True), DispatchInfo(0, 2, True), DispatchInfo(1, 2, True), DispatchInfo(1, 2, False)), "exactly one"),
    ((DispatchInfo(0, 2, True), DispatchInfo(0, 2, False), DispatchInfo(1, 2, False), DispatchInfo(1, 2, False)), "exactly one"),
    ((DispatchInfo(0, 2, True), DispatchInfo(0, 1, True), DispatchInfo(1, 2, True), DispatchInfo(1, 2, False)), "different dp sizes"),
])
def test_mesh_mode_rejects_bad_layouts(mesh, match):
    with pytest.raises(ValueError, match=match):
        plan_call(get_dispatch_mode("MESH_COMPUTE_PROTO"), GroupInfo(4, mesh=mesh), (cw.make_rows(4),), {})


def test_register_dispatch_mode_contract():
    def dispatch(info, args, kwargs):
        return DispatchPlan({r: (args, kwargs) for r in range(info.world_size) if r % 2 == 1})

    def collect(info, outputs, plan):
        return sorted(outputs.items())

    register_dispatch_mode("TEST_ODD", dispatch, collect, override=True)
    with pytest.raises(ValueError, match="already registered"):
        register_dispatch_mode("TEST_ODD", dispatch, collect)
    with pytest.raises(TypeError):
        register_dispatch_mode("TEST_BAD", dispatch, None)

    class W(Worker):
        @register("TEST_ODD")
        def who(self, k):
            return self.rank * k

    assert InProcessGroup(W, 4).who(10) == [(1, 10), (3, 30)]

    bad_plans = {
        "TEST_BAD_RANK": (lambda i, a, k: DispatchPlan({i.world_size: (a, k)}), "subset"),
        "TEST_BAD_CALL": (lambda i, a, k: DispatchPlan({0: [a, k]}), "args: tuple"),
        "TEST_BAD_COLLECT": (lambda i, a, k: DispatchPlan({0: (a, k)}, collect_ranks=(1,)), "do not run"),
        "TEST_NOT_PLAN": (lambda i, a, k: {0: (a, k)}, "not DispatchPlan"),
    }
    for name, (fn, match) in bad_plans.items():
        mode = register_dispatch_mode(name, fn, collect, override=True)
        with pytest.raises((TypeError, ValueError), match=match):
            plan_call(mode, GroupInfo(2), (), {})


def test_group_binds_registered_methods_and_routes_calls():
    g = InProcessGroup(cw.RowWorker, 3, role="rows")
    assert set(registered_methods(cw.RowWorker)) <= set(vars(g))
    assert [i["rank"] for i in g.info()] == [0, 1, 2] and {i["role"] for i in g.info()} == {"rows"}
    assert g.echo([1, 2, 3], tag=["a", "b", "c"]) == [(0, 1, "a"), (1, 2, "b"), (2, 3, "c")]
    assert g.only_zero() == 0
    assert g.first_rank() == [0]  # ONE_TO_ALL dispatch, Execute.RANK_ZERO
    assert g.rank_plus(10) == 10 + 12  # user mode from the helper module: ranks 0 and 2
    assert_same(g.compute(cw.make_rows(7)), cw.row_fn(cw.make_rows(7)))
    fut = g.sleep(0)
    assert isinstance(fut, GroupFuture) and g.get(fut) == [0, 1, 2]
    assert g.execute_all("fail_on", 99) == [0, 1, 2] and g.execute_rank_zero("fail_on", 99) == 0


def test_group_futures_resolve_when_passed_as_arguments():
    g = InProcessGroup(cw.RowWorker, 2)
    fut = g.execute_all_async("echo", 5)  # ONE_TO_ALL: each rank gets 5 -> [(0,5,'t'), (1,5,'t')]
    assert g.echo(fut) == [(0, (0, 5, "t"), "t"), (1, (1, 5, "t"), "t")]


def test_failure_names_rank_role_and_carries_traceback():
    g = InProcessGroup(cw.RowWorker, 3, role="critic")
    with pytest.raises(WorkerError) as err:
        g.fail_on(2)
    e = err.value
    assert (e.rank, e.role, e.method) == (2, "critic", "fail_on")
    assert "rank 2" in str(e) and "critic" in str(e) and "deliberate failure on rank 2" in e.remote_traceback
    assert "controller_workers.py" in e.remote_traceback  # the worker's own frame


def test_mesh_dispatch_through_the_group_needs_declared_info():
    mesh = [(d.dp_rank, d.dp_size, d.is_collect) for d in MESH_2X2]
    g = InProcessGroup(cw.RowWorker, 4, mesh=mesh)
    assert g.dispatch_info() == MESH_2X2

    class M(Worker):
        @register(Dispatch.MESH_COMPUTE_PROTO)
        def f(self, d):
            return cw.row_fn(d)

    with pytest.raises(ValueError, match="did not declare"):
        InProcessGroup(M, 2).f(cw.make_rows(3))
    assert_same(InProcessGroup(M, 4, mesh=mesh).f(cw.make_rows(5)), cw.row_fn(cw.make_rows(5)))


def test_named_meshes_dispatch_independently():
    """Training layout (tp2 x dp2) and rollout layout (one replica over all 4 ranks) in the same workers."""
    register_mesh_dispatch_mode("TEST_ROLLOUT_PROTO", "test_rollout", override=True)

    class TwoMeshes(Worker):
        def __init__(self):
            self.set_dispatch_info(self.rank // 2, 2, self.rank % 2 == 0)  # train: dp = rank // tp
            self.set_dispatch_info(0, 1, self.rank == 0, mesh="test_rollout")  # rollout: tp_g = 4

        @register(Dispatch.MESH_COMPUTE_PROTO)
        def train(self, d):
            return DataProto.from_dict({"rank": torch.full((len(d),), self.rank)})

        @register("TEST_ROLLOUT_PROTO")
        def rollout(self, d):
            return DataProto.from_dict({"rank": torch.full((len(d),), self.rank)})

    g = InProcessGroup(TwoMeshes, 4)
    # train: rows 0-2 to dp 0 (collected from rank 0), rows 3-5 to dp 1 (rank 2)
    assert g.train(cw.make_rows(6)).batch["rank"].tolist() == [0, 0, 0, 2, 2, 2]
    # rollout: one replica; every rank gets all rows, only rank 0 returns
    assert g.rollout(cw.make_rows(5)).batch["rank"].tolist() == [0] * 5
    assert g.dispatch_info("test_rollout")[3] == DispatchInfo(0, 1, False)


def test_expanding_outputs_drop_scaled_padding():
    """A method returning n rows per input row (generation): the padding rows' n outputs are dropped."""
    class Expand(Worker):
        @register(Dispatch.DP_COMPUTE_PROTO)
        def gen(self, d):
            return d.repeat(3, interleave=True)

        @register(Dispatch.DP_COMPUTE_PROTO)
        def bad(self, d):
            return d[:1]

    g = InProcessGroup(Expand, 2)
    out = g.gen(cw.make_rows(5))  # padded to 6 rows -> 18 outputs -> the 3 of the padding row are dropped
    assert_same(out, cw.make_rows(5).repeat(3, interleave=True))
    with pytest.raises(ValueError, match="same number of rows per input row"):
        g.bad(cw.make_rows(5))


def test_register_validates_and_group_rejects_unknown_or_reserved_names():
    with pytest.raises(ValueError):
        register(execute_mode="SOME")

    class Unknown(Worker):
        @register("NO_SUCH_MODE")
        def f(self):
            pass

    class Reserved(Worker):
        @register()
        def shutdown(self):
            pass

    with pytest.raises(ValueError, match="NO_SUCH_MODE"):
        InProcessGroup(Unknown, 1)
    with pytest.raises(ValueError, match="reserved"):
        InProcessGroup(Reserved, 1)
    assert Execute.ALL and Dispatch.DP_MESH == Dispatch.MESH_COMPUTE_PROTO


def test_worker_identity_outside_a_group_comes_from_torchrun_env(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    w = cw.RowWorker()
    assert (w.rank, w.world_size, w.local_rank, w.role) == (3, 4, 1, "RowWorker")
    with pytest.raises(ValueError):
        w.set_dispatch_info(2, 2, True)
    with pytest.raises(KeyError, match="no role"):
        w.peer("actor")
