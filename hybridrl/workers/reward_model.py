"""RewardModelWorker: a discriminative reward model (Megatron), colocated with the actor like the critic.

reward_model.megatron.param_offload (true by default) keeps its weights in host memory while it is idle: they come
to the device for compute_rm_score and leave after it, so the reward model takes device memory only in the reward
phase (`hybridrl plan` shows that phase). It has no gradients or optimizer.
"""
from __future__ import annotations

import time
from typing import Any

from hybridrl.config import RunConfig
from hybridrl.controller import Dispatch, Worker, register
from hybridrl.protocol import DataProto

from .common import onloaded, setup_process


class RewardModelWorker(Worker):
    def __init__(self, run: RunConfig, model_dir: str) -> None:
        self.run = run
        self.model_dir = model_dir
        self.model: Any = None

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        import dataclasses

        from hybridrl.adapters.megatron.reward_model import MegatronRewardModel

        run, plan = self.run, self.run.derived.reward
        setup_process(self, run)
        start = time.perf_counter()
        rm = run.cfg.reward_model
        cfg = dataclasses.replace(rm, model=dataclasses.replace(rm.model, path=self.model_dir))
        self.model = MegatronRewardModel(cfg, plan.layout, micro_batch_per_gpu=plan.micro_batch_per_gpu,
                                         max_token_len_per_gpu=plan.max_token_len_per_gpu,
                                         remove_padding=run.cfg.actor_rollout_ref.model.use_remove_padding)
        info = self.model.dispatch_info()
        self.set_dispatch_info(info.dp_rank, info.dp_size, info.is_collect)
        if self._offload_params:
            self.model.offload(params=True, grads=False, optimizer=False)
        return {"rank": self.rank, "seconds": time.perf_counter() - start}

    @property
    def _offload_params(self) -> bool:
        return bool(self.run.cfg.reward_model.megatron.param_offload)

    @register(Dispatch.MESH_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """input_ids/attention_mask [B, T] in the reward model's tokens -> rm_score [B]."""
        from hybridrl.utils.device import peak_metrics, train_peak_memory

        # the peak counts the onloaded weights too (`hybridrl plan`'s reward phase); {} on CPU
        with train_peak_memory() as peak, onloaded(self.model, params=self._offload_params, grads=False, optimizer=False):
            out = self.model.compute_scores(data)
        if peak:
            out.meta_info["metrics"] = peak_metrics("reward", peak)
        return out
