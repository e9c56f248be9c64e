"""WeightSync: move the actor's current weights into the colocated rollout engine, once per step.

Ordering (every rank runs it; the export is collective, so all ranks take the same steps):

  after_update()                             with optimizer_offload, right after the update's last optimizer step:
                                             the optimizer state starts for the host on a side stream
                                             (actor.begin_offload) while the trainer goes on to the next step
  push(step)
    1. actor.offload(grads[, optimizer])     free training-only memory before the engine takes any: the grads
                                             are released (zeroed again on onload, nothing is copied); the
                                             optimizer state goes to the host only with optimizer_offload (its
                                             copies, begun in after_update, are waited for and its memory freed)
    1b. barrier                              ranks start the sync together (the wait is timed on its own)
    2. engine.wake_up(["weights"])           re-allocate the engine's weight buffers
    3a. direct.run()                         weights proven copyable (direct.py): actor shard views ->
                                             engine weight views, no export, no extra memory (on a side
                                             stream when remote.run() follows: the two overlap)
        remote.run()                         the pieces other ranks hold (remote.py): packed by their owner,
                                             exchanged point to point, two staging buffers alive at a time
    3b. for bucket in actor.export_weights(bucket_bytes, the other names):
           record checksums of the sampled tensors (sender side), engine.load_weights(bucket)
                                             one bucket alive at a time: the loop drops its reference
                                             before asking the export for the next one, so the peak is
                                             training shards + one bucket + the engine's own copy
    3c. LoRA, lora.merge=false (SyncOptions.adapters): 3a/3b run at the first push only (the frozen base); every
        push then streams the adapters alone: actor.export_adapter_weights -> engine.load_adapter,
        engine.finish_adapter_sync(version) (adapter_sync.py), checked like the base in 5
    4. engine.finish_weight_sync()           the engine fails if a weight was not sent
       (first sync only: prove the direct and cross-GPU copies against what load_weights wrote; all ranks agree)
    5. checks: engine.weight_checksums(sampled names) vs the sender's sums -> WeightSyncError naming it;
       directly copied weights: the engine's destination sums vs the actor's source sums (for pieces
       that came from another rank, vs the sender's sums)
    6. actor.offload(params)                 only with param_offload: the export needed them until here
    7. engine.wake_up(["kv_cache"])          KV cache last, into the memory the actor gave up
  (generate)
  release()
    8. engine.sleep()                        when free_cache_engine: free weights + KV cache (an engine with LoRA
                                             adapters keeps its base: vLLM's stays on the GPU with only the KV cache
                                             freed where the plan fits it, rollout.lora_base_resident, else goes to
                                             host memory, level 1; step 2 then wakes nothing for a resident base)
    9. actor.onload(params of 6, grads)      training state back for log-probs and the update; an offloaded
                                             optimizer state stays on the host until the update's first
                                             optimizer step brings it back (MegatronRole._optimizer_on_device),
                                             so the log-prob passes and a one-step update's forward/backward
                                             run without it (or beside the part of it that fits, which the update
                                             sends for at its start: adapters/megatron/overlap.py)

`rollout_phase(step)` wraps push/release around a block; `generate_sequences` is the per-step call a
rollout worker makes.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

from hybridrl.adapters.base import ActorModel
from hybridrl.protocol import DataProto
from hybridrl.rollout.base import RolloutEngine, SamplingParams
from hybridrl.utils.device import device_memory_used, synchronize, torch_memory_counts

from .adapter_sync import check_adapters, stream_adapters
from .checks import SentChecksums, WeightSyncError, compare_checksums
from .direct import DirectCopy, prove
from .plan import ReshardPlan
from .remote import RemoteCopy, plan_remote

MB = 1 << 20
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncOptions:
    bucket_bytes: int = 512 * MB
    param_offload: bool = False
    # verl's meaning: false keeps the optimizer state on the GPU through generation (no host round trip each
    # step, about 2 x 50 GB/s of copies); true sends it to the host while the engine is awake
    optimizer_offload: bool = False
    free_cache_engine: bool = True
    check: bool = True
    check_fraction: float = 1.0
    direct: bool = True  # copy shards straight into the engine where proven (hybridrl.hybrid.direct)
    zero_copy: bool = False  # cross-GPU pieces view to view where both ends allow it (remote.py); staged was faster
    overlap_local: bool = True  # the local direct copies on a side CUDA stream while the cross-GPU rounds run
    # LoRA with lora.merge=false: the base streams at the first push only, the adapters every push (adapter_sync.py)
    adapters: bool = False

    def __post_init__(self) -> None:
        if self.bucket_bytes < 1:
            raise ValueError(f"SyncOptions.bucket_bytes={self.bucket_bytes} must be >= 1 "
                             f"(actor_rollout_ref.rollout.update_weights_bucket_megabytes)")
        if not 0 < self.check_fraction <= 1:
            raise ValueError(f"SyncOptions.check_fraction={self.check_fraction} must be in (0, 1] "
                             f"(actor_rollout_ref.rollout.sync_check.sample_fraction)")

    @classmethod
    def from_config(cls, rollout_cfg: Any, megatron_cfg: Optional[Any] = None,
                    model_cfg: Optional[Any] = None) -> "SyncOptions":
        """From actor_rollout_ref.rollout, actor_rollout_ref.actor.megatron (for param_offload) and
        actor_rollout_ref.model (LoRA: lora_rank > 0 and lora.merge false sync the adapters apart from the base)."""
        return cls(
            bucket_bytes=rollout_cfg.update_weights_bucket_megabytes * MB,
            param_offload=bool(getattr(megatron_cfg, "param_offload", False)),
            optimizer_offload=bool(getattr(megatron_cfg, "optimizer_offload", False)),
            free_cache_engine=rollout_cfg.free_cache_engine,
            check=rollout_cfg.sync_check.enable,
            check_fraction=rollout_cfg.sync_check.sample_fraction,
            direct=rollout_cfg.direct_weight_copy,
            zero_copy=rollout_cfg.cross_gpu_zero_copy,
            overlap_local=rollout_cfg.cross_gpu_overlap_local,
            adapters=bool(model_cfg is not None and model_cfg.lora_rank > 0 and not model_cfg.lora.merge),
        )


class WeightSync:
    def __init__(self, actor: ActorModel, engine: RolloutEngine, options: SyncOptions,
                 plan: Optional[ReshardPlan] = None) -> None:
        self.actor = actor
        self.engine = engine
        self.options = options
        self.plan = plan  # for the logs: what the first sync did, in layout terms
        self._offloaded: Optional[dict[str, bool]] = None  # what push() offloaded, for release()
        self._described = False
        self._direct: Optional[DirectCopy] = None  # set after the first sync proved it
        self._remote: Optional[RemoteCopy] = None  # the pieces other ranks hold, proven with the direct copy
        self._copy_stream: Optional[torch.cuda.Stream] = None  # the local copies' stream beside the rounds
        self._all_names: Optional[frozenset[str]] = None  # every weight the first (full) sync streamed
        self._adapter_version = 0  # LoRA adapter-only sync: pushes so far (adapter_sync.py)
        self._adapter_sent: Optional[SentChecksums] = None
        if options.adapters != (getattr(engine, "lora", None) is not None):
            sends, built = ("LoRA adapters", "without") if options.adapters else ("full weights", "with")
            raise ValueError(f"WeightSync: the sync sends {sends} but the rollout engine was built {built} adapters; "
                             "build both from the same actor_rollout_ref.model.lora_rank / lora.merge")

    # ------------------------------------------------------------------ the phases
    def push(self, step: int) -> dict[str, float]:
        """Steps 1-7: afterwards the engine holds this step's weights and is ready to generate."""
        if self._offloaded is not None:
            raise RuntimeError("WeightSync.push: the previous push was not released; call release() after generating")
        optimizer = self.options.optimizer_offload
        metrics = self._offload(params=False, grads=True, optimizer=optimizer)
        self._offloaded = {"params": False, "grads": True, "optimizer": optimizer}
        metrics["timing_s/reshard_wait"] = _wait_for_peers()
        start = time.perf_counter()
        self._wake(["weights"])
        metrics["timing_s/engine_wake_weights"] = time.perf_counter() - start
        # the ranks' wakes differ by tens of ms (4 x H200: 0.18 s here, 0.20 s on the slowest rank); the first transfer
        # between two ranks waits for both, so the skew would count as copy time in reshard_stream
        metrics["timing_s/reshard_wait_wake"] = _wait_for_peers()
        sent = SentChecksums(step, self.options.check_fraction, self.engine.weight_dtype, self.engine.checksum_terms)
        first = self._all_names is None
        base = first or not self.options.adapters  # LoRA adapters: the engine keeps the base it got at the first sync
        if base:
            metrics.update(self._stream(sent))
            self.engine.finish_weight_sync()
        if first:
            metrics.update(self._prove_direct())
        if self.options.adapters:
            metrics.update(self._stream_adapters(step, base_bytes=metrics.get("reshard/bytes", 0.0)))
        if self.options.check:
            if base:
                metrics.update(self._check(sent, step))
            if self.options.adapters:
                metrics.update(check_adapters(self.engine, self._adapter_sent))
        metrics["timing_s/reshard"] = time.perf_counter() - start
        self._describe_once(int(metrics["reshard/bytes"]))
        if self.options.param_offload:
            metrics["offload/params_bytes"] = float(self.actor.offload(params=True, grads=False, optimizer=False).params_bytes)
            self._offloaded["params"] = True
        wake_kv = time.perf_counter()
        self._wake(["kv_cache"])
        metrics["timing_s/engine_wake_kv_cache"] = time.perf_counter() - wake_kv
        metrics["memory/rollout_used_bytes"] = float(device_memory_used())  # the rollout phase's peak footprint
        for kind, nbytes in torch_memory_counts().items():  # where it lives, when it grows from step to step
            metrics[f"memory/rollout_torch_{kind}_bytes"] = float(nbytes)
        return metrics

    def release(self) -> dict[str, float]:
        """Steps 8-9: the engine sleeps (if free_cache_engine) and the training state comes back."""
        if self._offloaded is None:
            return {}
        metrics: dict[str, float] = {}
        if self.options.free_cache_engine:
            start = time.perf_counter()
            self.engine.sleep()
            metrics["timing_s/engine_sleep"] = time.perf_counter() - start
        report = self.actor.onload(**{**self._offloaded, "optimizer": False})
        self._offloaded = None
        metrics["timing_s/onload"] = float(report.seconds)
        metrics["onload/bytes"] = float(report.total_bytes)
        return metrics

    def after_update(self) -> None:
        """The update's optimizer steps are done: with optimizer_offload the state starts for the host now, beside
        whatever runs until the next push(), which waits for the rest of the copies (timing_s/optimizer_offload_exposed)."""
        if self.options.optimizer_offload and self._offloaded is None:
            self.actor.begin_offload(params=False, optimizer=True)

    @contextmanager
    def rollout_phase(self, step: int) -> Iterator[dict[str, float]]:
        """push() before the block, release() after it, even if generation raised."""
        metrics: dict[str, float] = {}
        try:
            metrics.update(self.push(step))
            yield metrics
        finally:
            metrics.update(self.release())

    # ------------------------------------------------------------------ pieces
    def _wake(self, tags: list[str]) -> None:
        """engine.wake_up, with an out-of-memory error that names the settings which give the engine room."""
        try:
            self.engine.wake_up(tags)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if isinstance(e, RuntimeError) and "out of memory" not in str(e).lower():
                raise
            kept = [k for k, on in (("optimizer state", not self.options.optimizer_offload),
                                    ("parameters", not self.options.param_offload)) if on]
            raise WakeOutOfMemory(
                f"rank {_rank()}: the rollout engine ran out of GPU memory waking its {'/'.join(tags)} with "
                f"{device_memory_used() / 2**30:.1f} GiB in use ({', '.join(kept) or 'nothing'} of the actor kept on "
                "the GPU). Set actor_rollout_ref.actor.megatron.optimizer_offload=true (the optimizer state waits "
                "on the host during generation), param_offload=true, or lower "
                "actor_rollout_ref.rollout.gpu_memory_utilization; `hybridrl plan` shows each phase's memory"
            ) from e

    def _describe_once(self, model_bytes: int) -> None:
        if self.plan is not None and not self._described:
            log.info("%s", self.plan.describe(model_bytes))
            self._described = True

    def _offload(self, *, params: bool, grads: bool, optimizer: bool) -> dict[str, float]:
        report = self.actor.offload(params=params, grads=grads, optimizer=optimizer)
        metrics = {"timing_s/offload": float(report.seconds), "offload/bytes": float(report.total_bytes),
                   "timing_s/offload_wait": float(report.wait_seconds),
                   "timing_s/offload_host_alloc": float(report.host_alloc_seconds)}
        if report.optimizer_bytes:  # the state's copies (begun in after_update) and the part of them push waited for
            metrics["timing_s/optimizer_offload"] = float(report.optimizer_seconds)
            metrics["timing_s/optimizer_offload_exposed"] = float(report.optimizer_exposed_seconds)
        return metrics

    def _side_stream(self, direct: Optional[DirectCopy], remote: Optional[RemoteCopy]) -> Optional[torch.cuda.Stream]:
        """The stream the local copies run on beside the cross-GPU rounds (SyncOptions.overlap_local), waiting for
        what this stream queued before (the optimizer step that wrote the shards); None: run them in line."""
        if not (self.options.overlap_local and direct is not None and remote is not None
                and direct.pairs[0].dst.is_cuda):
            return None
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device=direct.pairs[0].dst.device)
        self._copy_stream.wait_stream(torch.cuda.current_stream())
        return self._copy_stream

    def _stream(self, sent: SentChecksums) -> dict[str, float]:
        start = time.perf_counter()
        direct, remote, names = self._direct, self._remote, None
        copied_names: set[str] = set()
        side = self._side_stream(direct, remote)
        if direct is not None:
            # the NCCL rounds start behind everything queued on this stream: the local copies on their own stream
            # let the first round go at once (tp2 -> tp_g2 copied its 7.6 GB a GPU in 4.7 ms, 4 x H200; rdp4's
            # local half is as large). They write other bytes of the engine's weights than the rounds do, and read
            # the actor's shards as the packing does.
            with torch.cuda.stream(side) if side is not None else nullcontext():
                direct.run()
            copied_names |= direct.names
        if remote is not None:
            remote.run()
            copied_names |= remote.names
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
        if direct is not None or remote is not None:
            self.engine.weights_copied(copied_names)
            names = self._all_names - copied_names
        seen: set[str] = set()
        total = buckets = tensors = biggest = 0
        if names is None:
            export = self.actor.export_weights(self.options.bucket_bytes)
        else:  # only what the direct copy does not cover (nothing at all when it covers everything)
            export = self.actor.export_weights(self.options.bucket_bytes, names) if names else iter(())
        for bucket in export:
            size = _bucket_bytes(bucket, seen, buckets)
            sent.record_bucket(bucket)
            self.engine.load_weights(bucket)
            total, buckets, tensors, biggest = total + size, buckets + 1, tensors + len(bucket), max(biggest, size)
            del bucket  # before the export builds the next one: never two buckets alive
        if buckets == 0 and direct is None and remote is None:
            raise WeightSyncError("actor.export_weights yielded no weights")
        if self._all_names is None:
            self._all_names = frozenset(seen)
        synchronize()  # the weights are in when the copies have run, not when they were queued
        # direct_bytes: written into the engine without the export (local copies + what came from other ranks);
        # remote_bytes: the part of them this rank received (the cross-GPU copy's floor is these over NCCL)
        received = remote.recv_bytes if remote is not None else 0
        copied = (direct.bytes if direct is not None else 0) + received
        return {"timing_s/reshard_stream": time.perf_counter() - start, "reshard/bytes": float(total + copied),
                "reshard/direct_bytes": float(copied), "reshard/direct_graph": float(direct is not None and direct.graphed),
                # this sync captured the copy's CUDA graph (a storage layout seen before: direct.py), so it cost more
                "reshard/direct_captured": float(direct is not None and direct.last == "capture"),
                "reshard/remote_bytes": float(received),
                "reshard/remote_sent_bytes": float(remote.sent_bytes if remote is not None else 0),
                "reshard/remote_rounds": float(len(remote.rounds) if remote is not None else 0),
                "reshard/remote_staging_bytes": float(remote.staging_bytes if remote is not None else 0),
                "reshard/remote_zero_copy_bytes": float(remote.zero_copy_bytes if remote is not None else 0),
                "reshard/buckets": float(buckets),
                "reshard/tensors": float(tensors), "reshard/max_bucket_bytes": float(biggest)}

    def _stream_adapters(self, step: int, base_bytes: float) -> dict[str, float]:
        """LoRA adapter-only sync: this version's adapters (adapter_sync.py); reshard/bytes counts the base only on the
        first push, when it streamed too."""
        self._adapter_version += 1
        self._adapter_sent = SentChecksums(step, self.options.check_fraction)
        metrics = stream_adapters(self.actor, self.engine, self.options.bucket_bytes, self._adapter_version,
                                  self._adapter_sent)
        metrics["reshard/bytes"] = base_bytes + metrics["reshard/adapter_bytes"]
        if not base_bytes:  # adapters only: they are this push's stream
            metrics["timing_s/reshard_stream"] = metrics["timing_s/adapter_stream"]
        return metrics

    def _prove_direct(self) -> dict[str, float]:
        """After the first (full, bucketed) sync: which weights may be copied directly from now on."""
        regions = self.actor.weight_regions() if self.options.direct else None
        if regions is None:
            return {}
        start = time.perf_counter()
        direct = prove(regions, self.engine.weight_views(regions), self._group_of)
        pairs = direct.pairs
        if _world() > 1:  # what the engine needs beyond this rank's own shards where the layouts differ
            local, self._remote = plan_remote(regions, self.engine, direct.names, self._group_of,
                                              self.options.bucket_bytes, self.options.zero_copy)
            pairs = pairs + local
        self._direct = DirectCopy(pairs) if pairs else None
        copied = (self._direct.names if self._direct else set()) | (self._remote.names if self._remote else set())
        # bytes are per rank: under tp each rank copies only its shard, so they are no share of the streamed bytes
        log.info("direct weight copy: %d of %d weights proven against load_weights (%.1f MiB per rank copied in "
                 "place, %.1f MiB of it from other ranks, from now on); %d stream through the export", len(copied),
                 len(self._all_names), ((self._direct.bytes if self._direct else 0)
                                        + (self._remote.recv_bytes if self._remote else 0)) / 2**20,
                 (self._remote.recv_bytes if self._remote else 0) / 2**20, len(self._all_names - copied))
        return {"timing_s/direct_prove": time.perf_counter() - start}

    def _group_of(self, name: str) -> str:
        """The engine's checksum group (a fused parameter's members go direct together)."""
        return self.engine.checksum_terms(name)[0][0]

    def _check(self, sent: SentChecksums, step: int) -> dict[str, float]:
        start = time.perf_counter()
        metrics = {"sync_check/tensors_checked": 0.0, "sync_check/max_rel_diff": 0.0}
        if sent.names() or (self._direct is None and self._remote is None):
            engine_sums = self.engine.weight_checksums(sent.names())
            metrics.update(compare_checksums(sent, engine_sums, rtol=self.engine.checksum_rtol))
        if self._direct is not None:
            metrics.update(self._direct.check(step, self.options.check_fraction, self._group_of))
        if self._remote is not None:
            metrics.update(self._remote.check(step, self.options.check_fraction))
        metrics["timing_s/sync_check"] = time.perf_counter() - start
        return metrics


