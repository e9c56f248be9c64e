"""Per-token statistics of the full next-token distribution, computed in chunks, and the entropy bonus.

A [tokens, V] float32 temporary of a 150k vocabulary is 600 KB per token; a 16k-token micro-batch
would need ~10 GB per temporary. The functions here walk the flattened tokens `chunk_size` rows at a
time, so peak extra memory is a few [chunk_size, V] blocks whatever the batch. With autograd on,
each chunk is recomputed in the backward pass (activation checkpointing) instead of keeping its
softmax alive, which is what keeps the saving when entropy carries a gradient.

- entropy H = logsumexp(z) - sum softmax(z) * z
- sum of squared probabilities  sum_v pi_v^2 = exp(logsumexp(2z) - 2 logsumexp(z))  (verl's
  calculate_sum_pi_squared_from_logits; the optimal-token-baseline estimators read it)
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch.utils.checkpoint import checkpoint

from .agg import agg_loss

DEFAULT_CHUNK = 2048


def _entropy(z: torch.Tensor) -> torch.Tensor:
    z = z.float() if z.dtype in (torch.float16, torch.bfloat16) else z
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def _sum_pi_squared(z: torch.Tensor) -> torch.Tensor:
    z = z.float() if z.dtype in (torch.float16, torch.bfloat16) else z
    return torch.exp(torch.logsumexp(2.0 * z, dim=-1) - 2.0 * torch.logsumexp(z, dim=-1))


def _chunked(fn: Callable[[torch.Tensor], torch.Tensor], logits: torch.Tensor, chunk_size: int) -> torch.Tensor:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    flat = logits.reshape(-1, logits.shape[-1])  # [N, V]
    grad = torch.is_grad_enabled() and logits.requires_grad
    parts = [checkpoint(fn, c, use_reentrant=False) if grad else fn(c) for c in flat.split(chunk_size)]
    out = torch.cat(parts) if parts else flat.new_zeros(0)
    return out.reshape(logits.shape[:-1])


def entropy_from_logits_chunked(logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Entropy per position: logits [..., V] -> [...] (float32 for half inputs), chunk_size rows at a time."""
    return _chunked(_entropy, logits, chunk_size)


def sum_pi_squared_from_logits(logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK) -> torch.Tensor:
    """sum_v softmax(z)_v^2 per position: logits [..., V] -> [...], chunk_size rows at a time."""
    return _chunked(_sum_pi_squared, logits, chunk_size)


def calculate_sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """verl's name for sum_pi_squared_from_logits."""
    return sum_pi_squared_from_logits(logits)


def entropy_loss(
    token_entropy: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: Optional[float] = None,
    dp_size: int = 1,
    batch_num_tokens: Optional[float] = None,
    global_batch_size: Optional[float] = None,
) -> torch.Tensor:
    """Aggregate per-token entropy [B, T] -> scalar (the actor subtracts entropy_coeff * this).

    Takes entropies rather than logits so backends that compute them vocab-parallel can use it;
    the global-batch arguments mean what they mean in agg_loss.
    """
    return agg_loss(token_entropy, response_mask, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size,
                    loss_scale_factor)


def entropy_loss_from_logits(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """entropy_loss on entropies computed (chunked) from full logits [B, T, V] (verl's compute_entropy_loss)."""
    return entropy_loss(entropy_from_logits_chunked(logits), response_mask, loss_agg_mode)
