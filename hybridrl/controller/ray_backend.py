"""Ray backend: resource pools on placement groups, one Ray actor per slot, group calls with timeouts.

    pool = ResourcePool([8, 8], use_gpu=True)            # 2 nodes x 8 GPUs, packed per node
    wg = RayWorkerGroup(pool, CriticWorker, role="critic")
    values = wg.compute_values(batch)                     # dispatch -> execute -> collect

Each slot is a bundle of a per-node STRICT_PACK placement group (one GPU, or `num_cpus_per_process`
CPUs on CPU machines); `max_colocate_count` lets that many groups share a slot (fractional GPU
requests). Each actor is a `WorkerHost` holding one or more roles (colocate.py fuses several).
Rank 0's host picks MASTER_ADDR (its node IP) and a free MASTER_PORT before any role is built.

Failures: a role that raises comes back as a RemoteFailure (raised as WorkerError with the remote
traceback); an actor that dies surfaces as Ray's ActorDiedError on its pending call and is raised as
WorkerDiedError naming rank, role, pid and node as soon as it is seen, without waiting for the other ranks
(which may be stuck in a collective with the dead one); `call_timeout_s` bounds every call. When several
ranks fail in one call, a dead rank is reported before its peers' collective errors (it is usually their
cause), and the message names the ranks that failed too or had not finished (a hung peer) and their nodes;
a node Ray already counts as dead is said so (a lost node is what a whole node's ranks going quiet means).
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridrl.utils.net import free_port

from .dispatch import DispatchInfo, DispatchPlan
from .errors import RemoteFailure, WorkerDiedError, WorkerError, WorkerTimeoutError
from .group import WorkerGroup
from .host import RoleSpec, WorkerHost, as_role_specs
from .worker import DEFAULT_DIST_TIMEOUT_S, DistContext

__all__ = ["ResourcePool", "RayWorkerGroup", "spawn_hosts"]

logger = logging.getLogger(__name__)

_POLL_S = 0.5  # how often a wait wakes up to check the deadline
# After a rank fails, how long to look for a peer that died: a dead rank makes the others' collectives
# fail at once (gloo sees the closed socket), often before Ray reports the death itself.
_DEATH_GRACE_S = 2.0
_SCALARS = (int, float, str, bool, bytes, type(None))


@dataclass(frozen=True)
class _Slot:
    pg: PlacementGroup
    bundle_index: int
    local_rank: int
    local_world_size: int


@dataclass(frozen=True)
class RayNode:
    """Where a rank runs: its Ray node (id, IP, host name) and the pool's node index it was packed on."""

    node_id: str
    ip: str
    host: str
    pool_node: int

    def __str__(self) -> str:
        return f"{self.pool_node} ({self.host}, {self.ip}, Ray node {self.node_id[:12]})"


