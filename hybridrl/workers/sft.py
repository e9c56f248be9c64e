"""SFTWorker: the Megatron SFT model (adapters/megatron/sft.py) as a controller role, one process per GPU.

Batches are split over the training layout's dp ranks and collected from tp rank 0 of the last pipeline stage,
as the actor's are (Dispatch.MESH_COMPUTE_PROTO); checkpoints use the actor's format (megatron dist checkpoint,
meta.json, huggingface/ side files), and `save_hf` writes the full HF folder an RL run starts from.
"""
from __future__ import annotations

from typing import Any, Optional

from hybridrl.controller import Dispatch, Worker, register
from hybridrl.protocol import DataProto

from .common import setup_process


class SFTWorker(Worker):
    def __init__(self, run: Any, model_dir: str, total_training_steps: int, tokenizer_dir: Optional[str] = None) -> None:
        """run: a validated SFTRun (hybridrl.config.sft_validate)."""
        self.run = run
        self.model_dir = model_dir
        self.total_training_steps = total_training_steps
        self.tokenizer_dir = tokenizer_dir
        self.model: Any = None

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        from hybridrl.adapters.megatron.sft import MegatronSFT

        setup_process(self, self.run)
        cfg, d = self.run.cfg, self.run.derived
        self.model = MegatronSFT(self.model_dir, cfg.engine, cfg.optim, d.layout, d.batch,
                                 total_training_steps=self.total_training_steps,
                                 recompute=cfg.model.enable_gradient_checkpointing,
                                 remove_padding=cfg.model.use_remove_padding, override_config=cfg.model.override_config)
        info = self.model.dispatch_info()
        self.set_dispatch_info(info.dp_rank, info.dp_size, info.is_collect)
        return {"rank": self.rank, "num_params": getattr(self.model, "num_params", None)}

    @register(Dispatch.MESH_COMPUTE_PROTO)
    def train_batch(self, data: DataProto) -> DataProto:
        return DataProto(meta_info={"metrics": self.model.train_batch(data)})

    @register(Dispatch.MESH_COMPUTE_PROTO)
    def nll_per_row(self, data: DataProto) -> DataProto:
        return self.model.nll_per_row(data)

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.model.save_checkpoint(path)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.model.load_checkpoint(path)

    @register(Dispatch.ONE_TO_ALL)
    def save_hf(self, path: str) -> None:
        self.model.save_hf(path, self.tokenizer_dir)
