"""Policy losses (vanilla PPO with clip-higher/dual-clip, GSPO), IS weights, value and entropy losses.

References are plain-Python per-token loops in float64 that never call hybridrl code.
"""

import math

import pytest
import torch

from hybridrl.algos import (
    GSPO_PARAMS,
    POLICY_LOSSES,
    PolicyLossParams,
    RolloutCorrection,
    entropy_loss,
    entropy_loss_from_logits,
    rollout_correction,
    value_loss,
)

T64 = torch.float64
AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def loss(name, old, new, adv, mask, params=None, mode=None, weights=None):
    """Call a registered loss the way verl calls its losses (keywords); returns (pg_loss, metrics)."""
    kwargs = {} if mode is None else {"loss_agg_mode": mode}
    out = POLICY_LOSSES.get(name)(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                  config=params or PolicyLossParams(), rollout_is_weights=weights, **kwargs)
    return out.pg_loss, {k.split("/")[-1]: v for k, v in out.metrics.items()}


def close(actual, expected, rtol=1e-6, atol=1e-7):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=T64), torch.as_tensor(expected, dtype=T64), rtol=rtol, atol=atol
    )


def ragged(lengths, T):
    return [[1.0 if t < n else 0.0 for t in range(T)] for n in lengths]


def agg_ref(loss, mask, mode):
    """verl 0.9.1's agg_loss without global-batch arguments (rows without a valid token do not count)."""
    B, T = len(loss), len(loss[0])
    sums = [sum(loss[i][t] for t in range(T) if mask[i][t]) for i in range(B)]
    cnts = [sum(1 for t in range(T) if mask[i][t]) for i in range(B)]
    rows = sum(1 for c in cnts if c)
    return {
        "token-mean": lambda: sum(sums) / sum(cnts),
        "token-sum": lambda: sum(sums),
        "seq-mean-token-sum": lambda: sum(sums) / rows,
        "seq-mean-token-mean": lambda: sum(s / c for s, c in zip(sums, cnts) if c) / rows,
        "seq-mean-token-sum-norm": lambda: sum(sums) / rows / T,
    }[mode]()


def mean_over_mask(x, mask):
    vals = [v for row, mrow in zip(x, mask) for v, m in zip(row, mrow) if m]
    return sum(vals) / len(vals)


LENGTHS, T = [1, 6, 2, 0, 6, 4, 1], 6  # ragged, with a row that has no response token


def random_policy_batch(seed, spread=0.4):
    g = torch.Generator().manual_seed(seed)
    B = len(LENGTHS)
    old = -torch.rand(B, T, generator=g, dtype=T64) * 3 - 0.1
    new = old + torch.randn(B, T, generator=g, dtype=T64) * spread
    adv = torch.randn(B, T, generator=g, dtype=T64)
    mask = torch.tensor(ragged(LENGTHS, T), dtype=T64)
    return old, new, adv, mask


# ============================================================== vanilla PPO
def vanilla_token_ref(d, a, low, high, c):
    """One token: d = log_prob - old_log_prob, a = advantage -> (loss, clipped?, dual-clipped?)."""
    r = math.exp(min(max(d, -20.0), 20.0))
    l1 = -a * r
    l2 = -a * min(max(r, 1 - low), 1 + high)
    loss = max(l1, l2)
    lower = False
    if a < 0:
        lower = loss > -a * c
        loss = min(loss, -a * c)
    return loss, l2 > l1, lower


def vanilla_ref(old, new, adv, mask, low, high, c, mode, weights=None):
    B = len(old)
    losses, clip, lower = [], [], []
    for i in range(B):
        lrow, crow, lwrow = [], [], []
        for t in range(len(old[i])):
            loss, cl, lw = vanilla_token_ref(new[i][t] - old[i][t], adv[i][t], low, high, c)
            lrow.append(loss * (weights[i][t] if weights else 1.0))
            crow.append(float(cl))
            lwrow.append(float(lw))
        losses.append(lrow)
        clip.append(crow)
        lower.append(lwrow)
    kl = [[old[i][t] - new[i][t] for t in range(len(old[i]))] for i in range(B)]
    return (
        agg_ref(losses, mask, mode),
        mean_over_mask(clip, mask),
        mean_over_mask(kl, mask),
        mean_over_mask(lower, mask),
    )


