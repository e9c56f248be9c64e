"""RolloutWorker: a rollout engine on its own GPU (or CPU process), for the split placement
(actor_rollout_ref.hybrid_engine=false).

It never trains: the actor's rank 0 broadcasts the weights to every rollout rank after each update
(hybridrl.hybrid.broadcast), and the worker generates with whatever version it last received. Replicas are
tp_g consecutive ranks of the rollout's own world; dispatch splits prompts over replicas as in the hybrid
engine (ROLLOUT_COMPUTE_PROTO).

In the fully async mode (async_training.enable) the worker also runs a ContinuousRollout: prompts submitted with
`submit_prompts` are generated continuously, `take_completed` hands out the finished groups, and a weight receive
waits at the producer's gate between segments instead of for the whole generation.
"""
from __future__ import annotations

import os
import time
from typing import Any, Optional

from hybridrl.config import RunConfig
from hybridrl.controller import Dispatch, Worker, register
from hybridrl.protocol import DataProto
from hybridrl.trainer.startup import engine_parts

from .actor_rollout_ref import ROLLOUT_COMPUTE_PROTO, ROLLOUT_MESH
from .common import (
    build_agent,
    build_rollout_engine,
    load_tokenizer_for,
    planned_kv_cache_bytes,
    sampling_for,
    setup_process,
)


class RolloutWorker(Worker):
    def __init__(self, run: RunConfig, model_dir: str, max_rollout_rows: Optional[int] = None) -> None:
        self.run, self.model_dir, self.max_rollout_rows = run, model_dir, max_rollout_rows
        self.engine: Any = None
        self.agent: Any = None
        self.broadcast: Any = None
        self.version: Optional[int] = None  # the actor's update count the engine's weights come from
        self.awake = False
        self.producer: Any = None  # rollout.continuous.ContinuousRollout in the fully async mode
        self.pad_token_id = 0

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
        began = time.perf_counter()
        self.engine = build_rollout_engine(run, self.model_dir, hf_config, tokenizer, device, self.max_rollout_rows,
                                           kv_cache_bytes=planned_kv_cache_bytes(run, hf_config, device))
        times.update(engine_parts(time.perf_counter() - began, self.engine.startup_times()))
        self.engine.sleep()  # no weights yet: the first broadcast wakes it
        self.agent = build_agent(run, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
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
        """Load the broadcast weights into the engine; check the engine holds what arrived. With a producer running,
        the load waits at its gate for the segments (or, without partial rollout, the samples) in flight."""
        if self.producer is None:
            return self._receive(version)
        start = time.perf_counter()
        metrics = self.producer.sync(lambda: self._receive(version), version,
                                     self.run.derived.placement.fully_async.partial_rollout)
        metrics["timing_s/weight_receive_with_wait"] = time.perf_counter() - start
        return metrics

    def _receive(self, version: int) -> dict[str, float]:
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
        if self.producer is not None:  # validation beside the producer: its segments wait meanwhile
            with self.producer.gate.pause(self.run.cfg.trainer.worker_timeout_s):
                out, metrics = generate_batch(self.engine, prompts, sampling, generate)
        else:
            out, metrics = generate_batch(self.engine, prompts, sampling, generate)
        out.meta_info.update(prompts.meta_info)
        out.meta_info["metrics"] = metrics
        out.meta_info["weight_version"] = self.version
        return out

    # ------------------------------------------------------------------ fully async mode
    @register(Dispatch.ONE_TO_ALL)
    def start_continuous(self) -> None:
        """Start the producer (before the first weights: its gate opens with them)."""
        from hybridrl.rollout.continuous import ContinuousRollout

        plan = self.run.derived.placement.fully_async
        self.producer = ContinuousRollout(
            self.engine, self.agent, response_length=self.run.cfg.data.max_response_length,
            pad_token_id=self.pad_token_id, segment_tokens=plan.segment_tokens, max_stale_syncs=plan.max_stale_syncs,
            sync_timeout_s=self.run.cfg.trainer.worker_timeout_s)
        if self.version is not None:  # weights already here: open the gate on them
            self.producer.sync(lambda: None, self.version, True)
        print(f"hybridrl: rollout rank {self.rank} producer started (pid {os.getpid()})", flush=True)

    @register(Dispatch.ALL_TO_ALL, blocking=False)
    def submit_prompts(self, prompts: Optional[DataProto]) -> None:
        """This rank's share of new prompts (None: none); each becomes a group of rollout.n samples."""
        if prompts is not None and len(prompts):
            self.producer.submit(prompts, sampling_for(self.run, prompts, self.rank // self.run.derived.rollout.tp))

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def take_completed(self, wait_s: float = 0.0) -> tuple[list[DataProto], dict[str, float]]:
        """The groups finished since the last call (a replica's first rank hands them out) and the producer's
        counters."""
        groups = self.producer.take(wait_s)
        return (groups if self.rank % self.run.derived.rollout.tp == 0 else []), self.producer.stats()

    @register(Dispatch.ONE_TO_ALL)
    def stop_continuous(self) -> None:
        if self.producer is not None:
            self.producer.stop()
