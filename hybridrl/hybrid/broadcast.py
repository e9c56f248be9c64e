"""Weight broadcast from the actor to rollout engines on their own GPUs (the split placement).

The colocated hybrid engine (weight_sync.py) copies weights inside each process. When the rollout has its own
processes (actor_rollout_ref.hybrid_engine=false), actor rank 0 broadcasts the full HF-named tensors to every
rollout rank over a group of its own: rank 0 is the actor's rank 0, ranks 1..R the rollout's. Neither side's
default process group can hold it (each side has its own world), so it is built from a TCPStore (gloo on CPU,
NCCL on GPU).

One sync, on the wire:
    for each bucket of actor.export_weights:  header (names, shapes, dtypes) + one flat buffer per dtype
    end:                                       header with the sender's float64 sums of what it sent
Receivers check their received tensors against the sender's sums (the transport) and, after loading, the
engine's checksums against the received tensors (the load), as the hybrid engine's checks do.
"""
from __future__ import annotations

import datetime
import json
import math
import time
from typing import Iterable, Iterator, Optional

import torch
import torch.distributed as dist

from .checks import SentChecksums, WeightSyncError

WeightBucket = list[tuple[str, torch.Tensor]]
_BUCKET, _END = "bucket", "end"


class BroadcastGroup:
    """Rank 0 sends, the other ranks receive; `device` is where the buffers live (NCCL: this GPU)."""

    def __init__(self, pg: dist.ProcessGroup, rank: int, world_size: int, device: torch.device,
                 store: Optional[dist.Store] = None) -> None:
        self.pg, self.rank, self.world_size, self.device = pg, rank, world_size, device
        self._store = store  # the master's store must outlive the group

    @classmethod
    def open(cls, addr: str, port: int, rank: int, world_size: int, device: torch.device,
             timeout_s: float = 600.0) -> "BroadcastGroup":
        """Join (rank 0: host) the group at addr:port; blocks until all `world_size` ranks have joined."""
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(addr, port, world_size, is_master=rank == 0, timeout=timeout)
        store = dist.PrefixStore("hybridrl_weights", store)
        if device.type == "cuda":
            pg = dist.ProcessGroupNCCL(store, rank, world_size)
        else:
            pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        group = cls(pg, rank, world_size, device, store)
        group._handshake()
        return group

    # ------------------------------------------------------------------ sender
    def send(self, buckets: Iterable[WeightBucket], check_fraction: float = 1.0, step: int = 0) -> dict[str, float]:
        """Broadcast every bucket, then the end message with the sums of the sampled tensors."""
        if self.rank != 0:
            raise RuntimeError(f"BroadcastGroup.send on rank {self.rank}: only rank 0 sends")
        start = time.perf_counter()
        sent = SentChecksums(step, check_fraction)  # sums stay on the device until the end: one host sync
        total = count = 0
        for bucket in buckets:
            self._send_bucket(bucket)
            sent.record_bucket(bucket)
            total += sum(t.numel() * t.element_size() for _, t in bucket)
            count += 1
            del bucket
        sums, scales = sent.values()
        self._send_header({"kind": _END, "sums": {n: (sums[n], scales[n]) for n in sums}, "buckets": count})
        return {"weight_broadcast/bytes": float(total), "weight_broadcast/buckets": float(count),
                "timing_s/weight_broadcast": time.perf_counter() - start}

    def _send_bucket(self, bucket: WeightBucket) -> None:
        entries = [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in bucket]
        self._send_header({"kind": _BUCKET, "entries": entries})
        for dtype in _dtype_order(entries):
            flat = torch.cat([t.detach().to(self.device).reshape(-1) for (_, t), e in zip(bucket, entries)
                              if e[2] == dtype])
            self._broadcast(flat)

    def _send_header(self, header: dict) -> None:
        # JSON, not pickle: a receiver never unpickles what arrives over the network
        data = torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8).to(self.device)
        self._broadcast(torch.tensor([data.numel()], dtype=torch.int64, device=self.device))
        self._broadcast(data)

    # ------------------------------------------------------------------ receiver
    def receive(self, check_fraction: float = 1.0, step: int = 0) -> Iterator[WeightBucket]:
        """The buckets rank 0 sends, as views of one received buffer per dtype; after the last one the
        received tensors are checked against the sender's sums (WeightSyncError names a mismatch).
        `check_fraction` and `step` must be the sender's: both sides then sum the same sampled tensors."""
        if self.rank == 0:
            raise RuntimeError("BroadcastGroup.receive on rank 0: rank 0 sends")
        arrived = SentChecksums(step, check_fraction)
        while True:
            header = self._receive_header()
            if header["kind"] == _END:
                _compare(header["sums"], arrived.values()[0], self.rank)
                return
            bucket = self._receive_bucket(header["entries"])
            arrived.record_bucket(bucket)
            yield bucket

    def _receive_bucket(self, entries: list) -> WeightBucket:
        out: dict[str, torch.Tensor] = {}
        for dtype in _dtype_order(entries):
            members = [e for e in entries if e[2] == dtype]
            numel = sum(math.prod(shape) for _, shape, _ in members)
            flat = torch.empty(numel, dtype=getattr(torch, dtype), device=self.device)
            self._broadcast(flat)
            offset = 0
            for name, shape, _ in members:
                n = math.prod(shape)
                out[name] = flat[offset:offset + n].view(tuple(shape))
                offset += n
        return [(name, out[name]) for name, _, _ in entries]

    def _receive_header(self) -> dict:
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._broadcast(size)
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self._broadcast(data)
        return json.loads(data.cpu().numpy().tobytes().decode())

    # ------------------------------------------------------------------ plumbing
    def _broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([t], opts).wait()

    def _handshake(self) -> None:
        """One tiny broadcast so that a wrong address or a missing rank fails at open, not at the first sync."""
        probe = torch.tensor([12345 if self.rank == 0 else 0], dtype=torch.int64, device=self.device)
        self._broadcast(probe)
        if int(probe.item()) != 12345:
            raise WeightSyncError(f"weight broadcast group: rank {self.rank} received {int(probe.item())} in the "
                                  "handshake instead of 12345")

    def close(self) -> None:
        shutdown = getattr(self.pg, "shutdown", None)
        if callable(shutdown):
            shutdown()


def _dtype_order(entries: list) -> list[str]:
    return list(dict.fromkeys(dtype for _, _, dtype in entries))


def _compare(sent: dict[str, tuple[float, float]], received: dict[str, float], rank: int) -> None:
    """`sent`: name -> (sum, sum of magnitudes) from the sender; `received`: name -> sum of what arrived."""
    for name, (total, scale) in sent.items():
        if name not in received:
            raise WeightSyncError(f"weight broadcast: rank {rank} never received {name!r}")
        got = received[name]
        if abs(got - total) > 1e-9 * max(scale, 1e-30):
            raise WeightSyncError(f"weight broadcast: rank {rank} received {name!r} with checksum {got!r}, the sender "
                                  f"sent {total!r}")
