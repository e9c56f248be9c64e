"""Worker classes shared by the Ray tests and the torchrun driver (run_local.py): the same code on both."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from hybridrl.controller import Dispatch, DispatchPlan, Execute, Worker, register, register_dispatch_mode
from hybridrl.protocol import DataProto

HIDDEN, OUT = 6, 3


def make_rows(n: int, seed: int = 0) -> DataProto:
    """n rows: integer-valued x (exact sums in any order), row ids, a non-tensor source tag."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-5, 6, (n, HIDDEN), generator=g).float()
    return DataProto.from_dict({"x": x, "row_id": torch.arange(n)}, {"src": [f"s{i}" for i in range(n)]}, {"step": 3})


def row_fn(data: DataProto) -> DataProto:
    """The per-row function the DP tests compute, here in one process as the reference."""
    return DataProto.from_dict({"y": data.batch["x"] * 2 + 1, "row_id": data.batch["row_id"]},
                               {"src": data.non_tensor_batch["src"]}, data.meta_info)


def weight() -> torch.Tensor:
    return (torch.arange(HIDDEN * OUT).reshape(HIDDEN, OUT) % 7 - 3).float()


def tp_reference(data: DataProto) -> torch.Tensor:
    return data.batch["x"] @ weight()


# A user-defined dispatch mode: even ranks only, outputs summed (the extension-point contract).
def _even_dispatch(info, args, kwargs):
    return DispatchPlan({r: (args, kwargs) for r in range(0, info.world_size, 2)})


def _sum_collect(info, outputs, plan):
    return sum(outputs.values())


register_dispatch_mode("TEST_EVEN_RANKS_SUM", _even_dispatch, _sum_collect, override=True)


class RowWorker(Worker):
    """Row-wise compute, identity, argument routing and failure behaviour."""

    def __init__(self, scale: int = 1):
        self.scale = scale

    @register(Dispatch.DP_COMPUTE_PROTO)
    def compute(self, data: DataProto) -> DataProto:
        return row_fn(data)

    @register(Dispatch.ONE_TO_ALL)
    def info(self) -> dict:
        return {"rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank, "role": self.role,
                "pid": os.getpid(), "master_port": self.master_port, "scale": self.scale,
                "env_rank": int(os.environ["RANK"])}

    @register(Dispatch.ALL_TO_ALL)
    def echo(self, x, tag="t"):
        return (self.rank, x, tag)

    @register(Dispatch.RANK_ZERO)
    def only_zero(self) -> int:
        return self.rank

    @register(Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def first_rank(self) -> int:
        return self.rank

    @register("TEST_EVEN_RANKS_SUM")
    def rank_plus(self, k: int) -> int:
        return self.rank + k

    @register(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"deliberate failure on rank {rank}")
        return self.rank

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def allreduce_sum(self, value: float) -> float:
        """Sum of (rank + value) over the group through torch.distributed (NCCL on GPUs, gloo on CPU)."""
        self.init_distributed()
        t = torch.tensor([self.rank + value], dtype=torch.float32, device=self.device)
        dist.all_reduce(t)
        return float(t.item())

    @register(Dispatch.ONE_TO_ALL)
    def placement(self) -> dict:
        return {"backend": dist.get_backend(), "device": str(self.device),
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "local_rank_env": os.environ.get("LOCAL_RANK"),
                "gpu_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
                "gpu_uuid": str(torch.cuda.get_device_properties(self.device).uuid) if self.device.type == "cuda" else None,
                "sees_gpus": torch.cuda.device_count() if self.device.type == "cuda" else 0}


class TPWorker(Worker):
    """A row-parallel linear layer over a tp x dp mesh: x[:, shard] @ W[shard] all-reduced over tp."""

    @register(Dispatch.ONE_TO_ALL)
    def init_mesh(self, tp_size: int) -> None:
        self.init_distributed()
        dp_size = self.world_size // tp_size
        self.tp_rank, dp_rank = self.rank % tp_size, self.rank // tp_size
        self.tp_size = tp_size
        for d in range(dp_size):  # every rank creates every group, in the same order
            group = dist.new_group(list(range(d * tp_size, (d + 1) * tp_size)))
            if d == dp_rank:
                self.tp_group = group
        self.dp_rank = dp_rank
        self.set_dispatch_info(dp_rank, dp_size, is_collect=self.tp_rank == 0)
        self.seen: list[int] = []

    @register(Dispatch.MESH_COMPUTE_PROTO)
    def forward(self, data: DataProto) -> DataProto:
        x = data.batch["x"]
        rows = HIDDEN // self.tp_size
        shard = slice(self.tp_rank * rows, (self.tp_rank + 1) * rows)
        y = x[:, shard] @ weight()[shard]
        dist.all_reduce(y, group=self.tp_group)
        self.seen = data.batch["row_id"].tolist()
        n = len(data)
        return DataProto.from_dict({"y": y, "row_id": data.batch["row_id"],
                                    "src_tp_rank": torch.full((n,), self.tp_rank),
                                    "src_dp_rank": torch.full((n,), self.dp_rank)})

    @register(Dispatch.DP_COMPUTE_PROTO)
    def compute(self, data: DataProto) -> DataProto:
        return row_fn(data)

    @register(Dispatch.ONE_TO_ALL)
    def last_rows(self) -> list[int]:
        return self.seen


class ActorRole(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def make_weights(self, n: int, on_device: bool = False) -> tuple:
        self.weights = torch.arange(n, dtype=torch.float32, device=self.device if on_device else "cpu")
        return os.getpid(), id(self.weights), self.weights.data_ptr()

    @register(Dispatch.ONE_TO_ALL)
    def init_dist(self) -> tuple:
        return self.init_distributed(), dist.get_rank(), dist.get_world_size()

    @register(Dispatch.ONE_TO_ALL)
    def whoami(self) -> tuple:
        return self.role, self.rank, os.getpid()


class CriticRole(Worker):
    def __init__(self, actor_role: str = "actor"):
        self.actor_role = actor_role

    @register(Dispatch.ONE_TO_ALL)
    def peek_actor(self) -> tuple:
        w = self.peer(self.actor_role).weights
        return os.getpid(), id(w), w.data_ptr()

    @register(Dispatch.ONE_TO_ALL)
    def init_dist(self) -> tuple:
        return self.init_distributed(), dist.get_rank(), dist.get_world_size()

    @register(Dispatch.ONE_TO_ALL)
    def whoami(self) -> tuple:
        return self.role, self.rank, os.getpid()

    @register(Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        return row_fn(data)


class BrokenInit(Worker):
    def __init__(self, bad_rank: int = 1):
        if self.rank == bad_rank:
            raise RuntimeError(f"cannot build on rank {self.rank}")

    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank
