"""verl 0.9's further policy losses vs plain-Python float64 references: values, metrics AND gradients.

For a loss aggregated as sum_t c_t * l_t (c_t = d agg / d l_t of the aggregation mode), the gradient with
respect to the log-prob of token t is c_t * dl_t/dlogp_t, written out per loss below from its definition,
with the stop-gradients verl applies (CISPO's clipped weight, DPPO's mask and truncated ratio, ...): a loss
that let gradient through a detached factor would fail these checks.
"""

import math

import pytest
import torch

from hybridrl.algos import POLICY_LOSSES, GlobalBatch, PolicyLossOptions, PolicyLossParams

T64 = torch.float64
AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
MASK = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 1, 1, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
T = 5


def close(actual, expected, rtol=1e-6, atol=1e-8):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=T64), torch.as_tensor(expected, dtype=T64), rtol=rtol, atol=atol
    )


def agg_coeffs(mask, mode):
    """c[i][t] = d agg / d l[i][t] for verl 0.9.1's agg_loss without global-batch arguments."""
    cnt = [sum(r) for r in mask]
    n_tok, n_rows = sum(cnt), sum(1 for c in cnt if c)
    per = {
        "token-mean": lambda i: 1 / n_tok,
        "token-sum": lambda i: 1.0,
        "seq-mean-token-sum": lambda i: 1 / n_rows,
        "seq-mean-token-mean": lambda i: 1 / (n_rows * cnt[i]),
        "seq-mean-token-sum-norm": lambda i: 1 / (n_rows * T),
    }[mode]
    return [[per(i) if mask[i][t] else 0.0 for t in range(T)] for i in range(len(mask))]


def masked_mean_ref(x, mask):
    vals = [v for row, m in zip(x, mask) for v, k in zip(row, m) if k]
    return sum(vals) / len(vals)


def policy_batch(seed, spread=0.6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(len(MASK), T, generator=g, dtype=T64) * 2 - 0.05
    new = old + torch.randn(len(MASK), T, generator=g, dtype=T64) * spread
    adv = torch.randn(len(MASK), T, generator=g, dtype=T64)
    return old, new, adv, torch.tensor(MASK, dtype=T64)


def run(name, old, new, adv, mask, params, mode="token-mean", weights=None):
    new = new.clone().requires_grad_(True)
    out = POLICY_LOSSES.get(name)(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                  loss_agg_mode=mode, config=params, rollout_is_weights=weights)
    out.pg_loss.backward()
    return out.pg_loss, new.grad, {k.split("/")[-1]: float(v) for k, v in out.metrics.items()}


def expect_tokenwise(token_fn, old, new, adv, mask, mode, weights=None):
    """(aggregated loss, gradient) from token_fn(old, new, adv) -> (l, dl/dnew) per token."""
    o, n, a, m = old.tolist(), new.tolist(), adv.tolist(), mask.tolist()
    w = weights.tolist() if weights is not None else [[1.0] * T for _ in o]
    c = agg_coeffs(m, mode)
    value, grad = 0.0, [[0.0] * T for _ in o]
    for i in range(len(o)):
        for t in range(T):
            lt, dt = token_fn(o[i][t], n[i][t], a[i][t])
            value += c[i][t] * lt * w[i][t]
            grad[i][t] = c[i][t] * dt * w[i][t]
    return value, grad


# ============================================================== cispo
def cispo_token(low, high):
    def f(o, n, a):
        r = math.exp(min(max(n - o, -20), 20))
        w = min(max(r, 1 - low), 1 + high)  # a constant: no gradient through the ratio
        return -w * a * n, -w * a
    return f


@pytest.mark.parametrize("mode", AGG_MODES)
def test_cispo_value_gradient_metrics(mode):
    old, new, adv, mask = policy_batch(1)
    params = PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.28)
    loss, grad, m = run("cispo", old, new, adv, mask, params, mode)
    value, exp_grad = expect_tokenwise(cispo_token(0.2, 0.28), old, new, adv, mask, mode)
    close(loss, value)
    close(grad, exp_grad)
    r = (new - old).exp().tolist()
    clipped = [[float(not (0.8 <= x <= 1.28)) for x in row] for row in r]
    close(m["pg_clipfrac"], masked_mean_ref(clipped, MASK))
    assert 0 < m["pg_clipfrac"] < 1 and m["pg_clipfrac_lower"] == 0.0
    close(m["ppo_kl"], masked_mean_ref((old - new).tolist(), MASK))


