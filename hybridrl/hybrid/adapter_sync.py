"""The adapter-only weight sync (LoRA with actor_rollout_ref.model.lora.merge=false): WeightSync's step 3 after the
first sync, when the engine already holds the frozen base.

Ordering inside WeightSync.push (every rank runs it; the export is collective):
  first push   the base streams as a full sync does (actor.export_weights gives the base without the adapters),
               then the adapters below
  every push   for bucket in actor.export_adapter_weights(bucket_bytes):
                   record checksums of what the engine will hold (engine.adapters_as_held), engine.load_adapter(bucket)
               engine.finish_adapter_sync(version)      fails if an adapter tensor was not sent; requests use it now
  checks       engine.adapter_checksums(sampled names) vs the sender's sums -> WeightSyncError naming the tensor
The engine keeps its base across sleeps (the torch engine's level-1 sleep; the vLLM LoRA engine keeps it on the GPU
and frees the KV cache alone, or sleeps at level 1 with the weights in host memory: hybridrl/rollout/vllm_lora.py), so
a push moves only the adapters: reshard/bytes is their size. The sender's sums of a bucket's adapters are taken in a
few kernels for an engine that compares within a tolerance (a 7B model has 392 of them at rank 32, all-linear: about
2,700 kernel launches one at a time). The version is a counter of pushes (1, 2, ...), never reused, so that an engine
may key caches by it.

Per-tensor work is what this sync costs (154 MiB of adapters copy in well under a millisecond on a GPU; on an H200 the
392 tensors of the 7B took 28-30 ms a step on the CPU side): every step's loop over a bucket is kept to a few Python
operations a tensor, and the device work to a few kernels a bucket. The Megatron actor plans its export once
(lora_io.AdapterExport), the sender's sums and the vLLM engine's as-held values, writes and sums are batched, and
benchmarks/probes/adapter_sync_probe.py measures the whole path (ms a step by part, aten ops and Python calls a
tensor).
"""
from __future__ import annotations

import time
from typing import Any

from hybridrl.rollout.base import RolloutEngine
from hybridrl.utils.device import synchronize

from .checks import SentChecksums, WeightSyncError, compare_checksums


def stream_adapters(actor: Any, engine: RolloutEngine, bucket_bytes: int, version: int,
                    sent: SentChecksums) -> dict[str, float]:
    """Stream this version's adapters into the engine, one bucket alive at a time; returns reshard/adapter_* metrics."""
    start = time.perf_counter()
    seen: set[str] = set()
    total = buckets = tensors = 0
    for bucket in actor.export_adapter_weights(bucket_bytes):
        names = [name for name, _ in bucket]
        fresh = set(names)
        if len(fresh) != len(names) or not seen.isdisjoint(fresh):
            raise WeightSyncError(f"actor.export_adapter_weights sent {_twice(names, seen)!r} twice in one sync "
                                  f"(bucket {buckets})")
        seen |= fresh
        total += sum(tensor.nbytes for _, tensor in bucket)
        _record(sent, engine, bucket)
        engine.load_adapter(bucket)
        buckets, tensors = buckets + 1, tensors + len(bucket)
        del bucket  # before the export gathers the next one
    if not buckets:
        raise WeightSyncError("actor.export_adapter_weights yielded no adapters")
    engine.finish_adapter_sync(version)
    synchronize()
    return {"timing_s/adapter_stream": time.perf_counter() - start, "reshard/adapter_bytes": float(total),
            "reshard/adapter_tensors": float(tensors), "reshard/adapter_buckets": float(buckets)}


def _twice(names: list[str], seen: set[str]) -> str:
    """The first of a bucket's `names` sent before it (`seen`) or earlier in it."""
    again: set[str] = set()
    for name in names:
        if name in seen or name in again:
            return name
        again.add(name)
    raise AssertionError("no name was sent twice")


def _record(sent: SentChecksums, engine: RolloutEngine, bucket: list) -> None:
    """The sender's sums of what the engine will hold (engine.adapters_as_held: the whole bucket at once): a bucket's
    hundreds of small adapters in a few kernels where the engine compares within a tolerance (it sums in its own
    order anyway); one tensor at a time, tensor_checksum's kernels, for a bitwise engine (checksum_rtol 0: the torch
    engine)."""
    held = engine.adapters_as_held(bucket)
    if engine.checksum_rtol > 0:
        sent.record_many(held)
    else:
        sent.record_bucket(held)


def check_adapters(engine: RolloutEngine, sent: SentChecksums) -> dict[str, float]:
    """The sampled adapter tensors' engine sums against the sender's (same tolerance as the base's checks)."""
    checked = compare_checksums(sent, engine.adapter_checksums(sent.names()), rtol=engine.checksum_rtol)
    return {"sync_check/adapter_tensors_checked": checked["sync_check/tensors_checked"],
            "sync_check/adapter_max_rel_diff": checked["sync_check/max_rel_diff"]}
