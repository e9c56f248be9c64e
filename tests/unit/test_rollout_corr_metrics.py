"""Rollout-correction metrics as verl 0.9.1 reports them (rollout_corr_helper), against float64 math written here:
rows are every row of the batch (an empty row has log-ratio 0 and per-row means 0), sequence-level IS max/min come
from each row's summed log-ratio, its fractions count rows."""
import math
import statistics

import pytest
import torch

from hybridrl.algos import RolloutCorrection, rollout_correction

T64 = torch.float64
MASK = [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 1], [1, 1, 0, 0]]


def close(actual, expected, rtol=1e-9, atol=1e-12):
    assert math.isclose(float(actual), float(expected), rel_tol=rtol, abs_tol=atol), (actual, expected)


def data(seed, spread=0.6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(len(MASK), 4, generator=g, dtype=T64) * 2 - 0.1
    rollout = old + torch.randn(len(MASK), 4, generator=g, dtype=T64) * spread
    return old, rollout, torch.tensor(MASK, dtype=T64)


def rows(old, rollout):
    """Per row: the response tokens' (log pi, log pi_rollout) pairs."""
    return [[(o, r) for o, r, m in zip(orow, rrow, mrow) if m] for orow, rrow, mrow in zip(old.tolist(), rollout.tolist(), MASK)]


def mean(xs):
    return sum(xs) / len(xs)


def row_mean(xs):
    return sum(xs) / (len(xs) + 1e-8)  # verl's masked_mean: 0 for a row without tokens


def test_sequence_is_metrics_come_from_row_log_ratios_and_count_rows():
    old, rollout, mask = data(1)
    upper = 1.5
    m = rollout_correction(old, rollout, mask, RolloutCorrection(rollout_is="sequence", rollout_is_threshold=upper)).metrics
    sums = [sum(o - r for o, r in row) for row in rows(old, rollout)]
    close(m["rollout_corr/rollout_is_max"], math.exp(min(max(sums), 20.0)))
    close(m["rollout_corr/rollout_is_min"], math.exp(min(sums)))
    close(m["rollout_corr/rollout_is_ratio_fraction_high"], sum(s > math.log(upper) for s in sums) / len(sums))
    close(m["rollout_corr/rollout_is_ratio_fraction_low"], sum(s < math.log(1 / upper) for s in sums) / len(sums))
    applied = [min(math.exp(max(min(s, 20.0), -20.0)), upper) for s in sums]
    raw = [math.exp(max(min(s, 20.0), -20.0)) for s in sums]
    lengths = [len(row) for row in rows(old, rollout)]
    per_row = [w * n / (n + 1e-8) for w, n in zip(applied, lengths)]  # the row's mean applied weight
    raw_row = [w * n / (n + 1e-8) for w, n in zip(raw, lengths)]
    close(m["rollout_corr/rollout_is_seq_mean"], mean(per_row))
    close(m["rollout_corr/rollout_is_seq_std"], statistics.stdev(per_row))
    close(m["rollout_corr/rollout_is_seq_max"], max(per_row))
    close(m["rollout_corr/rollout_is_seq_min"], min(per_row))
    close(m["rollout_corr/rollout_is_seq_max_deviation"], max(abs(w - 1) for w in per_row))
    close(m["rollout_corr/rollout_is_seq_fraction_high"], sum(w > upper for w in raw_row) / len(raw_row))
    close(m["rollout_corr/rollout_is_seq_fraction_low"], sum(w < 1 / upper for w in raw_row) / len(raw_row))
    token_weights = [w for w, n in zip(applied, lengths) for _ in range(n)]
    close(m["rollout_corr/rollout_is_mean"], mean(token_weights))
    assert 0 < m["rollout_corr/rollout_is_ratio_fraction_high"] < 1, "the case must have rows on both sides"


def test_token_is_metrics():
    old, rollout, mask = data(2)
    upper, lower = 2.0, 0.5
    m = rollout_correction(old, rollout, mask, RolloutCorrection(rollout_is="token", rollout_is_threshold=upper)).metrics
    raw = [[math.exp(o - r) for o, r in row] for row in rows(old, rollout)]
    applied = [[min(w, upper) for w in row] for row in raw]
    flat, flat_raw = [w for row in applied for w in row], [w for row in raw for w in row]
    close(m["rollout_corr/rollout_is_max"], max(flat))
    close(m["rollout_corr/rollout_is_min"], min(flat))
    close(m["rollout_corr/rollout_is_ratio_fraction_high"], mean([w > upper for w in flat_raw]))
    close(m["rollout_corr/rollout_is_ratio_fraction_low"], mean([w < lower for w in flat_raw]))
    close(m["rollout_corr/rollout_is_std"], statistics.pstdev(flat), rtol=1e-7)
    normalized = [w / (mean(flat) + 1e-8) for w in flat]
    close(m["rollout_corr/rollout_is_eff_sample_size"], 1 / mean([x * x for x in normalized]))
    per_row = [row_mean(row) for row in applied]
    close(m["rollout_corr/rollout_is_seq_mean"], mean(per_row))
    close(m["rollout_corr/rollout_is_seq_min"], min(per_row))  # the empty row: 0
    close(m["rollout_corr/rollout_is_seq_fraction_high"], mean([row_mean(row) > upper for row in raw]))


def test_offpolicy_families():
    old, rollout, mask = data(3)
    m = rollout_correction(old, rollout, mask, RolloutCorrection()).metrics
    r = rows(old, rollout)
    lp = [row_mean([o for o, _ in row]) for row in r]
    rp = [row_mean([x for _, x in row]) for row in r]
    diff = [b - a for a, b in zip(lp, rp)]
    close(m["rollout_corr/training_ppl"], mean([math.exp(-x) for x in lp]))
    close(m["rollout_corr/training_log_ppl"], mean([-x for x in lp]))
    close(m["rollout_corr/rollout_ppl"], mean([math.exp(-x) for x in rp]))
    close(m["rollout_corr/rollout_log_ppl"], mean([-x for x in rp]))
    close(m["rollout_corr/log_ppl_diff"], mean(diff))
    close(m["rollout_corr/log_ppl_abs_diff"], mean([abs(d) for d in diff]))
    close(m["rollout_corr/log_ppl_diff_max"], max(diff))
    close(m["rollout_corr/log_ppl_diff_min"], min(diff))
    close(m["rollout_corr/ppl_ratio"], mean([math.exp(d) for d in diff]))
    tokens = [o - x for row in r for o, x in row]
    close(m["rollout_corr/kl"], mean([-t for t in tokens]))
    close(m["rollout_corr/k3_kl"], mean([math.exp(t) - t - 1 for t in tokens]))
    close(m["rollout_corr/chi2_seq"], mean([math.exp(2 * sum(o - x for o, x in row)) for row in r]) - 1)


@pytest.mark.parametrize("option,threshold", [("seq_sum_k2", 0.3), ("token_k1", "0.6_1.5")])
def test_rejection_option_metrics(option, threshold):
    old, rollout, mask = data(4)
    m = rollout_correction(old, rollout, mask, RolloutCorrection(rollout_rs=option, rollout_rs_threshold=threshold)).metrics
    p = f"rollout_corr/rollout_rs_{option}"
    r = rows(old, rollout)
    if option == "seq_sum_k2":
        per_row = [sum(0.5 * (o - x) ** 2 for o, x in row) for row in r if row]  # rows with a token
        close(m[f"{p}_max"], max(per_row))
        close(m[f"{p}_min"], min(per_row))
        close(m[f"{p}_fraction_high"], mean([s > threshold for s in per_row]))
        close(m[f"{p}_seq_std"], statistics.stdev(per_row))
        close(m[f"{p}_seq_masked_fraction"], mean([s > threshold for s in per_row]))
        assert f"{p}_seq_fraction_low" not in m
        # every row counts in the combined fraction, the empty one too (verl's convention)
        close(m["rollout_corr/rollout_rs_seq_masked_fraction"], sum(s > threshold for s in per_row) / len(MASK))
    else:
        low, up = math.log(0.6), math.log(1.5)
        k1 = [[-(o - x) for o, x in row] for row in r]
        flat = [v for row in k1 for v in row]
        close(m[f"{p}_max"], max(flat))
        close(m[f"{p}_fraction_low"], mean([v < low for v in flat]))
        close(m[f"{p}_fraction_high"], mean([v > up for v in flat]))
        clamped = [min(max(v, low), up) for v in flat]
        close(m[f"{p}_std"], statistics.pstdev(clamped), rtol=1e-7)
        per_row = [row_mean(row) for row in k1 if row]
        close(m[f"{p}_seq_mean"], mean(per_row))
        close(m[f"{p}_seq_fraction_low"], mean([v < low for v in per_row]))
        assert 0 < m[f"{p}_masked_fraction"] < 1
