"""ActorRolloutRefWorker: policy + rollout engine + reference policy in one process per GPU.

Two meshes are declared for dispatch: the training layout (tp x pp x dp; a batch is split over dp and
collected from tp rank 0 of the last pipeline stage) for log-probs and updates, and the rollout layout
(replicas of tp_g consecutive ranks; a batch of prompts is split over replicas and collected from each
replica's first rank) for generation.

With a split placement (actor_rollout_ref.hybrid_engine=false) it builds no engine: the rollout has workers
of its own (rollout.py) and this worker's rank 0 broadcasts the weights to them (broadcast_weights).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Optional

from hybridrl.config import RunConfig
from hybridrl.controller import Dispatch, Worker, register, register_mesh_dispatch_mode
from hybridrl.protocol import DataProto
from hybridrl.trainer.startup import engine_parts
from hybridrl.utils.device import device_memory_used, peak_metrics, train_peak_memory
from hybridrl.utils.imports import load_object
from hybridrl.utils.net import free_port
from hybridrl.utils.timing import timed

from .common import (
    build_agent,
    build_rollout_engine,
    load_tokenizer_for,
    offload_flags,
    onloaded,
    planned_kv_cache_bytes,
    sampling_for,
    setup_process,
)

log = logging.getLogger(__name__)
ROLLOUT_MESH = "rollout"
ARA_HYBRID = "actor_rollout_ref.hybrid_engine"
ROLLOUT_COMPUTE_PROTO = "ROLLOUT_COMPUTE_PROTO"
register_mesh_dispatch_mode(ROLLOUT_COMPUTE_PROTO, ROLLOUT_MESH, override=True)


def _actor_class(run: RunConfig) -> type:
    adapter = run.cfg.actor_rollout_ref.actor.adapter
    if adapter.path:
        from hybridrl.adapters.base import ActorModel

        cls = load_object(adapter.path, adapter.name or "", "actor_rollout_ref.actor.adapter.path",
                          "actor_rollout_ref.actor.adapter.name")
        if not (isinstance(cls, type) and issubclass(cls, ActorModel)):
            raise TypeError(f"actor_rollout_ref.actor.adapter: {adapter.path}:{adapter.name} must subclass "
                            "hybridrl.adapters.base.ActorModel")
        return cls
    from hybridrl.adapters.megatron import MegatronActor

    return MegatronActor


class ActorRolloutRefWorker(Worker):
    def __init__(self, run: RunConfig, model_dir: str, total_training_steps: int,
                 max_rollout_rows: Optional[int] = None) -> None:
        """max_rollout_rows: the most sequences one generate call gives a replica (training or validation);
        the engine fits its CUDA graphs to it (None: the engine's own default)."""
        self.run = run
        self.model_dir = model_dir
        self.total_training_steps = total_training_steps
        self.max_rollout_rows = max_rollout_rows
        self.actor: Any = None
        self.ref: Any = None
        self.engine: Any = None
        self.sync: Any = None
        self.plan: Any = None
        self.sync_count = 0
        self.engine_memory: dict[str, int] = {}
        self.agent: Any = None  # hybridrl.agent.AgentRollout when rollout.multi_turn.enable
        self.broadcast: Any = None  # split placement, rank 0: hybridrl.hybrid.broadcast.BroadcastGroup

    # ------------------------------------------------------------------ setup
    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        """Build actor, reference and engine, then run the first weight sync (it streams and proves the
        direct copy) so that start-up, not step 1, carries it. Returns the memory phases and the seconds of
        each part (hybridrl.trainer.startup)."""
        from hybridrl.adapters.megatron import MegatronActor
        from hybridrl.hybrid.plan import ReshardPlan
        from hybridrl.hybrid.weight_sync import SyncOptions, WeightSync

        run, d = self.run, self.run.derived
        ara = run.cfg.actor_rollout_ref
        start = time.perf_counter()
        times: dict[str, float] = {}
        with timed(times, "process_group"):
            device = setup_process(self, run)
        model = dataclasses.replace(ara.model, path=self.model_dir)
        with timed(times, "actor_build"):
            self.actor = _actor_class(run)(model, ara.actor, d.actor, d.actor_batch,
                                           total_training_steps=self.total_training_steps)
        if not d.placement.split:  # the hybrid engine offloads between steps: host memory pinned from now on
            self.actor.prepare_offload(**offload_flags(ara.actor.megatron), onload_reserve=self._onload_reserve())
        if d.use_reference and getattr(self.actor, "lora", None) is not None:  # LoRA: the actor, adapters off
            self.ref = self.actor.adapters_off(ara.ref, d.ref_forward_micro_batch_per_gpu)
        elif d.use_reference:
            with timed(times, "ref_build"):
                self.ref = MegatronActor.reference(model, ara.ref, d.actor, d.ref_forward_micro_batch_per_gpu)
            if ara.ref.megatron.param_offload:  # its weights wait in host memory for its log-prob pass
                self.ref.offload(params=True, grads=False, optimizer=False)
        if d.placement.split:  # the rollout has its own workers (rollout.py); weights go by broadcast
            info = self.actor.dispatch_info()
            self.set_dispatch_info(info.dp_rank, info.dp_size, info.is_collect)
            times.update(self.actor.startup_times())
            return {"rank": self.rank, "seconds": time.perf_counter() - start, "startup": times}
        tokenizer = load_tokenizer_for(self.model_dir, run)
        self.agent = build_agent(run, tokenizer)
        hf_config = self.actor.hf_config
        self.plan = ReshardPlan.from_layouts(d.actor, d.rollout, hf_config)
        self._declare_meshes()
        # The engine measures free memory when it starts: give it the memory training state holds.
        self.actor.offload(params=True, grads=True, optimizer=True)
        times.update(self.actor.startup_times())  # its build's parts; what pinning the host arenas cost, and what of it start-up waited
        before = device_memory_used()
        began = time.perf_counter()
        self.engine = build_rollout_engine(run, self.model_dir, hf_config, tokenizer, device, self.max_rollout_rows,
                                           kv_cache_bytes=planned_kv_cache_bytes(run, hf_config, device))
        times.update(engine_parts(time.perf_counter() - began, self.engine.startup_times()))
        awake = device_memory_used()
        self.engine.sleep()
        asleep = device_memory_used()
        self.engine_memory = {"before_engine_bytes": before, "engine_awake_bytes": awake, "engine_asleep_bytes": asleep}
        self.actor.onload(params=True, grads=True, optimizer=True)
        self.sync = WeightSync(self.actor, self.engine, SyncOptions.from_config(ara.rollout, ara.actor.megatron, ara.model),
                               self.plan)
        with timed(times, "first_sync"), self.sync.rollout_phase(0):
            pass
        return {"rank": self.rank, "seconds": time.perf_counter() - start, "plan": self.plan.describe(),
                "startup": times, **self.engine_memory}

    def _onload_reserve(self) -> Optional[int]:
        """With optimizer_offload on a GPU: the bytes the actor's forward/backward needs beyond what is resident (the
        plan's activations and margin), so that the optimizer state comes back beside it as far as memory allows."""
        run = self.run
        megatron = run.cfg.actor_rollout_ref.actor.megatron
        if run.derived.device != "cuda" or not (megatron.optimizer_offload and megatron.optimizer_onload_overlap):
            return None
        from hybridrl.plan.estimate import actor_onload_reserve
        from hybridrl.plan.model_shape import from_hf_config

        config = getattr(self.actor, "hf_config", None)
        try:
            return actor_onload_reserve(run, from_hf_config(config.to_dict() if hasattr(config, "to_dict") else config))
        except Exception as e:  # a shape the plan cannot read: the state comes back after the backward, as before
            log.warning("actor: no memory plan for this model (%s); its optimizer state comes back after the "
                        "forward/backward, not beside it", e)
            return None

    def _declare_meshes(self) -> None:
        info = self.actor.dispatch_info()
        self.set_dispatch_info(info.dp_rank, info.dp_size, info.is_collect)
        where = self.plan.placement(self.rank)
        self.set_dispatch_info(where.replica, self.plan.dp_g, where.tp_g_rank == 0, mesh=ROLLOUT_MESH)

    # ------------------------------------------------------------------ rollout
    @register(ROLLOUT_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """n samples per prompt of this replica's prompts (meta_info: step, draw, validate)."""
        from hybridrl.hybrid.weight_sync import generate_sequences

        if self.sync is None:
            raise RuntimeError("actor_rollout_ref.generate_sequences: this actor has no rollout engine "
                               f"({ARA_HYBRID}=false); the rollout group generates")
        start = time.perf_counter()
        sampling = sampling_for(self.run, prompts, self.plan.placement(self.rank).replica)
        self.sync_count += 1
        generate = self.agent.generate if self.agent is not None else None
        out, metrics = generate_sequences(self.sync, prompts, sampling, step=self.sync_count, generate=generate)
        out.meta_info.update(prompts.meta_info)
        # the worker's whole share of the driver's gen (sync, generate, release); the driver's gen less its slowest
        # rank's (timing_s/rollout_worker_slowest) is the controller's own time: dispatch, transfer, concatenation
        metrics["timing_s/rollout_worker"] = time.perf_counter() - start
        out.meta_info["metrics"] = metrics
        return out

    # ------------------------------------------------------------------ training
    @register(Dispatch.MESH_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """old_log_probs and entropys [B, R] (+ sum_pi_squared when meta_info calculate_sum_pi_squared is set)."""
        out = self.actor.compute_log_prob(data, calculate_entropy=True)
        keep = {"old_log_probs": out.batch["log_probs"], "entropys": out.batch["entropys"]}
        for extra in ("sum_pi_squared", "routing_agreement"):  # asked-for sum of pi^2; MoE with the rollout's routing
            if extra in out.batch:
                keep[extra] = out.batch[extra]
        return DataProto.from_dict(keep)

    @register(Dispatch.MESH_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        if self.ref is None:
            raise RuntimeError("compute_ref_log_prob: no reference model (use_kl_loss and use_kl_in_reward are off)")
        offload = self.run.cfg.actor_rollout_ref.ref.megatron.param_offload
        # the peak counts the onloaded weights too (`hybridrl plan`'s ref_log_prob phase)
        with train_peak_memory() as peak, onloaded(self.ref, params=offload, grads=False, optimizer=False):
            out = self.ref.compute_log_prob(data, calculate_entropy=False)
        result = DataProto.from_dict({"ref_log_prob": out.batch["log_probs"]})
        if peak:
            result.meta_info["metrics"] = peak_metrics("ref", peak)
        return result

    @register(Dispatch.MESH_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        start = time.perf_counter()
        with train_peak_memory() as peak:
            metrics = self.actor.update_policy(data)
        if self.sync is not None:  # optimizer_offload: the state starts for the host beside what follows
            self.sync.after_update()
        metrics["timing_s/update_actor_worker"] = time.perf_counter() - start
        metrics.update(peak_metrics("train", peak))
        return DataProto(meta_info={"metrics": metrics})

    # ------------------------------------------------------------------ split placement: weights by broadcast
    @register(Dispatch.RANK_ZERO)
    def weight_broadcast_address(self) -> tuple[str, int]:
        """Where the weight broadcast group meets: this node (rank 0 picked it as MASTER_ADDR) and a free port."""
        return self.master_addr, free_port()

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_broadcast(self, addr: str, port: int, world_size: int) -> None:
        """Rank 0 hosts the group (rank 0 of it) the rollout ranks join; the other actor ranks only export."""
        from hybridrl.hybrid.broadcast import BroadcastGroup

        if self.rank == 0:
            self.broadcast = BroadcastGroup.open(addr, port, 0, world_size, self.device,
                                                 timeout_s=self.run.cfg.trainer.dist_timeout_s)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def broadcast_weights(self, version: int) -> dict[str, float]:
        """Export the current weights (collective over the actor ranks); rank 0 sends them to the rollout."""
        sync = self.run.cfg.actor_rollout_ref.rollout
        export = self.actor.export_weights(sync.update_weights_bucket_megabytes << 20)
        if self.rank != 0:
            for _ in export:  # the gathers need every rank
                pass
            return {}
        fraction = sync.sync_check.sample_fraction if sync.sync_check.enable else 0.0
        return self.broadcast.send(export, check_fraction=fraction, step=version)

    # ------------------------------------------------------------------ checkpoints
    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.actor.save_checkpoint(path)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.actor.load_checkpoint(path)

    @register(Dispatch.RANK_ZERO)
    def model_info(self) -> dict[str, Any]:
        cfg = self.actor.hf_config
        return {"hf_config": cfg.to_dict(), "num_params": getattr(self.actor, "num_params", None)}

    def shutdown_engine(self) -> Optional[None]:
        self.engine = None
