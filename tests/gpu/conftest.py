"""Fixtures shared by the GPU tests.

`python -m pytest tests/gpu` runs every module in one process: each module must leave the process as it found it,
or a later one fails in its setup (test_vllm_hybrid did on 2026-11-27 after the megatron modules: their groups and
the cached device memory were still held, and vLLM sizes itself from the free memory it finds).
"""
from __future__ import annotations

import gc

import pytest

_config = None


def pytest_configure(config):
    global _config
    _config = config


def pytest_runtest_logreport(report):
    """A failure's traceback goes to the log the moment it happens: pytest prints them at the end, and a lease that
    cuts the suite at its deadline (2026-11-28: test_vllm_lora's 4 setup errors) kept only their names."""
    terminal = _config.pluginmanager.get_plugin("terminalreporter") if _config is not None else None
    if report.failed and terminal is not None:
        terminal.write_line(f"\n---- {report.nodeid} failed in its {report.when}:")
        terminal.write_line(report.longreprtext[-6000:])


@pytest.fixture(scope="module")
def layout():
    """One bf16 process (tp = pp = cp = dp = 1) with megatron's parallel state initialised."""
    from hybridrl.adapters.megatron import parallel
    from hybridrl.config.layout import ParallelLayout

    parallel.ensure_process_group(timeout_s=600)
    lay = ParallelLayout(world_size=1, tp=1, pp=1, cp=1, vpp=None, dp=1, sequence_parallel=False, dtype="bfloat16")
    parallel.init_megatron(lay, seed=1)
    return lay


@pytest.fixture(scope="module", autouse=True)
def module_leaves_the_process_clean():
    """After each module: megatron's and vLLM's parallel groups torn down (the default process group stays for the
    next module to reuse), and the device memory its tensors held given back to the driver."""
    yield
    import sys

    if "hybridrl.adapters.megatron.parallel" in sys.modules:
        from hybridrl.adapters.megatron import parallel

        if parallel._LAYOUT is not None:
            parallel.destroy_megatron()
    if "vllm.distributed.parallel_state" in sys.modules:
        from vllm.distributed import parallel_state as vllm_state

        vllm_state.destroy_model_parallel()
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
