"""RolloutWorker: a rollout engine on its own GPU (or CPU process), for the split placement
(actor_rollout_ref.hybrid_engine=false).

It never trains: the actor's rank 0 broadcasts the weights to every rollout rank after each update
(hybridrl.hybrid.broadcast), and the worker generates with whatever version it last received. Replicas are
tp_g consecutive ranks of the rollout's own world; dispatch splits prompts over replicas as in the hybrid
engine (ROLLOUT_COMPUTE_PROTO).
"""
from __future__ import annotations

import time
from typing import Any, Optional

from hybridrl.config import RunConfig
from hybridrl.controller import Dispatch, Worker, register
from hybridrl.protocol import DataProto
from hybridrl.utils.timing import timed

from .actor_rollout_ref import ROLLOUT_COMPUTE_PROTO, ROLLOUT_MESH
from .common import build_agent, build_rollout_engine, load_tokenizer_for, sampling_for, setup_process


class RolloutWorker(Worker):
    def __init__(self, run: RunConfig, model_dir: str, max_rollout_rows: Optional[int] = None) -> None:
        self.run, self.model_dir, self.max_rollout_rows = run, model_dir, max_rollout_rows
        self.engine: Any = None
        self.agent: Any = None
        self.broadcast: Any = None
        self.version: Optional[int] = None  # the actor's update count the engine's weights come from
        self.awake = False

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        """Build the engine on placeholder weights (the first broadcast fills them) and declare the replicas."""
        from transformers import AutoConfig

        run, d = self.run, self.run.derived
        ara = run.cfg.actor_rollout_ref
        device = setup_process(self, run)
        times: dict[str, float] = {}
        hf_config = AutoConfig.from_pretrained(self.model_dir, trust_remote_code=ara.model.trust_remote_code,
                                               **ara.model.override_config)
        tokenizer = load_tokenizer_for(self.model_dir, run)
        with timed(times, "engine_init"):
            self.engine = build_rollout_engine(run, self.model_dir, hf_config, tokenizer, device, self.max_rollout_rows)
        times.update(self.engine.startup_times())
        self.engine.sleep()  # no weights yet: the first broadcast wakes it
        self.agent = build_agent(run, tokenizer)
        tp_g = d.rollout.tp
        self.set_dispatch_info(self.rank // tp_g, d.rollout.dp, self.rank % tp_g == 0, mesh=ROLLOUT_MESH)
        return {"rank": self.rank, "startup": times}

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_broadcast(self, addr: str, port: int, world_size: int) -> None:
        from hybridrl.hybrid.broadcast import BroadcastGroup

        self.broadcast = BroadcastGroup.open(addr, port, 1 + self.rank, world_size, self.device,
                                             timeout_s=self.run.cfg.trainer.dist_timeout_s)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self, version: int) -> dict[str, float]:
        """Load the broadcast weights into the engine; check the engine holds what arrived."""
        from hybridrl.hybrid.checks import SentChecksums, compare_checksums

        start = time.perf_counter()
        check = self.run.cfg.actor_rollout_ref.rollout.sync_check
        if not self.awake:
            self.engine.wake_up(["weights"])
        fraction = check.sample_fraction if check.enable else 0.0
        arrived = SentChecksums(version, fraction, self.engine.weight_dtype, self.engine.checksum_terms)
        for bucket in self.broadcast.receive(fraction, step=version):
            arrived.record_bucket(bucket)
            self.engine.load_weights(bucket)
            del bucket
        self.engine.finish_weight_sync()
        metrics: dict[str, float] = {}
        if arrived.names():
            metrics.update(compare_checksums(arrived, self.engine.weight_checksums(arrived.names()),
                                             rtol=self.engine.checksum_rtol))
        if not self.awake:
            self.engine.wake_up(["kv_cache"])
            self.awake = True
        self.version = version
        metrics["timing_s/weight_receive"] = time.perf_counter() - start
        return metrics

    @register(ROLLOUT_COMPUTE_PROTO, blocking=False)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """n samples per prompt of this replica's prompts, on the last weights received."""
        from hybridrl.hybrid.weight_sync import generate_batch

        if self.version is None:
            raise RuntimeError(f"rollout rank {self.rank}: generate_sequences before any weights were received")
        sampling = sampling_for(self.run, prompts, self.rank // self.run.derived.rollout.tp)
        generate = self.agent.generate if self.agent is not None else None
        out, metrics = generate_batch(self.engine, prompts, sampling, generate)
        out.meta_info.update(prompts.meta_info)
        out.meta_info["metrics"] = metrics
        out.meta_info["weight_version"] = self.version
        return out
