"""Several one-rank megatron drivers in one torchrun process, one after the other, each as it would run alone.

    python -m torch.distributed.run --standalone --nproc_per_node=1 one_rank_run.py \
        overlap_run --models DIR --out DIR --next master_init_run --models DIR --out DIR --next knobs_run ...

Each driver's main() gets its own arguments (sys.argv). Between two drivers megatron's groups are torn down
(parallel.destroy_megatron: the next driver's init_megatron builds them and seeds every RNG again) and
builder.model_dtype is put back (overlap_run and master_init_run train bf16 params, knobs_run float32). A driver that
leaves the process group (knobs_run's finish) must come last. On 2 cores a launch's start-up (torchrun, torch,
transformers and megatron-core imports) costs about as much as one of these drivers' checks.
"""
from __future__ import annotations

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import torch.distributed as dist  # noqa: E402

from hybridrl.adapters.megatron import builder, parallel  # noqa: E402


def main() -> None:
    runs: list[list[str]] = [[]]
    for a in sys.argv[1:]:
        if a == "--next":
            runs.append([])
        else:
            runs[-1].append(a)
    for i, (name, *argv) in enumerate(runs):
        if i and not dist.is_initialized():
            raise SystemExit(f"one_rank_run: the driver before {name} left the process group; put it last")
        model_dtype = builder.model_dtype
        sys.argv = [f"{name}.py", *argv]
        importlib.import_module(name).main()
        builder.model_dtype = model_dtype
        parallel.destroy_megatron()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
