"""KL estimators, KL controllers and KL-in-reward shaping vs hand-derived and plain-Python references."""

import math

import pytest
import torch

from hybridrl.algos import (
    KL_PENALTIES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    build_kl_controller,
    compute_rewards,
    kl_loss,
    kl_penalty,
)

T64 = torch.float64


def close(actual, expected, rtol=1e-6, atol=1e-7):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=T64), torch.as_tensor(expected, dtype=T64), rtol=rtol, atol=atol
    )


def kl_ref(lp, ref, kind):
    d = lp - ref
    if kind in ("kl", "k1"):
        return d
    if kind == "abs":
        return abs(d)
    if kind in ("mse", "k2"):
        return 0.5 * d * d
    if kind in ("low_var_kl", "k3"):
        x = min(max(-d, -20.0), 20.0)
        return min(max(math.exp(x) - x - 1, -10.0), 10.0)
    raise AssertionError(kind)


KINDS = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]


def test_kl_kinds_hand():
    # d = logprob - ref = 1: k1 1, abs 1, k2 0.5, k3 = e^-1 + 1 - 1 = e^-1
    # d = -0.5:             k1 -0.5, abs 0.5, k2 0.125, k3 = e^0.5 - 0.5 - 1
    lp = torch.tensor([[-1.0, -2.5]], dtype=T64)
    ref = torch.tensor([[-2.0, -2.0]], dtype=T64)
    expected = {
        "kl": [1.0, -0.5],
        "abs": [1.0, 0.5],
        "mse": [0.5, 0.125],
        "low_var_kl": [math.exp(-1), math.exp(0.5) - 1.5],
    }
    for kind, alias in [("kl", "k1"), ("abs", "abs"), ("mse", "k2"), ("low_var_kl", "k3")]:
        close(kl_penalty(lp, ref, kind), [expected[kind]])
        close(kl_penalty(lp, ref, alias), [expected[kind]])


def test_low_var_kl_clamps():
    # d = -30: ref - lp = 30 clamps to 20 -> e^20 - 21, then the value clamps to 10
    # d = +30: ref - lp = -30 clamps to -20 -> e^-20 + 19 > 10 -> 10
    lp = torch.tensor([-31.0, -1.0], dtype=T64)
    ref = torch.tensor([-1.0, -31.0], dtype=T64)
    close(kl_penalty(lp, ref, "low_var_kl"), [10.0, 10.0])
    assert (kl_penalty(lp - 1000, ref, "k3") <= 10).all()


@pytest.mark.parametrize("kind", KINDS)
def test_kl_kinds_random(kind):
    assert kind in KL_PENALTIES
    g = torch.Generator().manual_seed(30)
    lp = -torch.rand(5, 7, generator=g, dtype=T64) * 4
    ref = lp + torch.randn(5, 7, generator=g, dtype=T64) * 3
    out = kl_penalty(lp, ref, kind)
    expected = [[kl_ref(a, b, kind) for a, b in zip(ra, rb)] for ra, rb in zip(lp.tolist(), ref.tolist())]
    close(out, expected)


def test_k3_gradient():
    # d/dlogprob of exp(ref - lp) - (ref - lp) - 1 = 1 - exp(ref - lp)
    lp = torch.tensor([-1.0, -2.0], dtype=T64, requires_grad=True)
    ref = torch.tensor([-1.5, -1.0], dtype=T64)
    kl_penalty(lp, ref, "low_var_kl").sum().backward()
    close(lp.grad, [1 - math.exp(-0.5), 1 - math.exp(1.0)])


def test_kl_loss_aggregates():
    lp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], dtype=T64)
    ref = torch.tensor([[-2.0, -1.5], [-3.0, 0.0]], dtype=T64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=T64)
    # k1 per token (1, 0.5 | 2, masked): token-mean 3.5 / 3, seq-mean-token-mean (0.75 + 2) / 2
    close(kl_loss(lp, ref, mask, "kl", "token-mean"), 3.5 / 3)
    close(kl_loss(lp, ref, mask, "k1", "seq-mean-token-mean"), 1.375)


def test_unknown_kind_did_you_mean():
    with pytest.raises(ValueError, match="did you mean 'low_var_kl'") as err:
        kl_penalty(torch.zeros(1), torch.zeros(1), "low_var")
    assert "abs, abs+, k1, k1+, k2, k2+, k3, k3+, kl, kl+, low_var_kl, low_var_kl+, mse, mse+" in str(err.value)


def test_full_is_not_implemented_with_a_clear_message():
    # verl raises NotImplementedError for 'full' (the whole vocabulary's KL): so do we, saying what to use instead
    with pytest.raises(NotImplementedError, match="full vocabulary.*k3\\+"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "full")


def k2_grad_ref(lp, ref):
    """d/dlp of (lp - ref)^2 / 2."""
    return lp - ref


@pytest.mark.parametrize("kind", KINDS)
def test_straight_through_value_of_kind_gradient_of_k2(kind):
    # verl 0.9's NAME+: the value of NAME, the gradient of k2 (an unbiased KL-gradient estimator)
    g = torch.Generator().manual_seed(32)
    lp0 = -torch.rand(3, 4, generator=g, dtype=T64) * 3
    ref = lp0 + torch.randn(3, 4, generator=g, dtype=T64)
    lp = lp0.clone().requires_grad_(True)
    out = kl_penalty(lp, ref, kind + "+")
    close(out, [[kl_ref(a, b, kind) for a, b in zip(ra, rb)] for ra, rb in zip(lp0.tolist(), ref.tolist())])
    out.sum().backward()
    close(lp.grad, [[k2_grad_ref(a, b) for a, b in zip(ra, rb)] for ra, rb in zip(lp0.tolist(), ref.tolist())])
    if kind in ("kl", "k1"):
        assert not torch.allclose(lp.grad, torch.ones_like(lp.grad))  # k1's own gradient would be 1


