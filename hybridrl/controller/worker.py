"""Worker: the base class of every role (actor, rollout, reference, critic, reward model).

A worker knows where it sits (rank, world size, local rank, master address/port, role) and can join
torch.distributed. The group that creates it decides those values and hands them over as a
`DistContext` before `__init__` runs, so a subclass can use `self.rank` in its own `__init__` without
calling `super().__init__()` with arguments. Under torchrun (local backend) or when a worker is built
by hand, the context comes from the standard torchrun environment variables instead.

Several roles may live in one process (colocation): `init_distributed` initializes the process group
once per process and is a no-op for every later caller, and `peer(role)` returns a sibling role's
instance in the same process, so roles hand tensors to each other without copies.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .decorator import Dispatch, register
from .dispatch import DEFAULT_MESH, DispatchInfo

__all__ = ["DistContext", "Worker", "init_process_group_once"]

logger = logging.getLogger(__name__)

DEFAULT_DIST_TIMEOUT_S = 600.0
_CTX_ATTR = "_hybridrl_ctx"
_PEERS_ATTR = "_hybridrl_peers"
_DISPATCH_ATTR = "_hybridrl_dispatch_info"


@dataclass(frozen=True)
class DistContext:
    """Where one worker process sits in its group. Built by the group; read-only for the worker."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    role: str = "worker"
    use_gpu: bool = False
    # CUDA device index to use in this process: the local rank under torchrun; under Ray the position of
    # the GPU Ray assigned among those the actor sees (GPU actors see the whole node, ray_backend.py).
    cuda_device: int = 0
    dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S

    @classmethod
    def from_env(cls, role: str = "worker", use_gpu: bool | None = None,
                 dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S) -> "DistContext":
        """The torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, ...); defaults describe one process.

        A lone process (world size 1, no MASTER_PORT: `python -m hybridrl.trainer.main_sft` without torchrun) takes a
        port free now for its rendezvous, published as MASTER_PORT so the process's later contexts agree; torch's
        default 29500 failed with EADDRINUSE when another run on the machine held it (two lease lanes).
        """
        env = os.environ
        local_rank = int(env.get("LOCAL_RANK", 0))
        world_size = int(env.get("WORLD_SIZE", 1))
        if "MASTER_PORT" not in env and world_size == 1:
            from hybridrl.utils.net import free_port

            env["MASTER_PORT"] = str(free_port(env.get("MASTER_ADDR", "127.0.0.1")))
        return cls(
            rank=int(env.get("RANK", 0)),
            world_size=world_size,
            local_rank=local_rank,
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
            role=role,
            use_gpu=torch.cuda.is_available() if use_gpu is None else use_gpu,
            cuda_device=local_rank,
            dist_timeout_s=dist_timeout_s,
        )

    def export_env(self) -> None:
        """Publish the process identity the torchrun way, for libraries that read it (env:// init).

        LOCAL_RANK is what libraries pass to `torch.cuda.set_device`, so on GPUs it is the device
        index in this process's view: the node position under torchrun, Ray's assigned GPU under Ray.
        `Worker.local_rank` is always the node position.
        """
        os.environ.update({
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.cuda_device if self.use_gpu else self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        })


def init_process_group_once(ctx: DistContext, backend: str | None = None, timeout_s: float | None = None) -> bool:
    """Join the default process group unless this process already did. True when this call joined it.

    NCCL when the group asked for GPUs (and CUDA is there), gloo otherwise. The CUDA device is set
    before the process group is created so NCCL binds the right GPU.
    """
    if dist.is_initialized():
        return False
    if ctx.use_gpu and not torch.cuda.is_available():
        raise RuntimeError(f"{ctx.role} rank {ctx.rank}: the group asked for GPUs but CUDA is not available here")
    if ctx.use_gpu:
        torch.cuda.set_device(ctx.cuda_device)
    backend = backend or ("nccl" if ctx.use_gpu else "gloo")
    host = f"[{ctx.master_addr}]" if ":" in ctx.master_addr else ctx.master_addr
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{host}:{ctx.master_port}",
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=timedelta(seconds=timeout_s or ctx.dist_timeout_s),
    )
    logger.debug("%s rank %d joined torch.distributed (%s, world %d)", ctx.role, ctx.rank, backend, ctx.world_size)
    return True


