"""The rollout-correction metrics as verl 0.9.1 reports them (rollout_corr_helper: compute_is_metrics,
compute_rs_metrics, compute_offpolicy_metrics), without the rollout_corr/ prefix.

Conventions (verl's): "rows" are every row of the batch; per-row means use masked_mean (0 for a row without
response tokens); a row's log-ratio is the sum of log r = log pi - log pi_rollout over its response tokens.
- IS, token level: mean/max/min of the applied (truncated or masked) weights over response tokens; the
  fractions high/low count raw token weights above U / below L (L = 1/U without IcePop) over tokens.
- IS, sequence level: max/min are exp of the largest/smallest row log-ratio (the max's exponent capped at 20)
  and the fractions count ROWS whose log-ratio is above log U / below log L.
- both levels: std and effective sample size of the weights clamped to [0, U]; rollout_is_seq_{mean,std,max,
  min,max_deviation} over the per-row mean applied weight; seq_fraction_high/low over rows whose mean RAW weight
  is above U / below L.
- RS, per option: the statistic's token mean, its max/min (sequence options: over rows with a token), the
  fractions beyond the bounds (rows for sequence options), std, and seq_* over the rows with a token.
- off-policy: training_ppl / rollout_ppl (and their log_ppl) as batch means of per-row perplexities,
  log_ppl_diff (mean, abs, max, min over rows), ppl_ratio = mean of exp(log_ppl_diff), kl, k3_kl, chi2.
Which keys appear depends on the settings only (rollout_corr.metric_names), never on the data.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .torch_functional import masked_mean, masked_sum

SAFETY_BOUND = 20.0
OFFPOLICY = ("training_ppl", "training_log_ppl", "kl", "k3_kl", "rollout_ppl", "rollout_log_ppl", "log_ppl_diff",
             "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq")
IS_METRICS = ("mean", "max", "min", "ratio_fraction_high", "ratio_fraction_low", "std", "eff_sample_size",
              "seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high",
              "seq_fraction_low")
RS_OPTION_METRICS = ("mean", "max", "min", "fraction_high", "fraction_low", "std", "seq_mean", "seq_std", "seq_max",
                     "seq_min", "seq_max_deviation", "seq_fraction_high", "masked_fraction", "seq_masked_fraction")
RS_K1_METRICS = ("seq_fraction_low",)  # only options with a lower bound (k1) report it


def _item(x: torch.Tensor) -> float:
    return float(x)


def _std(values: torch.Tensor) -> float:
    """torch's unbiased std of a 1-D tensor, 0 for fewer than two values."""
    return float(values.std()) if values.numel() > 1 else 0.0


def is_metrics(weights: torch.Tensor, raw: torch.Tensor, row_log_ratio: Optional[torch.Tensor], mask: torch.Tensor,
               upper: float, lower: Optional[float]) -> dict[str, float]:
    """`weights`: applied IS weights [B, T]; `raw`: before truncation/masking [B, T] (0 off the mask);
    `row_log_ratio`: [B] summed log-ratio per row for sequence-level IS, None for token level."""
    low = 1.0 / upper if lower is None else lower
    valid = mask != 0
    out: dict[str, float] = {"mean": _item(masked_mean(weights, mask))}
    if row_log_ratio is not None:
        out["max"] = math.exp(min(float(row_log_ratio.max()), SAFETY_BOUND))
        out["min"] = math.exp(float(row_log_ratio.min()))
        out["ratio_fraction_high"] = float((row_log_ratio > math.log(upper)).double().mean())
        out["ratio_fraction_low"] = float((row_log_ratio < math.log(low)).double().mean())
    else:
        w = weights[valid]
        out["max"] = float(w.max()) if w.numel() else 0.0
        out["min"] = float(w.min()) if w.numel() else 0.0
        out["ratio_fraction_high"] = _item(masked_mean((raw > upper).to(weights.dtype), mask))
        out["ratio_fraction_low"] = _item(masked_mean((raw < low).to(weights.dtype), mask))
    clamped = weights.clamp(0.0, upper)
    mean_clamped = masked_mean(clamped, mask)
    var = masked_mean(clamped.square(), mask) - mean_clamped.square()
    out["std"] = math.sqrt(max(float(var), 0.0)) if int(valid.sum()) > 1 else 0.0
    out["eff_sample_size"] = 1.0 / float(masked_mean((clamped / (mean_clamped + 1e-8)).square(), mask))
    per_row = masked_mean(weights, mask, axis=-1)  # [B]
    raw_per_row = masked_mean(raw, mask, axis=-1)
    out.update(seq_mean=float(per_row.mean()), seq_std=_std(per_row), seq_max=float(per_row.max()),
               seq_min=float(per_row.min()), seq_max_deviation=float((per_row - 1.0).abs().max()),
               seq_fraction_high=float((raw_per_row > upper).double().mean()),
               seq_fraction_low=float((raw_per_row < low).double().mean()))
    return out