def test_vanilla_hand_clip_higher_and_dual_clip():
    # low 0.2, high 0.28 (clip-higher), c = 3. Five tokens (ratio r, advantage A):
    # 1. r=1.1, A=+1: inside the band -> -1.1, gradient -A*r = -1.1
    # 2. r=1.5, A=+1: above 1.28 -> max(-1.5, -1.28) = -1.28 clipped, gradient 0
    # 3. r=0.7, A=-1: below 0.8 -> max(0.7, 0.8) = 0.8 clipped, gradient 0
    # 4. r=5.0, A=-1: max(5, 1.28) = 5 > -A*c = 3 -> dual-clip 3, gradient 0
    # 5. r=0.5, A=+2: max(-1, -1.6) = -1 unclipped, gradient -2*0.5 = -1
    # token-mean: (-1.1 - 1.28 + 0.8 + 3 - 1) / 5 = 0.084; clipfrac 2/5; clipfrac_lower 1/5;
    # ppo_kl = mean(-ln r) = -ln(1.1*1.5*0.7*5*0.5) / 5 = -ln(2.8875) / 5
    ratios = torch.tensor([[1.1, 1.5, 0.7, 5.0, 0.5]], dtype=T64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 2.0]], dtype=T64)
    old = torch.full((1, 5), -1.0, dtype=T64)
    new = (old + ratios.log()).requires_grad_(True)
    params = PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    pg_loss, m = loss("vanilla", old, new, adv, torch.ones(1, 5, dtype=T64), params, "token-mean")
    close(pg_loss, 0.084)
    close(m["pg_clipfrac"], 0.4)
    close(m["pg_clipfrac_lower"], 0.2)
    close(m["ppo_kl"], -math.log(2.8875) / 5)
    pg_loss.backward()
    close(new.grad, [[-1.1 / 5, 0.0, 0.0, 0.0, -1.0 / 5]])
    assert set(m) == {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}


def test_vanilla_clip_higher_bound_is_asymmetric():
    # A > 0: r = 1.25 is inside [0.8, 1.28] (gradient flows) while the symmetric 0.2 clip would stop it
    old = torch.zeros(1, 1, dtype=T64)
    adv = torch.ones(1, 1, dtype=T64)
    for high, expect_grad in [(0.28, -1.25), (0.2, 0.0)]:
        new = torch.full((1, 1), math.log(1.25), dtype=T64, requires_grad=True)
        pg_loss, _ = loss("vanilla", old, new, adv, torch.ones(1, 1), PolicyLossParams(clip_ratio=0.2, clip_ratio_high=high))
        pg_loss.backward()
        close(new.grad, [[expect_grad]])
        close(pg_loss, -min(1.25, 1 + high))


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("low,high,c", [(0.2, 0.2, 3.0), (0.2, 0.28, 2.0), (0.1, 0.5, 1.5)])
def test_vanilla_random(mode, low, high, c):
    old, new, adv, mask = random_policy_batch(21, spread=1.0)
    new = new + (1 - mask) * 50.0  # padding garbage must not count
    params = PolicyLossParams(clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c)
    pg_loss, m = loss("vanilla", old, new, adv, mask, params, mode)
    exp = vanilla_ref(old.tolist(), new.tolist(), adv.tolist(), mask.tolist(), low, high, c, mode)
    close(pg_loss, exp[0])
    close(m["pg_clipfrac"], exp[1])
    close(m["ppo_kl"], exp[2])
    close(m["pg_clipfrac_lower"], exp[3])
    assert 0 < exp[1] < 1 and exp[3] > 0  # the batch really exercises both clips


def test_vanilla_with_token_is_weights():
    old, new, adv, mask = random_policy_batch(21)
    g = torch.Generator().manual_seed(22)
    rollout = old + torch.randn(old.shape, generator=g, dtype=T64) * 0.7
    spec = RolloutCorrection(rollout_is="token", rollout_is_threshold=1.5)  # = the old tis_imp_ratio_cap=1.5
    w = rollout_correction(old, rollout, mask, spec).weights
    # reference weights: min(exp(old - rollout), cap) on response tokens, 0 elsewhere
    exp_w = [[min(math.exp(o - r), 1.5) * mm for o, r, mm in zip(orow, rrow, mrow)]
             for orow, rrow, mrow in zip(old.tolist(), rollout.tolist(), mask.tolist())]
    close(w, exp_w)
    assert (w <= 1.5).all() and (w == 1.5).any() and ((w < 1.0) & (mask > 0)).any()
    pg_loss, _ = loss("vanilla", old, new.requires_grad_(True), adv, mask, PolicyLossParams(), "token-mean", weights=w)
    exp = vanilla_ref(old.tolist(), new.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.2, 3.0, "token-mean", exp_w)
    close(pg_loss, exp[0])
    pg_loss.backward()
    assert not w.requires_grad