class ResourcePool:
    """Slots for worker processes: `process_on_nodes[i]` slots packed on node i."""

    def __init__(self, process_on_nodes: Sequence[int], *, use_gpu: bool = False, num_cpus_per_process: float = 1.0,
                 max_colocate_count: int = 1, name: str = "pool", ready_timeout_s: float = 120.0) -> None:
        if not process_on_nodes or any(int(n) <= 0 for n in process_on_nodes):
            raise ValueError(f"ResourcePool {name!r}: process_on_nodes must be positive counts, got {process_on_nodes}")
        if max_colocate_count < 1:
            raise ValueError(f"ResourcePool {name!r}: max_colocate_count must be >= 1")
        self.process_on_nodes = [int(n) for n in process_on_nodes]
        self.use_gpu = use_gpu
        self.num_cpus_per_process = float(num_cpus_per_process)
        self.max_colocate_count = int(max_colocate_count)
        self.name = name
        self.ready_timeout_s = ready_timeout_s
        self._pgs: list[PlacementGroup] = []
        self._groups_spawned = 0

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.num_cpus_per_process, **({"GPU": 1.0} if self.use_gpu else {})}

    def actor_resources(self) -> dict[str, float]:
        """Per actor: a 1/max_colocate_count share of its slot, so that many groups fit on one slot."""
        share = 1.0 / self.max_colocate_count
        return {"num_cpus": self.num_cpus_per_process * share, "num_gpus": share if self.use_gpu else 0.0}

    def slots(self) -> list[_Slot]:
        """The slots in rank order; the placement groups are reserved on first use."""
        if not self._pgs:
            self._reserve()
        return [_Slot(pg, i, i, n) for pg, n in zip(self._pgs, self.process_on_nodes) for i in range(n)]

    def claim(self) -> None:
        """Count one more group on this pool; refuse beyond max_colocate_count."""
        if self._groups_spawned >= self.max_colocate_count:
            raise RuntimeError(f"ResourcePool {self.name!r} already hosts {self._groups_spawned} group(s) "
                               f"(max_colocate_count={self.max_colocate_count}); fuse the roles with "
                               "spawn_colocated or raise max_colocate_count")
        self._groups_spawned += 1

    def unclaim(self) -> None:
        self._groups_spawned = max(0, self._groups_spawned - 1)

    def release(self) -> None:
        """Give the placement groups back (Ray kills actors still scheduled in them)."""
        for pg in self._pgs:
            try:
                remove_placement_group(pg)
            except Exception as e:  # already gone with the cluster
                logger.debug("removing placement group failed: %s", e)
        self._pgs = []
        self._groups_spawned = 0

    def _reserve(self) -> None:
        pgs = [placement_group([self.bundle()] * n, strategy="STRICT_PACK", name=f"{self.name}_node{i}")
               for i, n in enumerate(self.process_on_nodes)]
        try:
            ray.get([pg.ready() for pg in pgs], timeout=self.ready_timeout_s)
        except GetTimeoutError:
            for pg in pgs:
                remove_placement_group(pg)
            raise RuntimeError(
                f"ResourcePool {self.name!r}: could not reserve {self.process_on_nodes} slots of {self.bundle()} "
                f"(one node per entry) within {self.ready_timeout_s} s; free in the cluster: {ray.available_resources()}"
            ) from None
        self._pgs = pgs


# Ray normally shows each GPU actor only its own GPU (CUDA_VISIBLE_DEVICES). NCCL then cannot enable P2P
# between the actors' GPUs and falls back to shared host memory (measured: tp=2 all-gathers at a few GB/s
# instead of NVLink's hundreds), and vLLM's custom all-reduce cannot find its peers. GPU actors therefore
# see every GPU of the node and select the one Ray assigned them (`gpu_index`).
GPU_ACTOR_ENV = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}


