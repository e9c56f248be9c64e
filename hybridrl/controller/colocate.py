"""Colocation: several roles fused into one process per slot, and the backend-neutral factories.

    pool = ResourcePool([8], use_gpu=True)
    groups = spawn_colocated(pool, {"actor_rollout": ActorRolloutWorker, "ref": RefWorker})
    groups["ref"].compute_ref_log_prob(batch)       # runs on the "ref" instance of each process

One process (one Ray actor, or one torchrun rank) per slot builds every role. The roles share the
process, the GPU and the torch.distributed process group (initialized once, by whichever role asks
first), and reach each other with `Worker.peer(role)`, so tensors pass between them without copies.
Each returned group is a view routing its registered methods to its own role. Roles that should not
share GPUs (a critic or a reward model on other nodes) get their own pool:

    critic = make_worker_group("ray", CriticWorker, role="critic", resource_pool=ResourcePool([4], use_gpu=True))

The local backend (torchrun) runs every role in the rank's process anyway; `resource_pool` is then only
checked against the torchrun world size.
"""
from __future__ import annotations

from typing import Any, Mapping

from .group import WorkerGroup
from .host import RoleSpec, as_role_specs
from .worker import DEFAULT_DIST_TIMEOUT_S

__all__ = ["spawn_colocated", "make_worker_group", "BACKENDS"]

BACKENDS = ("ray", "local")


def spawn_colocated(resource_pool: Any, roles: Mapping[str, "type | RoleSpec"], *, backend: str = "ray",
                    call_timeout_s: float | None = None, dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S,
                    setup_timeout_s: float = 300.0, use_gpu: bool | None = None) -> dict[str, WorkerGroup]:
    """One process per slot holding every role; {role: group view}. `roles` values: a Worker class or
    `RoleSpec(cls, args, kwargs)`. Roles are built in the order given."""
    specs = as_role_specs(roles)
    if backend == "ray":
        from .ray_backend import RayWorkerGroup, spawn_hosts

        if resource_pool is None:
            raise ValueError("spawn_colocated(backend='ray') needs a ResourcePool")
        hosts = spawn_hosts(resource_pool, specs, dist_timeout_s=dist_timeout_s, setup_timeout_s=setup_timeout_s)
        return {name: RayWorkerGroup.view(hosts, name, s.cls, call_timeout_s) for name, s in specs.items()}
    if backend == "local":
        from .local_backend import LocalWorkerGroup, spawn_local_host

        local = spawn_local_host(specs, use_gpu=use_gpu, dist_timeout_s=dist_timeout_s, call_timeout_s=call_timeout_s)
        if resource_pool is not None and resource_pool.world_size != local.ctx.world_size:
            raise ValueError(f"resource pool has {resource_pool.world_size} slots but torchrun started "
                             f"{local.ctx.world_size} ranks")
        return {name: LocalWorkerGroup.view(local, name, s.cls, call_timeout_s) for name, s in specs.items()}
    raise ValueError(f"unknown controller backend {backend!r}; choose one of {BACKENDS}")


def make_worker_group(backend: str, worker_cls: type, init_args: tuple = (), init_kwargs: dict | None = None, *,
                      role: str = "worker", resource_pool: Any = None, call_timeout_s: float | None = None,
                      dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S, setup_timeout_s: float = 300.0,
                      use_gpu: bool | None = None) -> WorkerGroup:
    """A group of one role on either backend ("ray": one actor per slot of `resource_pool`;
    "local": this torchrun job's ranks), so the trainer does not care which one runs."""
    spec = RoleSpec(worker_cls, tuple(init_args), dict(init_kwargs or {}))
    groups = spawn_colocated(resource_pool, {role: spec}, backend=backend, call_timeout_s=call_timeout_s,
                             dist_timeout_s=dist_timeout_s, setup_timeout_s=setup_timeout_s, use_gpu=use_gpu)
    return groups[role]
