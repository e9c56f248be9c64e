"""Shared pytest setup: the repo root on sys.path, offline hub access, deterministic threads."""
import logging
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
# With PYTHONDONTWRITEBYTECODE set (as on this project's machines) and a venv that uv installed without
# bytecode, every process the tests start (torchrun ranks, Ray workers, Ray's own services) compiled
# transformers, megatron-core and ray from source again: about a quarter of the CPU of a trainer launch. The
# first import of a module writes its .pyc (git ignores them); later processes load it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def _hybridrl_logger_restored():
    """An in-process run (run_ppo, main_eval) calls logs.setup(), which stops the "hybridrl" logger from
    propagating; caplog listens on the root logger, so later tests would see none of its records."""
    logger = logging.getLogger("hybridrl")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers, logger.level, logger.propagate = saved