def test_kl_loss_global_batch():
    lp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], dtype=T64)
    ref = torch.tensor([[-2.0, -1.5], [-3.0, 0.0]], dtype=T64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=T64)
    # k1 sum 3.5 over 10 global tokens on 2 ranks
    close(kl_loss(lp, ref, mask, "k1", "token-mean", dp_size=2, batch_num_tokens=10), 2 * 3.5 / 10)


def test_compute_rewards():
    # verl's compute_rewards: scores - kl_ratio * (old - ref), k1 on every position (no mask)
    scores = torch.tensor([[0.0, 1.0]], dtype=T64)
    old = torch.tensor([[-1.0, -2.0]], dtype=T64)
    ref = torch.tensor([[-1.5, -1.0]], dtype=T64)
    close(compute_rewards(scores, old, ref, 0.1), [[-0.05, 1.1]])


# ============================================================== controllers
def test_fixed_controller():
    ctl = build_kl_controller("fixed", kl_coef=0.05)
    assert isinstance(ctl, FixedKLController)
    ctl.update(current_kl=123.0, n_steps=1000)
    assert ctl.value == 0.05


def test_adaptive_controller_hand():
    # value 0.1, target 0.05, horizon 1000, n_steps 100:
    # kl 0.1 -> error 1 clipped to 0.2 -> x(1 + 0.2 * 0.1) = 0.102
    # kl 0.045 -> error -0.1 -> x(1 - 0.1 * 0.1) -> 0.102 * 0.99 = 0.10098
    # kl 0.0 -> error -1 clipped to -0.2 -> x0.98
    ctl = build_kl_controller("adaptive", kl_coef=0.1, target_kl=0.05, horizon=1000)
    assert isinstance(ctl, AdaptiveKLController)
    ctl.update(0.1, 100)
    assert ctl.value == pytest.approx(0.102, rel=1e-12)
    ctl.update(0.045, 100)
    assert ctl.value == pytest.approx(0.10098, rel=1e-12)
    ctl.update(0.0, 100)
    assert ctl.value == pytest.approx(0.10098 * 0.98, rel=1e-12)


def test_build_controller_errors():
    with pytest.raises(ValueError, match="fixed"):
        build_kl_controller("adaptve", 0.1)
    with pytest.raises(ValueError, match="target_kl"):
        build_kl_controller("adaptive", 0.1, horizon=10)
    with pytest.raises(ValueError, match="horizon"):
        build_kl_controller("adaptive", 0.1, target_kl=0.1, horizon=0)


# ============================================================== apply_kl_penalty
def test_apply_kl_penalty_hand():
    # kl (k1) = old - ref: row0 (0.5, 0, -0.5), row1 (1, 0, masked). beta = 0.1:
    # rewards row0 (0 - 0.05, 0, 1 + 0.05), row1 (0 - 0.1, 2, 0); the masked token keeps its score.
    # current kl = mean(row0 0/3, row1 1/2) = 0.25; the adaptive controller moves after reading beta.
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]], dtype=T64)
    old = torch.full((2, 3), -1.0, dtype=T64)
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -1.0, -9.0]], dtype=T64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=T64)
    ctl = AdaptiveKLController(0.1, target_kl=0.5, horizon=10)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctl, "kl")
    close(rewards, [[-0.05, 0.0, 1.05], [-0.1, 2.0, 0.0]])
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.25, rel=1e-6)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    # error = 0.25 / 0.5 - 1 = -0.5 -> clipped -0.2; n_steps = B = 2 -> x(1 - 0.2 * 2 / 10) = 0.096
    assert ctl.value == pytest.approx(0.096, rel=1e-6)


@pytest.mark.parametrize("kind", ["kl", "abs", "mse", "low_var_kl"])
def test_apply_kl_penalty_random(kind):
    g = torch.Generator().manual_seed(31)
    lengths, T = [1, 5, 3, 5], 5
    B = len(lengths)
    scores = torch.randn(B, T, generator=g, dtype=T64)
    old = -torch.rand(B, T, generator=g, dtype=T64) * 3
    ref = old + torch.randn(B, T, generator=g, dtype=T64)
    ref[0, 3] = float("-inf")  # a padded position with a non-finite log-prob must not leak
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths], dtype=T64)
    ctl = FixedKLController(0.2)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctl, kind)
    s, o, r, m = scores.tolist(), old.tolist(), ref.tolist(), mask.tolist()
    exp_rewards = [
        [s[i][t] - 0.2 * kl_ref(o[i][t], r[i][t], kind) if m[i][t] else s[i][t] for t in range(T)] for i in range(B)
    ]
    row_means = [sum(kl_ref(o[i][t], r[i][t], kind) for t in range(lengths[i])) / lengths[i] for i in range(B)]
    close(rewards, exp_rewards)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(sum(row_means) / B, rel=1e-6)
