"""Optimal token baseline (OTB): a per-timestep baseline weighted by the path's score-function variance.

For a response, G_t is the reward-to-go (reverse cumulative sum of the masked token rewards) and
w_t = 1 - 2 pi_t + sum_v pi_v^2 approximates ||grad log pi(y_t)||^2 (pi_t = exp(old_log_probs), the
sampled token's probability; sum_v pi_v^2 from the actor's log-prob pass, `sum_pi_squared`). With
rollout-correction weights rho, w_t is scaled by rho_t^2. W_t = sum_{j<=t} w_j over response tokens.
Per group (same `index`) and timestep: B_t = sum_i G_{i,t} W_{i,t} / (sum_i W_{i,t} + epsilon), and
A_{i,t} = (G_{i,t} - B_t) * mask; returns = G. A group of one has no baseline (A = G). handle_zero_tail:
where a single longest response extends beyond the second longest, its baseline there is 0 (no other
response informs those steps).

- optimal_token_baseline: timestep = column of the padded response (masked-out columns add nothing).
- tir_optimal_token_baseline (multi-turn: tool observations are mask-0 spans inside a response):
  timestep = index among the row's OWN response tokens, so the k-th policy token of every response is
  compared with the k-th of the others whatever observations came before; rows without a response
  token are left out of their group and get 0.
"""

from __future__ import annotations

from typing import Optional

import torch

from .base import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageOutput, AdvantageParams, group_stats, needs

EPSILON = 1e-8
HANDLE_ZERO_TAIL = True


def _path_weights(inputs: AdvantageInputs, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(returns G, cumulative path weight W, mask), all float64 [B, T]."""
    mask = inputs.response_mask.double()
    returns = (inputs.token_level_rewards.double() * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    pi = torch.exp(inputs.require("old_log_probs", name).double())
    w = 1 - 2 * pi + inputs.require("sum_pi_squared", name).double()
    if inputs.rollout_is_weights is not None:
        w = w * inputs.rollout_is_weights.double() ** 2
    return returns, (w * mask).cumsum(dim=-1), mask


def _group_baselines(returns: torch.Tensor, w: torch.Tensor, mask: torch.Tensor, index,
                     keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-group baselines [B, T] (rows with keep=False, and groups of one, get 0)."""
    g = group_stats(torch.zeros(len(returns), dtype=torch.float64), index)
    keep = torch.ones(len(returns), dtype=torch.bool) if keep is None else keep
    baselines = torch.zeros_like(returns)
    lengths = mask.sum(dim=-1)
    for group in torch.unique(g.group_of_row[keep]).tolist():
        rows = torch.nonzero((g.group_of_row == group) & keep).flatten()
        if len(rows) < 2:
            continue
        num = (returns[rows] * w[rows] * mask[rows]).sum(dim=0)
        den = (w[rows] * mask[rows]).sum(dim=0) + EPSILON
        baselines[rows] = num / den
        if HANDLE_ZERO_TAIL:
            ordered = torch.sort(lengths[rows]).values
            longest = torch.nonzero(lengths[rows] == ordered[-1]).flatten()
            if len(longest) == 1 and ordered[-1] > ordered[-2]:
                baselines[rows[longest[0]], int(ordered[-2]):] = 0.0
    return baselines


@ADVANTAGE_ESTIMATORS.register("optimal_token_baseline")
@needs("index", "old_log_probs", "sum_pi_squared")
def optimal_token_baseline(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages [B, T] (zero off the mask), returns = reward-to-go [B, T]."""
    index = inputs.require("index", "optimal_token_baseline")
    returns, w, mask = _path_weights(inputs, "optimal_token_baseline")
    adv = (returns - _group_baselines(returns, w, mask, index)) * mask
    dtype = inputs.token_level_rewards.dtype
    return AdvantageOutput(adv.to(dtype), returns.to(dtype))


@ADVANTAGE_ESTIMATORS.register("tir_optimal_token_baseline")
@needs("index", "old_log_probs", "sum_pi_squared")
def tir_optimal_token_baseline(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """advantages [B, T] (zero off the mask), returns = reward-to-go [B, T]; timesteps count own tokens."""
    index = inputs.require("index", "tir_optimal_token_baseline")
    returns, w, mask = _path_weights(inputs, "tir_optimal_token_baseline")
    rows, cols = torch.nonzero(mask > 0, as_tuple=True)
    own = (mask.cumsum(dim=-1) - 1).long()[rows, cols]  # position among the row's response tokens
    lengths = mask.sum(dim=-1).long()
    width = int(lengths.max()) if len(lengths) else 0
    packed = [torch.zeros(len(mask), width, dtype=torch.float64) for _ in range(3)]
    for dense, full in zip(packed, (returns, w, mask)):
        dense[rows, own] = full[rows, cols]
    g_ret, g_w, g_mask = packed
    baselines = _group_baselines(g_ret, g_w, g_mask, index, keep=lengths > 0)
    adv = torch.zeros_like(returns)
    adv[rows, cols] = (g_ret - baselines)[rows, own]
    dtype = inputs.token_level_rewards.dtype
    return AdvantageOutput(adv.to(dtype), returns.to(dtype))
