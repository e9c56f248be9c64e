"""Fixtures shared by the one-GPU megatron tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def layout():
    """One bf16 process (tp = pp = cp = dp = 1) with megatron's parallel state initialised."""
    from hybridrl.adapters.megatron import parallel
    from hybridrl.config.validate import ParallelLayout

    parallel.ensure_process_group(timeout_s=600)
    lay = ParallelLayout(world_size=1, tp=1, pp=1, cp=1, vpp=None, dp=1, sequence_parallel=False, dtype="bfloat16")
    parallel.init_megatron(lay, seed=1)
    return lay
