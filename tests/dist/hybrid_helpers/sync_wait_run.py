"""Driver run by each of 2 torchrun ranks (gloo): one WeightSync whose rank 1 offloads or wakes its engine late.

    python -m torch.distributed.run --nproc_per_node=2 --standalone sync_wait_run.py OUT_DIR LATE_S offload|wake

Rank 1's actor.offload (or its engine's wake_up) sleeps LATE_S seconds (a slow host copy on one GPU). Each rank writes
OUT_DIR/rank<RANK>.json with its sync metrics; the test checks where rank 0's wait was counted.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from hybridrl.adapters.base import OffloadReport
from hybridrl.hybrid import SyncOptions, WeightSync
from hybridrl.hybrid.checks import tensor_checksum
from hybridrl.rollout.base import RolloutEngine
from tests.fixtures.actor_stubs import StubActor


class LateActor(StubActor):
    def __init__(self, late_s: float):
        self.late_s = late_s
        self.weights = {f"model.layers.{i}.w": torch.full((64,), float(i)) for i in range(4)}

    def export_weights(self, bucket_bytes, names=None):
        dist.barrier()  # collective, as megatron's export and the cross-GPU copy are: it waits for the peer
        yield [(n, t.clone()) for n, t in self.weights.items() if names is None or n in names]

    def offload(self, params, grads, optimizer):
        time.sleep(self.late_s)
        return OffloadReport()


class DictEngine(RolloutEngine):
    checksum_rtol = 0.0

    def __init__(self, wake_s: float = 0.0):
        self.held: dict[str, torch.Tensor] = {}
        self.wake_s = wake_s

    def wake_up(self, tags=None):
        time.sleep(self.wake_s)

    def generate(self, prompts, sampling):
        raise NotImplementedError

    def load_weights(self, weights):
        self.held.update((n, t.clone()) for n, t in weights)

    def weight_checksums(self, hf_names):
        return {n: float(tensor_checksum(self.held[n])) for n in hf_names}


def main() -> None:
    out, late, where = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    delay = late if rank == 1 else 0.0
    actor = LateActor(delay if where == "offload" else 0.0)
    sync = WeightSync(actor, DictEngine(delay if where == "wake" else 0.0), SyncOptions())
    with sync.rollout_phase(step=0) as metrics:
        pass
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(metrics, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