def test_policy_params_validation():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        PolicyLossParams(clip_ratio_c=1.0)
    assert PolicyLossParams(clip_ratio=0.3).low == 0.3 == PolicyLossParams(clip_ratio=0.3).high


# ============================================================== GSPO
def gspo_ref(old, new, adv, mask, low, high, mode="seq-mean-token-mean"):
    """Per row: s_i = exp(mean over response tokens of (new - old)); token loss max(-A s, -A clip(s)),
    aggregated with `mode`."""
    losses, clip = [], []
    for i in range(len(old)):
        resp = [t for t in range(len(old[i])) if mask[i][t]]
        s = math.exp(min(sum(new[i][t] - old[i][t] for t in resp) / max(len(resp), 1), 10.0))
        lrow, crow = [], []
        for t in range(len(old[i])):
            a = adv[i][t]
            l1, l2 = -a * s, -a * min(max(s, 1 - low), 1 + high)
            lrow.append(max(l1, l2))
            crow.append(float(l2 > l1))
        losses.append(lrow)
        clip.append(crow)
    kl = [[o - n for o, n in zip(orow, nrow)] for orow, nrow in zip(old, new)]
    return agg_ref(losses, mask, mode), mean_over_mask(clip, mask), mean_over_mask(kl, mask)


def test_gspo_hand():
    # verl's GSPO range: low 3e-4, high 4e-4. A = +1 everywhere.
    # row0: token ratios 2 and 0.5 -> geometric mean 1 -> loss -1 on both tokens
    # row1: one token, ratio 1.0002 (inside) -> -1.0002
    # row2: one token, ratio 1.001 (> 1.0004) -> clipped -1.0004
    # seq-mean-token-mean: (-1 - 1.0002 - 1.0004) / 3 = -1.0002; clipfrac 1 of 4 tokens
    old = torch.zeros(3, 2, dtype=T64)
    new = torch.tensor([[math.log(2), math.log(0.5)], [math.log(1.0002), 0], [math.log(1.001), 0]], dtype=T64)
    mask = torch.tensor([[1, 1], [1, 0], [1, 0]], dtype=T64)
    pg_loss, m = loss("gspo", old, new, torch.ones(3, 2, dtype=T64), mask, GSPO_PARAMS)
    close(pg_loss, -1.0002)
    close(m["pg_clipfrac"], 0.25)
    close(m["ppo_kl"], -(math.log(1.0002) + math.log(1.001)) / 4)
    close(m["pg_clipfrac_lower"], 0.0)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("low,high", [(3e-4, 4e-4), (0.05, 0.08)])
def test_gspo_random_honours_loss_agg_mode(low, high, mode):
    # verl 0.9.1 aggregates GSPO with the mode it is given (the old code forced seq-mean-token-mean)
    old, new, adv, mask = random_policy_batch(23, spread=0.05)
    pg_loss, m = loss("gspo", old, new, adv, mask, PolicyLossParams(clip_ratio_low=low, clip_ratio_high=high), mode)
    exp = gspo_ref(old.tolist(), new.tolist(), adv.tolist(), mask.tolist(), low, high, mode)
    close(pg_loss, exp[0])
    close(m["pg_clipfrac"], exp[1])
    close(m["ppo_kl"], exp[2])


def test_gspo_gradient_equals_sequence_ratio_gradient():
    # With one advantage per sequence and no clipping, the token-form GSPO gradient must equal the
    # gradient of the sequence objective (1/B) sum_i -A_i * exp(mean_t(logp - old)), written here from
    # scratch (python indexing over the response tokens, autograd only for the derivative).
    old, new, _, mask = random_policy_batch(24, spread=0.2)
    g = torch.Generator().manual_seed(25)
    seq_adv = torch.randn(len(LENGTHS), generator=g, dtype=T64)
    adv = seq_adv.unsqueeze(-1).expand(-1, T).clone()
    wide = PolicyLossParams(clip_ratio_low=0.99, clip_ratio_high=100.0)

    new_a = new.clone().requires_grad_(True)
    loss("gspo", old, new_a, adv, mask, wide)[0].backward()

    new_b = new.clone().requires_grad_(True)
    total = 0
    rows = [i for i, n in enumerate(LENGTHS) if n]
    for i in rows:
        n = LENGTHS[i]
        log_s = sum(new_b[i, t] - old[i, t] for t in range(n)) / n
        total = total + -seq_adv[i] * torch.exp(log_s)
    (total / len(rows)).backward()
    close(new_a.grad, new_b.grad, rtol=1e-7, atol=1e-12)  # 1e-8 eps in the token-mean
    assert (new_a.grad[mask == 0] == 0).all()


