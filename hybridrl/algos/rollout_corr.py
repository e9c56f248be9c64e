"""Rollout correction (verl 0.9's algorithm.rollout_correction): the rollout engine's token
probabilities pi_rollout differ from the trainer's pi_old (precision, kernels, stale weights), so
PPO's samples are slightly off-policy. With log r = log pi_old - log pi_rollout per response token:

- importance sampling (rollout_is): weights [B, T] that multiply the policy loss, detached.
  token:    w_t = exp(log r_t)                 sequence: w_i = exp(sum_t log r_t) on every token of row i
  (exponents clamped to [-20, 20]). rollout_is_threshold "U" (a number) truncates: min(w, U) (TIS);
  "L_U" zeroes weights outside [L, U] (IcePop, masked IS). rollout_is_batch_normalize divides by the
  batch mean weight (token: over valid tokens; sequence: over rows with a valid token).
- rejection sampling (rollout_rs, comma-separated options, all must pass): tokens or whole sequences
  whose divergence is out of bounds leave response_mask. Per token k1 = -log r, k2 = (log r)^2 / 2,
  k3 = exp(log r) - 1 - log r (log r clamped to [-20, 20]). token_k{1,2,3}; seq_sum_k{1,2,3},
  seq_mean_k{1,2,3} (sum / mean over the row's valid tokens); seq_max_k{2,3}. k1 options keep
  log(L) <= k1 <= log(U) for "L_U" (a single U means L = 1/U), i.e. bounds on pi_rollout / pi_old; k2/k3
  options keep the statistic <= U. rollout_rs_threshold: one spec for all options or one per option.
- bypass_mode: pi_old := pi_rollout (no old-log-prob pass); the policy loss `bypass_mode` then corrects
  between pi_theta and pi_rollout itself with loss_type ppo_clip (the PPO ratio does it) or reinforce
  (explicit IS weights).

Metrics (prefix rollout_corr/): verl 0.9.1's families (rollout_corr_metrics.py): the off-policy ones
(training_ppl, training_log_ppl, ppl_ratio, kl, chi2, ...) always; rollout_is_* (incl. rollout_is_seq_*) with IS
(+ oob_ratio with IcePop, batch_norm_factor with batch normalization); rollout_rs_masked_fraction,
rollout_rs_seq_masked_fraction and per option rollout_rs_OPT_* with RS. Which keys appear depends on the
settings only (`metric_names`), never on the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Optional, Union

import torch

from .rollout_corr_metrics import (
    IS_METRICS,
    OFFPOLICY,
    RS_K1_METRICS,
    RS_OPTION_METRICS,
    SAFETY_BOUND,
    offpolicy_metrics,
    rs_metrics,
)
from .rollout_corr_metrics import is_metrics as _is_metrics
from .torch_functional import masked_mean, masked_sum

IS_LEVELS = ("token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
LOSS_TYPES = ("ppo_clip", "reinforce")
Threshold = Union[str, float]


@dataclass(frozen=True)
class RolloutCorrection:
    """verl's RolloutCorrectionConfig (defaults as verl's yaml: everything off)."""

    rollout_is: Optional[str] = None
    rollout_is_threshold: Threshold = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: Optional[str] = None
    rollout_rs_threshold: Optional[Threshold] = None
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"

    @classmethod
    def from_config(cls, cfg: Any) -> "RolloutCorrection":
        """From any object with these attribute names (the config section)."""
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})

    @property
    def enabled(self) -> bool:
        return self.rollout_is is not None or self.rollout_rs is not None or self.bypass_mode

    def get(self, key: str, default: Any = None) -> Any:  # verl losses read their config with .get
        return getattr(self, key, default)

    def problems(self) -> list[str]:
        """What is wrong with these settings (messages name the algorithm.rollout_correction key)."""
        out = []
        key = "algorithm.rollout_correction"
        if self.rollout_is is not None and self.rollout_is not in IS_LEVELS:
            out.append(f"{key}.rollout_is={self.rollout_is!r} is not one of token, sequence (or null: off)")
        if self.rollout_is is not None:
            try:
                parse_is_threshold(self.rollout_is_threshold)
            except ValueError as e:
                out.append(f"{key}.rollout_is_threshold: {e}")
        if self.rollout_rs is not None:
            try:
                parse_rs(self.rollout_rs, self.rollout_rs_threshold)
            except ValueError as e:
                out.append(f"{key}.rollout_rs / rollout_rs_threshold: {e}")
        if self.loss_type not in LOSS_TYPES:
            out.append(f"{key}.loss_type={self.loss_type!r} is not one of {', '.join(LOSS_TYPES)}")
        return out


class Correction(NamedTuple):
    weights: Optional[torch.Tensor]  # [B, T] detached IS weights, None without rollout_is
    response_mask: torch.Tensor  # [B, T] the mask after rejection sampling
    metrics: dict[str, float]  # rollout_corr/* (keys: metric_names(spec))


# ------------------------------------------------------------------------------------------ thresholds
def parse_is_threshold(spec: Threshold) -> tuple[float, Optional[float]]:
    """(upper, lower or None) of "U" / U (truncate) or "L_U" (IcePop)."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"expects a number or a 'lower_upper' string, got {spec!r}")
    lower = None
    text = str(spec).strip()
    try:
        if "_" in text:
            low, up = text.split("_", 1)
            lower, upper = float(low), float(up)
        else:
            upper = float(text)
    except ValueError:
        raise ValueError(f"{spec!r} is not a number or 'lower_upper' (e.g. 2.0 or '0.5_5.0')") from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"{spec!r}: bounds must be positive with lower <= upper")
    return upper, lower


