"""torchrun driver for GPU hosts: the local backend with NCCL, an all-reduce through the group.

    python -m torch.distributed.run --nproc_per_node=NGPU --standalone run_local_gpu.py OUT_DIR
"""
from __future__ import annotations

import json
import os
import sys

from controller_workers import RowWorker

from hybridrl.controller import make_worker_group


def main() -> None:
    wg = make_worker_group("local", RowWorker, role="gpu", call_timeout_s=120, use_gpu=True)
    result = {"sums": wg.allreduce_sum(0.5), "placement": wg.placement()}
    wg.shutdown()
    with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(result, f, sort_keys=True)


if __name__ == "__main__":
    main()
