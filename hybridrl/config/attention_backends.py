"""The names `override_transformer_config.attention_backend` takes, and what each one runs.

Config validates a user's value against them and the megatron adapter (adapters/megatron/attention.py)
dispatches on them: the list lives here, below both, so the two cannot disagree.
"""
from __future__ import annotations

from typing import Any

SDPA_BACKENDS = ("auto", "flash", "fused")  # torch's scaled_dot_product_attention
MEGATRON_BACKENDS = ("unfused", "local")  # megatron's DotProductAttention
BACKENDS = SDPA_BACKENDS + MEGATRON_BACKENDS


def backend_name(value: Any) -> str:
    """'auto' for None, the member name for megatron's AttnBackend enum, else the string itself."""
    if value is None:
        return "auto"
    return getattr(value, "name", value)