def parse_rs(options: str, spec: Optional[Threshold]) -> list[tuple[str, Optional[float], float]]:
    """[(option, lower or None, upper)] of comma-separated options and their threshold spec(s)."""
    names = list(dict.fromkeys(o.strip() for o in str(options).split(",") if o.strip()))
    bad = [n for n in names if n not in RS_OPTIONS]
    if not names or bad:
        raise ValueError(f"rollout_rs={options!r}: options must be among {', '.join(RS_OPTIONS)}")
    if spec is None:
        raise ValueError("rollout_rs needs rollout_rs_threshold")
    specs = [s.strip() for s in str(spec).split(",") if s.strip()] if isinstance(spec, str) else [str(spec)]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"rollout_rs_threshold {spec!r}: give one threshold for all options or one per option "
                         f"({len(names)})")
    specs = specs * len(names) if len(specs) == 1 else specs
    out = []
    for name, s in zip(names, specs):
        try:
            if name.endswith("k1"):
                low_text, up_text = s.split("_", 1) if "_" in s else (None, s)
                upper = float(up_text)
                lower = float(low_text) if low_text is not None else 1.0 / upper
                if not 0 < lower <= upper:
                    raise ValueError
            else:
                if "_" in s:
                    raise ValueError
                lower, upper = None, float(s)
                if upper <= 0:
                    raise ValueError
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"threshold {s!r} for {name}: k1 options take 'lower_upper' or one positive upper "
                             "ratio; k2/k3 options one positive upper bound") from None
        out.append((name, lower, upper))
    return out