def test_gspo_clipped_sequence_gets_no_gradient():
    # row0 ratio e^0.1 ~ 1.105 > 1 + 0.05 with A > 0 -> clipped; row1 ratio e^0.01 inside -> gradient
    old = torch.zeros(2, 2, dtype=T64)
    new = torch.tensor([[0.1, 0.1], [0.01, 0.0]], dtype=T64, requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]], dtype=T64)
    loss("gspo", old, new, torch.ones(2, 2, dtype=T64), mask, PolicyLossParams(clip_ratio=0.05))[0].backward()
    # row1: d/dlogp of -(1/B) * exp(logp) at one token = -(1/2) * e^0.01
    close(new.grad, [[0.0, 0.0], [-0.5 * math.exp(0.01), 0.0]])


# ============================================================== value loss
def test_value_loss_hand():
    # token0: v=1.0, V_old=0.5, R=2, c=0.2 -> clipped v 0.7; (1-2)^2 = 1 < (0.7-2)^2 = 1.69 -> 1.69 (clipped)
    # token1: v=0.6 inside [0.3, 0.7]; both terms (0.6-0)^2 = 0.36
    # token2: masked out. vf_loss = 0.5 * mean(1.69, 0.36) = 0.5125; clipfrac 1/2
    vpreds = torch.tensor([[1.0, 0.6, 9.0]], dtype=T64, requires_grad=True)
    out = value_loss(
        vpreds,
        torch.tensor([[2.0, 0.0, 0.0]], dtype=T64),
        torch.tensor([[0.5, 0.5, 0.0]], dtype=T64),
        torch.tensor([[1.0, 1.0, 0.0]], dtype=T64),
        cliprange_value=0.2,
    )
    close(out.vf_loss, 0.5125)
    close(out.vf_clipfrac, 0.5)
    out.vf_loss.backward()
    # token0's active term is the clipped one (constant in v): gradient 0; token1: 0.5 * 2 * 0.6 / 2 = 0.3
    close(vpreds.grad, [[0.0, 0.3, 0.0]])


@pytest.mark.parametrize("mode", AGG_MODES)
def test_value_loss_random(mode):
    g = torch.Generator().manual_seed(27)
    B = len(LENGTHS)
    vpreds, returns, values = (torch.randn(B, T, generator=g, dtype=T64) for _ in range(3))
    mask = torch.tensor(ragged(LENGTHS, T), dtype=T64)
    out = value_loss(vpreds, returns, values, mask, 0.3, mode)
    v, r, o, m = vpreds.tolist(), returns.tolist(), values.tolist(), mask.tolist()
    losses, clip = [], []
    for i in range(B):
        lrow, crow = [], []
        for t in range(T):
            vc = min(max(v[i][t], o[i][t] - 0.3), o[i][t] + 0.3)
            l1, l2 = (v[i][t] - r[i][t]) ** 2, (vc - r[i][t]) ** 2
            lrow.append(max(l1, l2))
            crow.append(float(l2 > l1))
        losses.append(lrow)
        clip.append(crow)
    close(out.vf_loss, 0.5 * agg_ref(losses, m, mode))
    close(out.vf_clipfrac, mean_over_mask(clip, m))


# ============================================================== entropy
@pytest.mark.parametrize("mode", AGG_MODES)
def test_entropy_loss(mode):
    g = torch.Generator().manual_seed(28)
    logits = torch.randn(len(LENGTHS), T, 5, generator=g, dtype=T64)
    mask = torch.tensor(ragged(LENGTHS, T), dtype=T64)
    ent = []
    for row in logits.tolist():
        erow = []
        for z in row:
            p = [math.exp(v) / sum(math.exp(u) for u in z) for v in z]
            erow.append(-sum(pi * math.log(pi) for pi in p))
        ent.append(erow)
    close(entropy_loss_from_logits(logits, mask, mode), agg_ref(ent, mask.tolist(), mode))
    close(entropy_loss(torch.tensor(ent, dtype=T64), mask, mode), agg_ref(ent, mask.tolist(), mode))