# ============================================================== sapo
def sapo_token(tau_pos, tau_neg):
    def f(o, n, a):
        r = math.exp(n - o)
        tau = tau_pos if a > 0 else tau_neg
        s = 1 / (1 + math.exp(-tau * (r - 1)))
        return -s * 4 / tau * a, -4 * s * (1 - s) * r * a  # d gate / d logp = 4 s (1 - s) r
    return f


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_sapo_gate_and_forced_sequence_mean(mode):
    old, new, adv, mask = policy_batch(2)
    params = PolicyLossParams(tau_pos=1.0, tau_neg=1.05)
    loss, grad, m = run("sapo", old, new, adv, mask, params, mode)
    value, exp_grad = expect_tokenwise(sapo_token(1.0, 1.05), old, new, adv, mask, "seq-mean-token-mean")
    close(loss, value)
    close(grad, exp_grad)
    assert m["pg_clipfrac"] == m["pg_clipfrac_lower"] == 0.0
    # at r = 1 the gate's slope is 1: SAPO's gradient equals PPO's -A there
    _, grad_at_one, _ = run("sapo", old, old, adv, mask, params, mode)
    close(grad_at_one, [[c * -a for c, a in zip(crow, arow)] for crow, arow in
                        zip(agg_coeffs(MASK, "seq-mean-token-mean"), adv.tolist())])


# ============================================================== gpg, reinforce, dro
@pytest.mark.parametrize("mode", AGG_MODES)
def test_gpg(mode):
    old, new, adv, mask = policy_batch(3)
    loss, grad, m = run("gpg", old, new, adv, mask, PolicyLossParams(), mode)
    value, exp_grad = expect_tokenwise(lambda o, n, a: (-n * a, -a), old, new, adv, mask, mode)
    close(loss, value)
    close(grad, exp_grad)
    assert m == {}


def test_reinforce_with_is_weights():
    old, new, adv, mask = policy_batch(4)
    weights = torch.rand(old.shape, generator=torch.Generator().manual_seed(5), dtype=T64) * 2
    loss, grad, m = run("reinforce", old, new, adv, mask, PolicyLossParams(), "seq-mean-token-sum", weights)
    value, exp_grad = expect_tokenwise(lambda o, n, a: (-a * n, -a), old, new, adv, mask, "seq-mean-token-sum",
                                       weights)
    close(loss, value)
    close(grad, exp_grad)
    close(m["ppo_kl"], masked_mean_ref((old - new).tolist(), MASK))


@pytest.mark.parametrize("beta", [0.1, 2.0])
def test_dro(beta):
    old, new, adv, mask = policy_batch(6)
    params = PolicyLossParams(policy_loss=PolicyLossOptions(dro_beta=beta))
    loss, grad, _ = run("dro", old, new, adv, mask, params, "token-mean")
    value, exp_grad = expect_tokenwise(lambda o, n, a: (-(n * a - beta / 2 * (n - o) ** 2), -a + beta * (n - o)),
                                       old, new, adv, mask, "token-mean")
    close(loss, value)
    close(grad, exp_grad)
    with pytest.raises(ValueError, match="dro_beta > 0"):
        run("dro", old, new, adv, mask, PolicyLossParams(), "token-mean")


# ============================================================== dppo
def dppo_token(kind, low, high, c):
    def f(o, n, a):
        p, q = math.exp(n), math.exp(o)
        if kind == "tv":
            valid = (p - q <= high) if a > 0 else (p - q >= -low)
        else:
            d = q * (o - n) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
            valid = (d <= high or p <= q) if a > 0 else (d <= low or p >= q)
        w = min(math.exp(n - o), c) * float(valid)  # truncated ratio and mask: constants
        return -a * w * n, -a * w
    return f