class _RayHost(WorkerHost):
    def gpu_index(self) -> int:
        """Index, among the GPUs this process sees, of the GPU Ray assigned to it (0 without one)."""
        ids = [str(i) for i in ray.get_gpu_ids()]
        if not ids:
            return 0
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if not visible:
            return int(ids[0])
        if ids[0] not in visible:
            raise RuntimeError(f"Ray assigned GPU {ids[0]} but CUDA_VISIBLE_DEVICES={','.join(visible)} hides it")
        return visible.index(ids[0])

    def node(self) -> tuple[str, str, str]:
        """(node id, IP, host name) of the Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), socket.gethostname()

    def node_address(self) -> tuple[str, int]:
        """This node's IP and a port free on it right now (rank 0's answer becomes MASTER_ADDR/PORT)."""
        return ray.util.get_node_ip_address(), free_port()

    def execute_flat(self, role: str, method: str, keep_output: bool, kw_names: tuple, *values: Any) -> Any:
        # Arguments arrive flat so Ray resolves ObjectRefs (shared, ray.put-once arguments) for us.
        n_pos = len(values) - len(kw_names)
        return self.execute(role, method, values[:n_pos], dict(zip(kw_names, values[n_pos:])), keep_output)


_RemoteHost = ray.remote(_RayHost)


class _HostSet:
    """The actors of one spawn; shared by the role views of a colocated spawn."""

    def __init__(self, handles: list[Any], pids: list[int], pool: ResourcePool) -> None:
        self.handles, self.pids, self.pool = handles, pids, pool
        self.nodes: list[RayNode] = []  # each rank's node, filled in at start
        self.alive = True

    def kill(self) -> None:
        if self.alive:
            for h in self.handles:
                try:
                    ray.kill(h, no_restart=True)
                except Exception as e:
                    logger.debug("ray.kill failed: %s", e)
            self.alive = False


def wait_refs(refs: dict[int, Any], *, role: str, method: str, timeout: float | None,
              pids: Sequence[int] | None = None, nodes: Sequence[RayNode] | None = None) -> dict[int, Any]:
    """{rank: value} of all refs. Raises as soon as any rank fails: WorkerError for a RemoteFailure,
    WorkerDiedError for a dead actor, WorkerTimeoutError past `timeout` seconds."""
    pending = {ref: rank for rank, ref in refs.items()}
    out: dict[int, Any] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        step = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=step)
        failures: dict[int, WorkerError] = {}
        for ref in ready:
            rank = pending.pop(ref)
            try:
                out[rank] = _get_one(ref, rank, role, method, pids, nodes)
            except WorkerError as e:
                failures[rank] = e
        if failures:
            raise _root_failure(failures, pending, role, method, pids, nodes)
        if pending and deadline is not None and time.monotonic() >= deadline:
            late = sorted(pending.values())
            raise WorkerTimeoutError(f"{role}.{method}(): rank(s) {late} did not finish within {timeout} s"
                                     f"{_where(late, nodes)}", rank=late[0], role=role, method=method)
    return out


def _root_failure(failures: dict[int, WorkerError], pending: dict[Any, int], role: str, method: str,
                  pids: Sequence[int] | None, nodes: Sequence[RayNode] | None = None) -> WorkerError:
    """The error to raise when ranks failed: a dead rank first (its peers' errors are usually its
    consequence), else the lowest failed rank; the message adds which ranks failed too or were still
    running, so a hung or dead peer is named even when another rank's collective timed out first."""
    if pending and not any(isinstance(e, WorkerDiedError) for e in failures.values()):
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_DEATH_GRACE_S)
        for ref in ready:
            rank = pending.pop(ref)
            try:
                _get_one(ref, rank, role, method, pids, nodes)
            except WorkerError as e:
                failures[rank] = e
    died = sorted(r for r, e in failures.items() if isinstance(e, WorkerDiedError))
    first = died[0] if died else min(failures)
    notes = []
    others = sorted(set(failures) - {first})
    if others:
        notes.append(f"rank(s) {others} failed too")
    running = sorted(pending.values())
    if running:
        notes.append(f"rank(s) {running} had not finished {method}() (a hung or dead peer makes the others' "
                     f"collectives fail or time out){_where(running, nodes)}")
    return failures[first].with_note(f"; {'; '.join(notes)}" if notes else "")


def _where(ranks: Sequence[int], nodes: Sequence[RayNode] | None) -> str:
    """' on node 1 (host, ip, Ray node id)' for the nodes of `ranks`, each said dead where Ray knows it is."""
    if not nodes:
        return ""
    places = sorted({nodes[r] for r in ranks}, key=lambda n: n.pool_node)
    dead = _dead_node_ids()
    return " on node " + ", ".join(f"{n}{' (DEAD: Ray lost this node)' if n.node_id in dead else ''}" for n in places)


def _dead_node_ids() -> set[str]:
    try:
        return {n["NodeID"] for n in ray.nodes() if not n.get("Alive", True)}
    except Exception as e:  # the GCS itself may be gone
        logger.debug("ray.nodes() failed: %s", e)
        return set()


