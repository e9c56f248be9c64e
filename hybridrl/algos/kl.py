"""Per-token KL estimators between the policy and the reference (verl's `kl_penalty` kinds).

With d = logprob - ref_logprob (log pi(y_t) - log pi_ref(y_t) of the sampled token):
- kl / k1:          d                                 (unbiased, high variance, can be < 0)
- abs:              |d|
- mse / k2:         0.5 * d^2
- low_var_kl / k3:  exp(-d) + d - 1, computed with -d clamped to [-20, 20] and the result
                    clamped to [-10, 10] for stability (Schulman's k3; >= 0)
- NAME+ (k1+, k2+, k3+, kl+, abs+, mse+, low_var_kl+): straight-through, as verl 0.9 defines it:
  the VALUE of NAME with the GRADIENT of k2, i.e. k2 - sg(k2) + sg(NAME). k1 and k3 estimate the KL's
  value without bias but their expected gradients are not the KL's gradient; k2's is (for the KL loss).
- full: needs the whole vocabulary distribution, not the sampled tokens' log-probs: not supported
  (NotImplementedError, as verl).
Users add kinds with `@KL_PENALTIES.register("name")` on `fn(logprob, ref_logprob) -> [B, T]`.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..utils.registry import Registry
from .agg import agg_loss

KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# Selected by algorithm.kl_penalty (KL in reward) and actor_rollout_ref.actor.kl_loss_type (KL loss).
KL_PENALTIES = Registry("KL estimator")  # of KLFn
UNSUPPORTED = {"full": "kl_penalty='full' needs the full vocabulary distributions of policy and reference, and only "
                       "the sampled tokens' log-probs reach the loss; use k1/kl, abs, k2/mse, k3/low_var_kl or a "
                       "straight-through variant such as k3+"}

_K3_LOG_RATIO_CLAMP = 20.0
_K3_VALUE_CLAMP = 10.0


def _k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return logprob - ref_logprob


def _abs(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return (logprob - ref_logprob).abs()


def _k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprob - ref_logprob).square()


def _k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    log_ratio = torch.clamp(ref_logprob - logprob, min=-_K3_LOG_RATIO_CLAMP, max=_K3_LOG_RATIO_CLAMP)
    k3 = torch.exp(log_ratio) - log_ratio - 1
    return torch.clamp(k3, min=-_K3_VALUE_CLAMP, max=_K3_VALUE_CLAMP)


def straight_through(value_fn: KLFn) -> KLFn:
    """The value of `value_fn` with the gradient of k2."""

    def estimator(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        k2 = _k2(logprob, ref_logprob)
        return k2 - k2.detach() + value_fn(logprob, ref_logprob).detach()

    return estimator


for _names, _fn in ((("kl", "k1"), _k1), (("abs",), _abs), (("mse", "k2"), _k2), (("low_var_kl", "k3"), _k3)):
    _plus = straight_through(_fn)
    for _name in _names:
        KL_PENALTIES.register(_name)(_fn)
        KL_PENALTIES.register(_name + "+")(_plus)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of the named kind: logprob, ref_logprob [B, T] -> [B, T] (unmasked)."""
    if kind in UNSUPPORTED:
        raise NotImplementedError(UNSUPPORTED[kind])
    return KL_PENALTIES.get(kind)(logprob, ref_logprob)


def kl_loss(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    kind: str,
    loss_agg_mode: str,
    loss_scale_factor: Optional[float] = None,
    dp_size: int = 1,
    batch_num_tokens: Optional[float] = None,
    global_batch_size: Optional[float] = None,
) -> torch.Tensor:
    """The actor's KL loss term (use_kl_loss): kl_penalty aggregated with `loss_agg_mode` -> scalar."""
    return agg_loss(kl_penalty(logprob, ref_logprob, kind), response_mask, loss_agg_mode, dp_size,
                    batch_num_tokens, global_batch_size, loss_scale_factor)