@pytest.mark.parametrize("kind", ["tv", "kl"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_dppo(kind, mode):
    old, new, adv, mask = policy_batch(7, spread=1.2)
    new = new.clamp(max=-1e-3)  # log-probs of real tokens are < 0
    params = PolicyLossParams(clip_ratio_low=0.05, clip_ratio_high=0.08, clip_ratio_c=2.0)
    loss, grad, m = run(f"dppo_{kind}", old, new, adv, mask, params, mode)
    value, exp_grad = expect_tokenwise(dppo_token(kind, 0.05, 0.08, 2.0), old, new, adv, mask, mode)
    close(loss, value)
    close(grad, exp_grad)
    o, n, a = old.tolist(), new.tolist(), adv.tolist()
    valid = [[float(dppo_token(kind, 0.05, 0.08, 1e9)(o[i][t], n[i][t], a[i][t])[1] != 0) for t in range(T)]
             for i in range(len(MASK))]
    close(m["pg_clipfrac"], masked_mean_ref([[1 - v for v in row] for row in valid], MASK))
    trunc = [[float(math.exp(n[i][t] - o[i][t]) > 2.0) * valid[i][t] for t in range(T)] for i in range(len(MASK))]
    close(m["pg_clipfrac_lower"], masked_mean_ref(trunc, MASK))
    assert 0 < m["pg_clipfrac"] < 1


# ============================================================== geo_mean (GMPO)
def test_geo_mean_value_gradient_and_global_batch():
    old, new, adv, mask = policy_batch(8, spread=0.4)
    adv = adv[:, :1].expand(-1, T).clone()  # sequence-level advantages, as GMPO assumes
    low, high = 0.2, 0.3
    params = PolicyLossParams(clip_ratio_low=low, clip_ratio_high=high)
    loss, grad, m = run("geo_mean", old, new, adv, mask, params)
    o, n, a = old.tolist(), new.tolist(), adv.tolist()
    B = len(MASK)
    value, exp_grad = 0.0, [[0.0] * T for _ in range(B)]
    for i in range(B):
        cnt = sum(MASK[i]) + 1e-8
        sgn = (a[i][0] > 0) - (a[i][0] < 0)
        dprime, active = [], []
        for t in range(T):
            d = n[i][t] - o[i][t]
            bounded = min(max(d, -low), high)
            dprime.append(sgn * min(sgn * d, sgn * bounded))
            active.append(float(not ((sgn > 0 and d > high) or (sgn < 0 and d < -low) or sgn == 0)))
        ratio = math.exp(sum(dp * k for dp, k in zip(dprime, MASK[i])) / cnt)
        seq_adv = sum(x * k for x, k in zip(a[i], MASK[i])) / cnt
        value += -seq_adv * ratio / B  # verl: torch.mean over rows
        for t in range(T):
            exp_grad[i][t] = -seq_adv * ratio * MASK[i][t] * active[t] / cnt / B
    close(loss, value)
    close(grad, exp_grad)
    assert 0 < m["pg_clipfrac"] + m["pg_clipfrac_lower"] < 1
    # with the mini-batch's global size the rows are averaged over the whole mini-batch (times dp)
    glob = PolicyLossParams(clip_ratio_low=low, clip_ratio_high=high,
                            global_batch_info=GlobalBatch(dp_size=2, global_batch_size=4 * B))
    close(run("geo_mean", old, new, adv, mask, glob)[0], value * 2 / 4)


# ============================================================== clip_cov, kl_cov
def cov_ref(adv, logp, mask):
    va = masked_mean_ref(adv, mask)
    vl = masked_mean_ref(logp, mask)
    return [[(a - va) * (lp - vl) for a, lp in zip(ar, lr)] for ar, lr in zip(adv, logp)]


def test_clip_cov_stops_gradient_on_high_covariance_tokens():
    old, new, adv, mask = policy_batch(9, spread=0.3)
    lb, ub = 0.05, 5.0
    # ratio 1: every candidate is picked, so the random draw does not matter
    params = PolicyLossParams(clip_ratio=0.2, policy_loss=PolicyLossOptions(clip_cov_ratio=1.0, clip_cov_lb=lb,
                                                                             clip_cov_ub=ub))
    loss, grad, m = run("clip_cov", old, new, adv, mask, params)
    o, n, a = old.tolist(), new.tolist(), adv.tolist()
    cov = cov_ref(a, n, MASK)
    c = agg_coeffs(MASK, "token-mean")
    value, exp_grad, zeroed = 0.0, [[0.0] * T for _ in MASK], [[0.0] * T for _ in MASK]
    for i in range(len(MASK)):
        for t in range(T):
            r = math.exp(n[i][t] - o[i][t])
            l1, l2 = -a[i][t] * r, -a[i][t] * min(max(r, 0.8), 1.2)
            ppo_clipped = l2 > l1
            zero = MASK[i][t] and not ppo_clipped and lb < cov[i][t] < ub
            zeroed[i][t] = float(zero)
            if not zero:
                value += c[i][t] * max(l1, l2)
                exp_grad[i][t] = 0.0 if ppo_clipped else c[i][t] * -a[i][t] * r
    close(loss, value)
    close(grad, exp_grad)
    assert 0 < sum(map(sum, zeroed)) < sum(map(sum, MASK))  # some tokens zeroed, not all
    close(m["pg_clipfrac"], masked_mean_ref(zeroed, MASK))


def test_clip_cov_picks_the_configured_share_at_random():
    old, new, adv, mask = policy_batch(9, spread=0.3)
    params = PolicyLossParams(policy_loss=PolicyLossOptions(clip_cov_ratio=0.1, clip_cov_lb=0.05, clip_cov_ub=5.0))
    torch.manual_seed(0)
    _, grad, m = run("clip_cov", old, new, adv, mask, params)
    n_tokens = sum(map(sum, MASK))
    assert m["pg_clipfrac"] == pytest.approx(max(int(0.1 * n_tokens), 1) / n_tokens)


def test_kl_cov_penalizes_the_top_covariance_tokens():
    old, new, adv, mask = policy_batch(10, spread=0.3)
    ratio, coef = 0.2, 0.7
    params = PolicyLossParams(policy_loss=PolicyLossOptions(kl_cov_ratio=ratio, ppo_kl_coef=coef))
    loss, grad, m = run("kl_cov", old, new, adv, mask, params)
    o, n, a = old.tolist(), new.tolist(), adv.tolist()
    cov = cov_ref(a, n, MASK)
    valid = [(cov[i][t], i, t) for i in range(len(MASK)) for t in range(T) if MASK[i][t]]
    top = {(i, t) for _, i, t in sorted(valid, reverse=True)[: max(1, int(len(valid) * ratio))]}
    c = agg_coeffs(MASK, "token-mean")
    value, exp_grad = 0.0, [[0.0] * T for _ in MASK]
    for i in range(len(MASK)):
        for t in range(T):
            d = n[i][t] - o[i][t]
            lt, gt = -a[i][t] * math.exp(d), -a[i][t] * math.exp(d)
            if (i, t) in top:
                lt, gt = lt + coef * abs(d), gt + coef * math.copysign(1.0, d)
            value += c[i][t] * lt
            exp_grad[i][t] = c[i][t] * gt
    close(loss, value)
    close(grad, exp_grad)
    close(m["ppo_kl"], masked_mean_ref([[abs(x - y) for x, y in zip(rn, ro)] for rn, ro in zip(n, o)], MASK))


def test_loss_knobs_are_validated():
    old, new, adv, mask = policy_batch(11)
    with pytest.raises(ValueError, match="clip_cov_ratio must be > 0"):
        run("clip_cov", old, new, adv, mask, PolicyLossParams(policy_loss=PolicyLossOptions(clip_cov_ratio=0)))
    with pytest.raises(ValueError, match="kl_cov_ratio must be > 0"):
        run("kl_cov", old, new, adv, mask, PolicyLossParams(policy_loss=PolicyLossOptions(kl_cov_ratio=0)))
    with pytest.raises(ValueError, match="tau_pos"):
        PolicyLossParams(tau_pos=0)