def _get_one(ref: Any, rank: int, role: str, method: str, pids: Sequence[int] | None,
             nodes: Sequence[RayNode] | None = None) -> Any:
    pid = f" (pid {pids[rank]})" if pids else ""
    try:
        value = ray.get(ref)
    except RayActorError as e:
        detail = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise WorkerDiedError(f"worker {role!r} rank {rank}{pid} died during {method}(){_where([rank], nodes)}: "
                              f"{type(e).__name__}: {detail}", rank=rank, role=role, method=method) from None
    except RayError as e:
        raise WorkerError(f"worker {role!r} rank {rank}{pid} could not run {method}(): {type(e).__name__}",
                          rank=rank, role=role, method=method, remote_traceback=str(e)) from None
    if isinstance(value, RemoteFailure):
        raise WorkerError.from_failure(value)
    return value


def spawn_hosts(pool: ResourcePool, roles: dict[str, RoleSpec], *, dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S,
                setup_timeout_s: float = 300.0) -> _HostSet:
    """One actor per slot of `pool`, each building every role in `roles`."""
    roles = as_role_specs(roles)
    label = "+".join(roles)
    pool.claim()
    try:
        slots = pool.slots()
    except BaseException:
        pool.unclaim()
        raise
    handles = [
        _RemoteHost.options(
            **pool.actor_resources(),
            scheduling_strategy=PlacementGroupSchedulingStrategy(slot.pg, placement_group_bundle_index=slot.bundle_index),
            max_restarts=0,
            **({"runtime_env": {"env_vars": GPU_ACTOR_ENV}} if pool.use_gpu else {}),
        ).remote()
        for slot in slots
    ]
    hosts = _HostSet(handles, [], pool)
    try:
        pids = wait_refs({r: h.pid.remote() for r, h in enumerate(handles)}, role=label, method="start",
                         timeout=setup_timeout_s)
        hosts.pids = [pids[r] for r in range(len(handles))]
        placed = wait_refs({r: h.node.remote() for r, h in enumerate(handles)}, role=label, method="start",
                           timeout=setup_timeout_s)
        pool_node = [i for i, n in enumerate(pool.process_on_nodes) for _ in range(n)]
        hosts.nodes = [RayNode(*placed[r], pool_node=pool_node[r]) for r in range(len(handles))]
        _log_placement(pool, hosts.nodes)
        addr, port = wait_refs({0: handles[0].node_address.remote()}, role=label, method="start",
                               timeout=setup_timeout_s)[0]
        gpus = (wait_refs({r: h.gpu_index.remote() for r, h in enumerate(handles)}, role=label, method="start",
                          timeout=setup_timeout_s) if pool.use_gpu else {})
        ctxs = [DistContext(rank=r, world_size=len(slots), local_rank=s.local_rank, local_world_size=s.local_world_size,
                            master_addr=addr, master_port=port, use_gpu=pool.use_gpu, cuda_device=gpus.get(r, 0),
                            dist_timeout_s=dist_timeout_s) for r, s in enumerate(slots)]
        wait_refs({r: h.setup.remote(ctxs[r], roles) for r, h in enumerate(handles)}, role=label, method="__init__",
                  timeout=setup_timeout_s, pids=hosts.pids, nodes=hosts.nodes)
    except BaseException:
        hosts.kill()
        pool.unclaim()
        raise
    return hosts


def _log_placement(pool: ResourcePool, nodes: list[RayNode]) -> None:
    """Say where each of the pool's nodes landed; warn when two of them share one Ray node (a layout of
    several nodes that runs on one: the resources of a node fit more than one node's slots)."""
    by_node: dict[int, RayNode] = {}
    for n in nodes:
        by_node.setdefault(n.pool_node, n)
    logger.info("pool %r: %s", pool.name, "; ".join(f"node {n} x {pool.process_on_nodes[i]}" for i, n in by_node.items()))
    shared = Counter(n.node_id for n in by_node.values())
    if len(by_node) > 1 and any(c > 1 for c in shared.values()):
        logger.warning("pool %r: %d nodes' slots were packed onto %d Ray node(s); each Ray node offers more than "
                       "one node's worth of resources", pool.name, len(by_node), len(shared))


