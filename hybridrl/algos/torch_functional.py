"""Masked reductions and logit helpers shared by the RL math (verl's `torch_functional` semantics).

Shapes: `values` and `mask` broadcast together, typically [B, T] (batch, response tokens).
`mask` may be bool, int or float; positions where it is 0 are ignored, even if `values` holds
NaN or inf there (padding log-probs are often -inf).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

# verl adds this to denominators so an all-zero mask gives 0 instead of NaN.
MASK_EPS = 1e-8
# verl's whitening adds this to the variance before rsqrt.
WHITEN_EPS = 1e-8


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    """Sum of `values` where `mask` is set (NaN-safe at masked-out positions); [] or reduced `axis`."""
    mask = mask.to(values.dtype) if values.is_floating_point() else mask
    valid = torch.where(mask.bool(), values, torch.zeros_like(values))
    total = valid * mask
    return total.sum() if axis is None else total.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    """masked_sum / (number of set mask entries + 1e-8); [] or reduced `axis`."""
    count = mask.to(values.dtype).sum() if axis is None else mask.to(values.dtype).sum(dim=axis)
    return masked_sum(values, mask, axis) / (count + MASK_EPS)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all set positions ([] scalar); `unbiased` applies Bessel's n/(n-1) like verl.

    Raises ValueError when the mask selects 0 elements, or 1 element with `unbiased`.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.to(values.dtype).sum()
        if n == 0:
            raise ValueError("masked_var: the mask selects no element")
        if n == 1:
            raise ValueError(
                "masked_var: the mask selects a single element, so the unbiased variance is undefined "
                "(whitening needs at least 2 response tokens in the batch)"
            )
        variance = variance * (n / (n - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) with mean/unbiased var over set positions; same shape.

    `shift_mean=False` adds the mean back (scale only). Masked-out positions are transformed too
    (not zeroed), as in verl; callers multiply by the mask where they need zeros.
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """torch.clamp with tensor bounds (broadcast): max(min(x, tensor_max), tensor_min), verl's order."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Categorical entropy per position: [..., V] -> [...].

    Computed as logsumexp(z) - sum(softmax(z) * z), which stays finite for large logits. Builds
    [..., V] temporaries: for a large vocabulary use hybridrl.algos.entropy.entropy_from_logits_chunked.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label): logits [..., V], labels [...] (int64) -> [...].

    The caller applies any sampling temperature to `logits` first. Half/bfloat16 logits are
    upcast to float32 for the log-softmax (the result is float32).
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logp = F.log_softmax(logits, dim=-1)
    return logp.gather(dim=-1, index=labels.unsqueeze(-1).long()).squeeze(-1)