class WakeOutOfMemory(MemoryError):
    """The engine could not take its memory back beside what training keeps on the GPU."""


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _wait_for_peers() -> float:
    """Seconds this rank waits for the slowest rank to finish its offload (or its engine's wake). Without this
    barrier the wait lands inside the sync's first collective and is reported as sync time (sync times that swing
    with how long each rank's offload or wake took)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return 0.0
    start = time.perf_counter()
    dist.barrier()
    synchronize()
    return time.perf_counter() - start


def _bucket_bytes(bucket: list, seen: set[str], index: int) -> int:
    """Bytes of one bucket; fails on a name sent twice in one sync. The size is reported, not enforced:
    the export closes a bucket once it reaches the limit, so one may exceed it by its last entry."""
    size = 0
    for name, tensor in bucket:
        if name in seen:
            raise WeightSyncError(f"actor.export_weights sent {name!r} twice in one sync (bucket {index})")
        seen.add(name)
        size += tensor.numel() * tensor.element_size()
    return size


def generate_sequences(sync: WeightSync, prompts: DataProto, sampling: SamplingParams, *, step: int,
                       generate: Optional[Callable[[RolloutEngine, DataProto, SamplingParams], DataProto]] = None
                       ) -> tuple[DataProto, dict[str, float]]:
    """One rollout step on this rank: sync the weights, generate this replica's prompts, release.

    `prompts` is this replica's chunk (plan.prompt_slice); every rank of a replica passes the same one.
    `generate(engine, prompts, sampling)` replaces the engine's own batch generate (the agent loop); the
    metrics it leaves in meta_info["metrics"] join the step's.
    """
    with sync.rollout_phase(step) as metrics:
        out, generated = generate_batch(sync.engine, prompts, sampling, generate)
        metrics.update(generated)
    return out, metrics


def generate_batch(engine: RolloutEngine, prompts: DataProto, sampling: SamplingParams,
                   generate: Optional[Callable[[RolloutEngine, DataProto, SamplingParams], DataProto]] = None
                   ) -> tuple[DataProto, dict[str, float]]:
    """Generate on weights already in the engine (the split placement's rollout worker calls it directly)."""
    start = time.perf_counter()
    out = generate(engine, prompts, sampling) if generate is not None else engine.generate(prompts, sampling)
    metrics = {"timing_s/generate": time.perf_counter() - start, **out.meta_info.pop("metrics", {})}
    mask = out.batch["response_mask"]
    metrics["rollout/response_length_mean"] = float(mask.sum(-1).float().mean()) if len(out) else 0.0
    metrics["rollout/tokens"] = float(mask.sum())
    return out, metrics