class RayWorkerGroup(WorkerGroup):
    """N Ray actors (one per slot of `resource_pool`) running `worker_cls` as `role`."""

    def __init__(self, resource_pool: ResourcePool, worker_cls: type, init_args: tuple = (),
                 init_kwargs: dict | None = None, *, role: str = "worker", call_timeout_s: float | None = None,
                 dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S, setup_timeout_s: float = 300.0) -> None:
        spec = RoleSpec(worker_cls, tuple(init_args), dict(init_kwargs or {}))
        hosts = spawn_hosts(resource_pool, {role: spec}, dist_timeout_s=dist_timeout_s, setup_timeout_s=setup_timeout_s)
        self._attach(hosts, role, worker_cls, call_timeout_s)

    @classmethod
    def view(cls, hosts: _HostSet, role: str, worker_cls: type, call_timeout_s: float | None = None) -> "RayWorkerGroup":
        """A group over already-spawned hosts for one of their roles (colocation)."""
        group = cls.__new__(cls)
        group._attach(hosts, role, worker_cls, call_timeout_s)
        return group

    def _attach(self, hosts: _HostSet, role: str, worker_cls: type, call_timeout_s: float | None) -> None:
        self._hosts = hosts
        WorkerGroup.__init__(self, role, worker_cls, len(hosts.handles), call_timeout_s)

    @property
    def pids(self) -> list[int]:
        """Process id of each rank's actor (for debugging and failure tests)."""
        return list(self._hosts.pids)

    @property
    def nodes(self) -> list[RayNode]:
        """Each rank's node."""
        return list(self._hosts.nodes)

    @property
    def actors(self) -> list[Any]:
        return list(self._hosts.handles)

    def shutdown(self) -> None:
        """Kill this group's actors (for a colocated spawn: the actors of every role)."""
        self._hosts.kill()

    # ------------------------------------------------------------------ backend hooks
    def _check_alive(self, method: str) -> None:
        if not self._hosts.alive:
            raise WorkerDiedError(f"{self.role}.{method}(): the group was shut down", rank=None, role=self.role,
                                  method=method)

    def _submit(self, method: str, plan: DispatchPlan) -> dict[int, Any]:
        self._check_alive(method)
        returning = set(plan.returning_ranks())
        shared = _share_repeated_args(plan)
        refs = {}
        for rank, (args, kwargs) in plan.calls.items():
            values = [shared.get(id(v), v) for v in (*args, *kwargs.values())]
            refs[rank] = self._hosts.handles[rank].execute_flat.remote(
                self.role, method, rank in returning, tuple(kwargs), *values)
        return refs

    def _gather(self, handle: dict[int, Any], method: str, timeout: float | None) -> dict[int, Any]:
        timeout = self.call_timeout_s if timeout is None else timeout
        return wait_refs(handle, role=self.role, method=method, timeout=timeout, pids=self._hosts.pids,
                         nodes=self._hosts.nodes)

    def _fetch_dispatch_info(self, mesh: str) -> list[DispatchInfo | None]:
        self._check_alive("dispatch_info")
        refs = {r: h.dispatch_info.remote(self.role, mesh) for r, h in enumerate(self._hosts.handles)}
        out = wait_refs(refs, role=self.role, method="dispatch_info", timeout=self.call_timeout_s, pids=self._hosts.pids,
                        nodes=self._hosts.nodes)
        return [out[r] for r in range(self.world_size)]


def _share_repeated_args(plan: DispatchPlan) -> dict[int, Any]:
    """ray.put once any non-scalar argument object that goes to more than one rank (e.g. ONE_TO_ALL)."""
    counts = Counter(id(v) for args, kwargs in plan.calls.values() for v in (*args, *kwargs.values())
                     if not isinstance(v, _SCALARS))
    objects = {id(v): v for args, kwargs in plan.calls.values() for v in (*args, *kwargs.values())}
    return {i: ray.put(objects[i]) for i, c in counts.items() if c > 1}
