"""CriticWorker: the value model, colocated with the actor (same processes, same Megatron layout).

critic.megatron.{param,grad,optimizer}_offload keep that state in host memory while the critic is idle: it comes
back for the critic's own calls (values, update, checkpoints) and leaves after them."""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from hybridrl.config import RunConfig
from hybridrl.controller import Dispatch, Worker, register
from hybridrl.protocol import DataProto

from .common import offload_flags, onloaded, setup_process


class CriticWorker(Worker):
    def __init__(self, run: RunConfig, model_dir: str, total_training_steps: int) -> None:
        self.run = run
        self.model_dir = model_dir
        self.total_training_steps = total_training_steps
        self.critic: Any = None

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        from hybridrl.adapters.megatron import MegatronCritic

        run, d = self.run, self.run.derived
        setup_process(self, run)
        start = time.perf_counter()
        cfg = dataclasses.replace(run.cfg.critic, model=dataclasses.replace(run.cfg.critic.model, path=self.model_dir))
        self.critic = MegatronCritic(cfg, d.critic, d.critic_batch, total_training_steps=self.total_training_steps)
        info = self.critic.dispatch_info()
        self.set_dispatch_info(info.dp_rank, info.dp_size, info.is_collect)
        if any(self._offload.values()):
            # host memory for the state as it is after the first step (Adam's moments too), pinned at start-up
            self.critic.prepare_offload(**self._offload)
            self.critic.offload(**self._offload)
        return {"rank": self.rank, "seconds": time.perf_counter() - start}

    @property
    def _offload(self) -> dict[str, bool]:
        return offload_flags(self.run.cfg.critic.megatron)

    @register(Dispatch.MESH_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        with onloaded(self.critic, params=self._offload["params"], grads=False, optimizer=False):
            return self.critic.compute_values(data)

    @register(Dispatch.MESH_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        with onloaded(self.critic, **self._offload):
            return DataProto(meta_info={"metrics": self.critic.update_critic(data)})

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        with onloaded(self.critic, **self._offload):
            self.critic.save_checkpoint(path)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        with onloaded(self.critic, **self._offload):
            self.critic.load_checkpoint(path)
