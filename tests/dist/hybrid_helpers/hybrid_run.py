"""test_cross_copy.py's and test_hybrid_reshard.py's drivers in one torchrun launch of 4 ranks (gloo): each rank
starts (torch, transformers, megatron-core) once for both.

    python -m torch.distributed.run --nproc_per_node=4 --standalone hybrid_run.py CROSS_OUT CROSS_HF_DIR \
        RESHARD_OUT RESHARD_HF_DIR...

cross_run.run, then reshard_run.run (which sets a small export gather size for its own layouts and puts the default
back), in the same process group; each builds and tears down its layouts' megatron groups as it would alone and
writes its own OUT/rank<RANK>.json.
"""
from __future__ import annotations

import sys

import cross_run
import reshard_run
import torch
import torch.distributed as dist


def main() -> None:
    from hybridrl.adapters.megatron.parallel import ensure_process_group

    torch.set_num_threads(1)
    ensure_process_group(timeout_s=120)
    cross_out, cross_hf, reshard_out, *reshard_hfs = sys.argv[1:]
    cross_run.run(cross_out, cross_hf)
    reshard_run.run(reshard_out, reshard_hfs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