def rs_metrics(stat: torch.Tensor, row_stat: Optional[torch.Tensor], mask: torch.Tensor, upper: float,
               lower: Optional[float]) -> dict[str, float]:
    """One rejection option's statistics. `stat` [B, T] per token (a sequence option's row value on every token),
    `row_stat` [B] for sequence options (None: token option); bounds as the statistic is compared (k1: logs)."""
    valid = mask != 0
    rows = valid.any(-1)
    per_row = row_stat if row_stat is not None else masked_mean(stat, mask, axis=-1)
    per_row = per_row[rows]
    floor = lower if lower is not None else 0.0
    out: dict[str, float] = {"mean": _item(masked_mean(stat, mask))}
    if row_stat is not None and per_row.numel():
        out["max"], out["min"] = float(per_row.max()), float(per_row.min())
        out["fraction_high"] = float((per_row > upper).double().mean())
        out["fraction_low"] = float((per_row < lower).double().mean()) if lower is not None else 0.0
    else:
        s = stat[valid]
        out["max"], out["min"] = (float(s.max()), float(s.min())) if s.numel() else (0.0, 0.0)
        out["fraction_high"] = _item(masked_mean((stat > upper).to(stat.dtype), mask))
        out["fraction_low"] = _item(masked_mean((stat < lower).to(stat.dtype), mask)) if lower is not None else 0.0
    clamped = stat.clamp(floor, upper)
    var = masked_mean(clamped.square(), mask) - masked_mean(clamped, mask).square()
    out["std"] = math.sqrt(max(float(var), 0.0)) if int(valid.sum()) > 1 else 0.0
    some = per_row.numel() > 0
    out.update(seq_mean=float(per_row.mean()) if some else 0.0, seq_std=_std(per_row),
               seq_max=float(per_row.max()) if some else 0.0, seq_min=float(per_row.min()) if some else 0.0,
               seq_max_deviation=float(per_row.abs().max()) if some else 0.0,
               seq_fraction_high=float((per_row > upper).double().mean()) if some else 0.0)
    if lower is not None:
        out["seq_fraction_low"] = float((per_row < lower).double().mean()) if some else 0.0
    return out


def offpolicy_metrics(log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far pi (log_prob) is from pi_rollout: perplexities per row, KL(rollout || pi) by k1 and k3, chi-square
    divergence E[rho^2] - 1 per token and per row."""
    mean_lp = masked_mean(log_prob, mask, axis=-1)  # [B]
    mean_rollout = masked_mean(rollout_log_prob, mask, axis=-1)
    lr = log_prob - rollout_log_prob
    diff = mean_rollout - mean_lp  # log(training_ppl / rollout_ppl) per row
    row_lr = masked_sum(lr, mask, axis=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": float(torch.exp(-mean_lp).mean()),
        "training_log_ppl": float((-mean_lp).mean()),
        "kl": _item(masked_mean(-lr, mask)),
        "k3_kl": _item(masked_mean(torch.exp(lr) - lr - 1, mask)),
        "rollout_ppl": float(torch.exp(-mean_rollout).mean()),
        "rollout_log_ppl": float((-mean_rollout).mean()),
        "log_ppl_diff": float(diff.mean()),
        "log_ppl_abs_diff": float(diff.abs().mean()),
        "log_ppl_diff_max": float(diff.max()),
        "log_ppl_diff_min": float(diff.min()),
        "ppl_ratio": float(torch.exp(diff).mean()),
        "chi2_token": _item(masked_mean(torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)).square(), mask)) - 1.0,
        "chi2_seq": float(torch.exp(2.0 * row_lr).mean()) - 1.0,
    }