class Worker:
    """Base class of a role. Decorate methods with `@register(...)` to make them group methods."""

    # ------------------------------------------------------------------ identity
    @property
    def dist_context(self) -> DistContext:
        ctx = self.__dict__.get(_CTX_ATTR)
        if ctx is None:  # built by hand or by a subclass that skipped the group: read torchrun's env
            ctx = DistContext.from_env(role=type(self).__name__)
            setattr(self, _CTX_ATTR, ctx)
        return ctx

    @property
    def rank(self) -> int:
        return self.dist_context.rank

    @property
    def world_size(self) -> int:
        return self.dist_context.world_size

    @property
    def local_rank(self) -> int:
        return self.dist_context.local_rank

    @property
    def role(self) -> str:
        return self.dist_context.role

    @property
    def master_addr(self) -> str:
        return self.dist_context.master_addr

    @property
    def master_port(self) -> int:
        return self.dist_context.master_port

    @property
    def device(self) -> torch.device:
        ctx = self.dist_context
        return torch.device("cuda", ctx.cuda_device) if ctx.use_gpu else torch.device("cpu")

    # ------------------------------------------------------------------ distributed
    def init_distributed(self, backend: str | None = None, timeout_s: float | None = None) -> bool:
        """Join torch.distributed for this worker's rank; once per process (colocated roles share it)."""
        return init_process_group_once(self.dist_context, backend, timeout_s)

    # ------------------------------------------------------------------ mesh-aware dispatch
    def set_dispatch_info(self, dp_rank: int, dp_size: int, is_collect: bool, mesh: str = DEFAULT_MESH) -> None:
        """Declare this worker's data-parallel position for MESH_COMPUTE_PROTO (or a named mesh's mode).

        Call it after building the tp/pp/dp mesh: every worker of data-parallel group `dp_rank`
        receives the same slice of the batch; only workers with `is_collect` (by convention tp rank 0
        on the last pp stage, exactly one per dp rank) send their output back. A worker may sit in
        several meshes (the training layout and the rollout layout), each declared under its name.
        """
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"{self.role} rank {self.rank}: dp_rank={dp_rank} is not in [0, {dp_size})")
        meshes = self.__dict__.setdefault(_DISPATCH_ATTR, {})
        meshes[mesh] = DispatchInfo(dp_rank=dp_rank, dp_size=dp_size, is_collect=bool(is_collect))

    def get_dispatch_info(self, mesh: str = DEFAULT_MESH) -> DispatchInfo | None:
        """What `set_dispatch_info` declared for `mesh`, or None."""
        return (self.__dict__.get(_DISPATCH_ATTR) or {}).get(mesh)

    # ------------------------------------------------------------------ colocation
    def peer(self, role: str) -> Any:
        """The instance of another role fused into this same process (no copies between them)."""
        peers = self.__dict__.get(_PEERS_ATTR) or {}
        if role not in peers:
            raise KeyError(f"{self.role} rank {self.rank}: no role {role!r} in this process; roles here: {sorted(peers)}")
        return peers[role]

    @property
    def colocated_roles(self) -> list[str]:
        return sorted(self.__dict__.get(_PEERS_ATTR) or {})

    # ------------------------------------------------------------------ profiling (global_profiler.*)
    @register(Dispatch.ONE_TO_ALL)
    def profile_start(self, step: int) -> bool:
        """Open this process's torch profiler for `step` (colocated roles: the first call opens it)."""
        from hybridrl.utils import profiling

        return profiling.start(step)

    @register(Dispatch.ONE_TO_ALL)
    def profile_stop(self, step: int, folder: str) -> str | None:
        """Close it and write folder/step_STEP/ROLE_rankR.*; the table's path (None where another role did)."""
        from hybridrl.utils import profiling

        return profiling.stop(step, folder, f"{self.role}_rank{self.rank}")


def build_worker(cls: type, ctx: DistContext, args: tuple = (), kwargs: dict | None = None) -> Any:
    """Instantiate `cls` with its context attached before `__init__` runs (see the module docstring)."""
    obj = cls.__new__(cls)
    setattr(obj, _CTX_ATTR, ctx)
    obj.__init__(*args, **(kwargs or {}))
    return obj


def attach_peers(instances: dict[str, Any]) -> None:
    """Let every colocated instance reach the others through `Worker.peer`; all share one dict."""
    for obj in instances.values():
        setattr(obj, _PEERS_ATTR, instances)


def with_role(ctx: DistContext, role: str) -> DistContext:
    return replace(ctx, role=role)
