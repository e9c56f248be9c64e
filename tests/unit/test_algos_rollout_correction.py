"""Rollout correction (verl 0.9's algorithm.rollout_correction) and the bypass_mode loss vs float64 references.

log r = log pi_old - log pi_rollout per token; the references below loop over rows and tokens.
"""

import math

import pytest
import torch

from hybridrl.algos import POLICY_LOSSES, PolicyLossOptions, PolicyLossParams, RolloutCorrection, rollout_correction
from hybridrl.algos import rollout_corr as rc_mod

T64 = torch.float64
MASK = [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 1], [1, 0, 0, 0]]  # a hole, an empty row
T = 4


def close(actual, expected, rtol=1e-6, atol=1e-9):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=T64), torch.as_tensor(expected, dtype=T64), rtol=rtol, atol=atol
    )


def logprobs(seed, spread=0.5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(len(MASK), T, generator=g, dtype=T64) * 2 - 0.1
    rollout = old + torch.randn(len(MASK), T, generator=g, dtype=T64) * spread
    return old, rollout, torch.tensor(MASK, dtype=T64)


def log_ratio(old, rollout):
    return [[o - r for o, r in zip(orow, rrow)] for orow, rrow in zip(old.tolist(), rollout.tolist())]


def masked_mean_ref(x, mask=MASK):
    vals = [v for row, m in zip(x, mask) for v, k in zip(row, m) if k]
    return sum(vals) / len(vals)


# ============================================================== importance weights
@pytest.mark.parametrize("threshold", [2.0, "1.5", "0.8_1.6"])
def test_token_is_weights_truncated_or_masked(threshold):
    old, rollout, mask = logprobs(1)
    out = rollout_correction(old, rollout, mask, RolloutCorrection(rollout_is="token", rollout_is_threshold=threshold))
    lower, upper = (0.8, 1.6) if threshold == "0.8_1.6" else (None, float(threshold))
    exp = []
    for lr_row, m_row in zip(log_ratio(old, rollout), MASK):
        row = []
        for lr, m in zip(lr_row, m_row):
            w = math.exp(lr) * m
            row.append(min(w, upper) if lower is None else (w if lower <= w <= upper else 0.0))
        exp.append(row)
    close(out.weights, exp)
    assert not out.weights.requires_grad
    assert torch.equal(out.response_mask, mask)  # IS alone rejects nothing
    if lower is None:
        assert (out.weights == upper).any()  # truncation happened
    else:
        raw = [[math.exp(lr) for lr in row] for row in log_ratio(old, rollout)]
        oob = [[float(not (lower <= w <= upper)) for w in row] for row in raw]
        close(out.metrics["rollout_corr/rollout_is_oob_ratio"], masked_mean_ref(oob))
        assert 0 < out.metrics["rollout_corr/rollout_is_oob_ratio"] < 1


def test_sequence_is_weights_and_batch_normalization():
    old, rollout, mask = logprobs(2, spread=0.3)
    spec = RolloutCorrection(rollout_is="sequence", rollout_is_threshold=3.0)
    out = rollout_correction(old, rollout, mask, spec)
    seq = [min(math.exp(sum(lr * m for lr, m in zip(row, mrow))), 3.0)
           for row, mrow in zip(log_ratio(old, rollout), MASK)]
    exp = [[seq[i] * m for m in MASK[i]] for i in range(len(MASK))]
    close(out.weights, exp)
    # batch normalization: divide by the mean over rows that have a response token
    normed = rollout_correction(old, rollout, mask, RolloutCorrection(rollout_is="sequence", rollout_is_threshold=3.0,
                                                                      rollout_is_batch_normalize=True))
    mean = sum(seq[i] for i in range(len(MASK)) if any(MASK[i])) / sum(1 for r in MASK if any(r))
    close(normed.weights, [[w / mean for w in row] for row in exp])
    close(normed.metrics["rollout_corr/rollout_is_batch_norm_factor"], mean)


def test_token_batch_normalization_divides_by_the_token_mean():
    old, rollout, mask = logprobs(3)
    spec = RolloutCorrection(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    out = rollout_correction(old, rollout, mask, spec)
    raw = [[min(math.exp(lr), 2.0) * m for lr, m in zip(row, mrow)] for row, mrow in zip(log_ratio(old, rollout), MASK)]
    mean = masked_mean_ref(raw)
    close(out.weights, [[w / mean for w in row] for row in raw])


# ============================================================== rejection sampling
def test_token_k1_keeps_ratios_inside_the_bounds():
    # verl's k1 statistic is -log r compared with log bounds: "0.5_2.0" keeps pi_rollout / pi_old in [0.5, 2]
    old = torch.zeros(1, 4, dtype=T64)
    rollout = torch.tensor([[0.0, math.log(1.9), math.log(2.1), math.log(0.45)]], dtype=T64)
    out = rollout_correction(old, rollout, torch.ones(1, 4, dtype=T64),
                             RolloutCorrection(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"))
    close(out.response_mask, [[1, 1, 0, 0]])
    close(out.metrics["rollout_corr/rollout_rs_masked_fraction"], 0.5)
    close(out.metrics["rollout_corr/rollout_rs_seq_masked_fraction"], 1.0)
    # one number U means [1/U, U]
    single = rollout_correction(old, rollout, torch.ones(1, 4, dtype=T64),
                                RolloutCorrection(rollout_rs="token_k1", rollout_rs_threshold=2.0))
    close(single.response_mask, [[1, 1, 0, 0]])


def divergences(lr):
    lr = max(min(lr, 20.0), -20.0)
    return {"k1": -lr, "k2": 0.5 * lr * lr, "k3": math.exp(lr) - 1 - lr}


@pytest.mark.parametrize("option,threshold", [("seq_sum_k2", 0.3), ("seq_mean_k3", 0.08), ("seq_max_k2", 0.2),
                                              ("token_k3", 0.1), ("seq_mean_k1", "0.8_1.25")])
def test_rejection_options(option, threshold):
    old, rollout, mask = logprobs(4)
    out = rollout_correction(old, rollout, mask, RolloutCorrection(rollout_rs=option, rollout_rs_threshold=threshold))
    kind = option[-2:]
    keep = []
    for row, mrow in zip(log_ratio(old, rollout), MASK):
        stats = [divergences(lr)[kind] for lr, m in zip(row, mrow) if m]
        if option.startswith("token"):
            keep.append([float(divergences(lr)[kind] <= threshold) * m for lr, m in zip(row, mrow)])
            continue
        stat = {"sum": sum(stats), "mean": sum(stats) / len(stats) if stats else 0.0,
                "max": max(stats) if stats else 0.0}[option.split("_")[1]]
        if kind == "k1":
            low, up = (float(x) for x in threshold.split("_"))
            ok = math.log(low) <= stat <= math.log(up)
        else:
            ok = stat <= threshold
        keep.append([float(ok) * m for m in mrow])
    close(out.response_mask, keep)
    assert 0 < sum(map(sum, keep)) < sum(map(sum, MASK)), "the case must reject some tokens and keep some"
    rejected = [[float(m and not k) for m, k in zip(mrow, krow)] for mrow, krow in zip(MASK, keep)]
    close(out.metrics["rollout_corr/rollout_rs_masked_fraction"], masked_mean_ref(rejected))
    close(out.metrics[f"rollout_corr/rollout_rs_{option}_masked_fraction"], masked_mean_ref(rejected))


def test_several_options_must_all_pass():
    old, rollout, mask = logprobs(5)
    both = rollout_correction(old, rollout, mask, RolloutCorrection(rollout_rs="token_k2,seq_mean_k3",
                                                                    rollout_rs_threshold="0.1,0.05"))
    a = rollout_correction(old, rollout, mask, RolloutCorrection(rollout_rs="token_k2", rollout_rs_threshold=0.1))
    b = rollout_correction(old, rollout, mask, RolloutCorrection(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.05))
    close(both.response_mask, a.response_mask * b.response_mask)


# ============================================================== metrics and settings
def test_offpolicy_metrics_hand():
    # one row, two tokens: log pi_old (-1, -2), log pi_rollout (-1.5, -1); log r = (0.5, -1)
    old = torch.tensor([[-1.0, -2.0]], dtype=T64)
    rollout = torch.tensor([[-1.5, -1.0]], dtype=T64)
    m = rollout_correction(old, rollout, torch.ones(1, 2, dtype=T64), RolloutCorrection()).metrics
    close(m["rollout_corr/kl"], (-0.5 + 1.0) / 2)
    close(m["rollout_corr/k3_kl"], ((math.exp(0.5) - 1.5) + (math.exp(-1) + 1 - 1)) / 2)
    close(m["rollout_corr/training_ppl"], math.exp(1.5))
    close(m["rollout_corr/rollout_ppl"], math.exp(1.25))
    close(m["rollout_corr/log_ppl_diff"], -1.25 + 1.5)
    close(m["rollout_corr/chi2_token"], (math.exp(1.0) + math.exp(-2.0)) / 2 - 1)
    close(m["rollout_corr/chi2_seq"], math.exp(2 * -0.5) - 1)


@pytest.mark.parametrize("spec", [
    RolloutCorrection(),
    RolloutCorrection(rollout_is="token", rollout_is_threshold="0.5_2.0", rollout_is_batch_normalize=True),
    RolloutCorrection(rollout_is="sequence", rollout_rs="token_k1,seq_max_k3", rollout_rs_threshold="2.0,0.1"),
])
def test_metric_keys_depend_on_the_settings_only(spec):
    for seed in (6, 7):
        old, rollout, mask = logprobs(seed)
        assert sorted(rollout_correction(old, rollout, mask, spec).metrics) == sorted(rc_mod.metric_names(spec))


def test_settings_problems_name_the_keys():
    assert RolloutCorrection(rollout_is="tokens").problems() == [
        "algorithm.rollout_correction.rollout_is='tokens' is not one of token, sequence (or null: off)"]
    assert "rollout_is_threshold" in RolloutCorrection(rollout_is="token", rollout_is_threshold="2_1").problems()[0]
    assert "options must be among" in RolloutCorrection(rollout_rs="token_k4", rollout_rs_threshold=1).problems()[0]
    assert "needs rollout_rs_threshold" in RolloutCorrection(rollout_rs="token_k2").problems()[0]
    assert "k2/k3 options one positive upper" in RolloutCorrection(rollout_rs="token_k2",
                                                                   rollout_rs_threshold="0.1_2").problems()[0]
    assert "one per option" in RolloutCorrection(rollout_rs="token_k2,seq_sum_k3",
                                                 rollout_rs_threshold="1,2,3").problems()[0]
    assert "loss_type" in RolloutCorrection(loss_type="ppo").problems()[0]
    assert RolloutCorrection().problems() == [] and not RolloutCorrection().enabled


# ============================================================== bypass_mode
def bypass_params(loss_type, **spec):
    return PolicyLossParams(policy_loss=PolicyLossOptions(
        rollout_correction=RolloutCorrection(bypass_mode=True, loss_type=loss_type, **spec)))


def call(name, old, new, adv, mask, params, weights=None):
    new = new.clone().requires_grad_(True)
    out = POLICY_LOSSES.get(name)(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                  loss_agg_mode="token-mean", config=params, rollout_is_weights=weights)
    out.pg_loss.backward()
    return out.pg_loss, new.grad, out.metrics


def test_bypass_ppo_clip_is_vanilla_against_the_rollout_on_the_kept_tokens():
    # old_log_prob here IS the rollout's; rejection is computed from the CURRENT policy against it
    rollout, new, mask = logprobs(8, spread=0.4)
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(9), dtype=T64)
    spec = dict(rollout_is="token", rollout_is_threshold=1.2, rollout_rs="token_k2", rollout_rs_threshold=0.05)
    loss, grad, metrics = call("bypass_mode", rollout, new, adv, mask, bypass_params("ppo_clip", **spec))
    kept = rollout_correction(new, rollout, mask, RolloutCorrection(**spec)).response_mask
    assert 0 < kept.sum() < mask.sum()
    want_loss, want_grad, _ = call("vanilla", rollout, new, adv, kept, PolicyLossParams())  # no IS weights
    close(loss, want_loss)
    close(grad, want_grad)
    assert "rollout_corr/rollout_is_mean" in metrics and "actor/pg_clipfrac" in metrics


def test_bypass_reinforce_applies_the_is_weights():
    rollout, new, mask = logprobs(10, spread=0.4)
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(11), dtype=T64)
    spec = dict(rollout_is="sequence", rollout_is_threshold=2.0)
    loss, grad, metrics = call("bypass_mode", rollout, new, adv, mask, bypass_params("reinforce", **spec))
    weights = rollout_correction(new, rollout, mask, RolloutCorrection(**spec)).weights
    want_loss, want_grad, _ = call("reinforce", rollout, new, adv, mask, PolicyLossParams(), weights)
    close(loss, want_loss)
    close(grad, want_grad)
    assert sorted(metrics) == sorted(["actor/ppo_kl"] + rc_mod.metric_names(RolloutCorrection(**spec)))