# ------------------------------------------------------------------------------------------ pieces
def is_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold: Threshold,
               batch_normalize: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights [B, T] (detached, 0 off the mask) and their rollout_is_* metrics."""
    upper, lower = parse_is_threshold(threshold)
    m = mask.to(log_ratio.dtype)
    row_log_ratio = None
    if level == "token":
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * m
    elif level == "sequence":
        row_log_ratio = masked_sum(log_ratio, mask, axis=-1)  # [B]
        raw = torch.exp(row_log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).unsqueeze(-1) * m
    else:
        raise ValueError(f"rollout_is={level!r} is not one of {', '.join(IS_LEVELS)}")
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    weights = weights.detach()
    metrics = {f"rollout_is_{k}": v for k, v in _is_metrics(weights, raw, row_log_ratio, mask, upper, lower).items()}
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = _mean(((raw < lower) | (raw > upper)).to(m.dtype), mask)
    if batch_normalize:
        per_row = masked_mean(weights, mask, axis=-1)
        nonempty = (mask != 0).any(-1).to(m.dtype)
        mean = masked_mean(weights, mask) if level == "token" else (per_row * nonempty).sum() / nonempty.sum().clamp(min=1)
        factor = float(mean) if float(mean) > 1e-8 else 1.0
        weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor
    return weights, metrics


def _mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(masked_mean(values, mask))


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, options: str,
                   threshold: Optional[Threshold]) -> tuple[torch.Tensor, dict[str, float]]:
    """(response_mask with rejected tokens/sequences set to 0, rollout_rs_* metrics)."""
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}
    valid = mask != 0
    nonempty = valid.any(-1)
    keep_all = torch.ones_like(valid)
    metrics: dict[str, float] = {}
    for name, lower, upper in parse_rs(options, threshold):
        stat = per_token[name[-2:]]
        row_stat = None
        if name.startswith("seq_sum"):
            row_stat = masked_sum(stat, mask, axis=-1)
        elif name.startswith("seq_mean"):
            row_stat = masked_mean(stat, mask, axis=-1)
        elif name.startswith("seq_max"):
            top = stat.masked_fill(~valid, float("-inf")).max(dim=-1).values
            row_stat = torch.where(nonempty, top, torch.zeros_like(top))
        if row_stat is not None:
            stat = row_stat.unsqueeze(-1).expand_as(stat)
        low, up = (None, upper) if lower is None else (math.log(lower), math.log(upper))  # k1: log bounds
        keep = stat <= up if low is None else (stat >= low) & (stat <= up)
        keep_all &= keep
        prefix = f"rollout_rs_{name}"
        metrics.update({f"{prefix}_{k}": v for k, v in rs_metrics(stat, row_stat, mask, up, low).items()})
        metrics[f"{prefix}_masked_fraction"] = _mean((~keep).to(lr.dtype), mask)
        metrics[f"{prefix}_seq_masked_fraction"] = float((~keep & valid).any(-1)[nonempty].double().mean()) \
            if nonempty.any() else 0.0
    metrics["rollout_rs_masked_fraction"] = _mean((~keep_all).to(lr.dtype), mask)
    metrics["rollout_rs_seq_masked_fraction"] = float((~keep_all & valid).any(-1).double().mean())  # over all rows
    return (mask * keep_all.to(mask.dtype)).to(mask.dtype), metrics


# ------------------------------------------------------------------------------------------ entry
@torch.no_grad()
def rollout_correction(log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                       spec: RolloutCorrection) -> Correction:
    """IS weights, rejection mask and metrics between pi (log_prob: pi_old, or pi_theta in bypass mode) and
    pi_rollout; all [B, T]."""
    if log_prob.shape != rollout_log_prob.shape or log_prob.shape != response_mask.shape:
        raise ValueError(f"rollout correction: log_prob {tuple(log_prob.shape)}, rollout_log_prob "
                         f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(response_mask.shape)} must match")
    log_ratio = log_prob.detach() - rollout_log_prob
    metrics = offpolicy_metrics(log_prob.detach(), rollout_log_prob, response_mask)
    weights = None
    if spec.rollout_is is not None:
        weights, m = is_weights(log_ratio, response_mask, spec.rollout_is, spec.rollout_is_threshold,
                                spec.rollout_is_batch_normalize)
        metrics.update(m)
    mask = response_mask
    if spec.rollout_rs is not None:
        mask, m = rejection_mask(log_ratio, response_mask, spec.rollout_rs, spec.rollout_rs_threshold)
        metrics.update(m)
    return Correction(weights, mask, {f"rollout_corr/{k}": v for k, v in metrics.items()})


def metric_names(spec: RolloutCorrection) -> list[str]:
    """The keys `rollout_correction` returns for these settings."""
    names = list(OFFPOLICY)
    if spec.rollout_is is not None:
        names += [f"rollout_is_{m}" for m in IS_METRICS]
        if parse_is_threshold(spec.rollout_is_threshold)[1] is not None:
            names.append("rollout_is_oob_ratio")
        if spec.rollout_is_batch_normalize:
            names.append("rollout_is_batch_norm_factor")
    if spec.rollout_rs is not None:
        for name, _, _ in parse_rs(spec.rollout_rs, spec.rollout_rs_threshold):
            names += [f"rollout_rs_{name}_{m}" for m in RS_OPTION_METRICS + (RS_K1_METRICS if name.endswith("k1") else ())]
        names += ["rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction"]
    return [f"rollout_corr/{n}" for n in names]
