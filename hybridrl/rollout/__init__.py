"""Rollout engines behind one interface (base.py): the built-in torch engine and the colocated vLLM engine.

Importing the package registers "torch" in ROLLOUT_ENGINES. "vllm" registers when a GPU worker imports
hybridrl.rollout.vllm_engine: that import also fixes vLLM's in-process mode, so it is not done here.
"""
from . import torch_engine  # noqa: F401  (registers "torch")
