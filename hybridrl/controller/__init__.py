"""Single controller: the driver runs the algorithm as one program; workers run SPMD on every slot.

    Worker, register, Dispatch, Execute           # write a role (worker.py, decorator.py)
    register_dispatch_mode                        # add a dispatch mode (dispatch.py)
    ResourcePool, RayWorkerGroup                  # Ray backend (ray_backend.py)
    LocalWorkerGroup                              # torchrun backend (local_backend.py)
    spawn_colocated, make_worker_group, RoleSpec  # fused roles, backend-neutral factory (colocate.py)
    init_ray, build_runtime_env                   # start Ray with a lean runtime env (runtime_env.py)

Ray is imported only inside this package, and only when a Ray name is first used, so torchrun jobs
(local backend) never import it.
"""
from __future__ import annotations

from typing import Any

from .colocate import make_worker_group, spawn_colocated
from .decorator import Dispatch, Execute, RegisterSpec, register
from .dispatch import (
    DispatchInfo,
    DispatchMode,
    DispatchPlan,
    GroupInfo,
    get_dispatch_mode,
    register_dispatch_mode,
    register_mesh_dispatch_mode,
)
from .errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from .group import GroupFuture, WorkerGroup
from .host import RoleSpec
from .local_backend import LocalWorkerGroup
from .runtime_env import build_runtime_env, init_ray, shutdown_ray
from .worker import DistContext, Worker

_RAY_NAMES = {"ResourcePool": "ResourcePool", "RayWorkerGroup": "RayWorkerGroup"}

__all__ = [
    "Worker", "DistContext", "register", "Dispatch", "Execute", "RegisterSpec",
    "DispatchInfo", "DispatchMode", "DispatchPlan", "GroupInfo", "get_dispatch_mode", "register_dispatch_mode",
    "register_mesh_dispatch_mode",
    "WorkerError", "WorkerDiedError", "WorkerTimeoutError", "GroupFuture", "WorkerGroup", "RoleSpec",
    "LocalWorkerGroup", "spawn_colocated", "make_worker_group", "build_runtime_env", "init_ray", "shutdown_ray",
    *_RAY_NAMES,
]


def __getattr__(name: str) -> Any:
    if name in _RAY_NAMES:
        from . import ray_backend

        return getattr(ray_backend, _RAY_NAMES[name])
    raise AttributeError(f"module 'hybridrl.controller' has no attribute {name!r}")
