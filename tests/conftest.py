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


@pytest.fixture(autouse=True)
def _hybridrl_logger_restored():
    """An in-process run (run_ppo, main_eval) calls logs.setup(), which stops the "hybridrl" logger from
    propagating; caplog listens on the root logger, so later tests would see none of its records."""
    logger = logging.getLogger("hybridrl")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers, logger.level, logger.propagate = saved
