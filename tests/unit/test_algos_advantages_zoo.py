"""verl 0.9's further advantage estimators vs plain-Python float64 references written here.

Batches are ragged, group ids are shuffled and non-contiguous (ints, not in order), some groups have one
member, some rows have no response token at all, and some responses have holes (multi-turn observations,
mask 0 inside the response). References loop over rows and tokens and never call hybridrl code.
"""

import math
import statistics

import numpy as np
import pytest
import torch

from hybridrl.algos import AdvantageInputs, AdvantageParams, compute_advantage

T64 = torch.float64
EPS = 1e-6


def close(actual, expected, rtol=1e-6, atol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=T64), torch.as_tensor(expected, dtype=T64), rtol=rtol, atol=atol
    )


def groups_of(index):
    out = {}
    for i, key in enumerate(index):
        out.setdefault(key, []).append(i)
    return out


# 10 rows, T = 6. Groups 7: rows 0, 2, 5, 9; 3: rows 1, 4; 11: row 3 (alone); 42: rows 6, 8; 5: row 7 (alone).
# Row 8 has no response token; rows 2 and 5 have holes.
INDEX = np.array([7, 3, 7, 11, 3, 7, 42, 5, 42, 7])
T = 6
MASK = [
    [1, 1, 1, 0, 0, 0],
    [1, 1, 1, 1, 1, 1],
    [1, 0, 0, 1, 1, 0],
    [1, 1, 0, 0, 0, 0],
    [1, 0, 0, 0, 0, 0],
    [1, 1, 0, 1, 0, 1],
    [1, 1, 1, 1, 0, 0],
    [1, 1, 1, 0, 0, 0],
    [0, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 1, 0],
]


def batch(seed, outcome=True):
    g = torch.Generator().manual_seed(seed)
    B = len(MASK)
    mask = torch.tensor(MASK, dtype=T64)
    if outcome:  # integer outcome scores on the last response token, equal within some groups
        rewards = torch.zeros(B, T, dtype=T64)
        for i, row in enumerate(MASK):
            if any(row):
                rewards[i, max(t for t in range(T) if row[t])] = float(torch.randint(0, 3, (1,), generator=g))
    else:
        rewards = torch.randn(B, T, generator=g, dtype=T64) * mask
    old = -torch.rand(B, T, generator=g, dtype=T64) * 3 - 0.05
    spsq = torch.exp(old) ** 2 + torch.rand(B, T, generator=g, dtype=T64) * (1 - torch.exp(old) ** 2)
    return rewards, mask, old, spsq


def scores_of(rewards, mask):
    return [sum(r * m for r, m in zip(rr, mm)) for rr, mm in zip(rewards, mask)]


def per_token(adv, mask):
    return [[a * m for m in mrow] for a, mrow in zip(adv, mask)]


def grpo_scalar_ref(scores, index, norm_by_std=True, eps=EPS):
    adv = [0.0] * len(scores)
    for rows in groups_of(index).values():
        group = [scores[i] for i in rows]
        mean, std = (0.0, 1.0) if len(rows) == 1 else (statistics.fmean(group), statistics.stdev(group))
        for i in rows:
            adv[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return adv


def whiten_ref(x, mask):
    vals = [v for row, mrow in zip(x, mask) for v, m in zip(row, mrow) if m]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return [[(v - mean) / math.sqrt(var + 1e-8) * m for v, m in zip(row, mrow)] for row, mrow in zip(x, mask)]


def run(name, rewards, mask, params=None, **extra):
    return compute_advantage(name, AdvantageInputs(rewards, mask, index=INDEX, **extra), params or AdvantageParams())


# ============================================================== grpo_vectorized, rloo_vectorized
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_vectorized_is_grpo(norm_by_std):
    rewards, mask, _, _ = batch(1)
    params = AdvantageParams(norm_adv_by_std_in_grpo=norm_by_std)
    adv, ret = run("grpo_vectorized", rewards, mask, params)
    exp = per_token(grpo_scalar_ref(scores_of(rewards.tolist(), MASK), list(INDEX), norm_by_std), MASK)
    close(adv, exp)
    close(ret, exp)


def rloo_ref(scores, index, singleton_keeps):
    adv = [0.0] * len(scores)
    for rows in groups_of(index).values():
        n = len(rows)
        for i in rows:
            if n == 1:
                adv[i] = scores[i] if singleton_keeps else 0.0
            else:
                adv[i] = scores[i] - sum(scores[j] for j in rows if j != i) / (n - 1)
    return adv


def test_rloo_and_rloo_vectorized_differ_on_groups_of_one():
    # group 1: scores 1, 3 -> -2, 2 (leave-one-out); group 2 has one row, score 5: rloo keeps 5, verl's
    # vectorized form multiplies by [n > 1] and gives 0
    rewards = torch.tensor([[1.0], [3.0], [5.0]], dtype=T64)
    mask = torch.ones(3, 1, dtype=T64)
    inputs = AdvantageInputs(rewards, mask, index=np.array(["x", "x", "y"], dtype=object))
    close(compute_advantage("rloo", inputs, AdvantageParams()).advantages, [[-2.0], [2.0], [5.0]])
    close(compute_advantage("rloo_vectorized", inputs, AdvantageParams()).advantages, [[-2.0], [2.0], [0.0]])


@pytest.mark.parametrize("name,keeps", [("rloo", True), ("rloo_vectorized", False)])
def test_rloo_random(name, keeps):
    rewards, mask, _, _ = batch(2, outcome=False)
    adv, _ = run(name, rewards, mask)
    close(adv, per_token(rloo_ref(scores_of(rewards.tolist(), MASK), list(INDEX), keeps), MASK))


# ============================================================== grpo_passk
def passk_ref(scores, index, norm_by_std, eps=EPS):
    adv = [0.0] * len(scores)
    for rows in groups_of(index).values():
        vals = sorted((scores[i] for i in rows), reverse=True)
        gap = vals[0] - vals[1]
        if norm_by_std:
            gap /= statistics.stdev([scores[i] for i in rows]) + eps
        best = [i for i in rows if scores[i] == vals[0]]
        if gap:  # ties at the top give 0 to all
            adv[best[0]] = gap
    return adv


def test_grpo_passk_hand():
    # one group, scores 3, 1, 2: only the best row learns, r_max - r_second = 1, std 1 -> 1 / (1 + eps)
    rewards = torch.tensor([[3.0], [1.0], [2.0]], dtype=T64)
    inputs = AdvantageInputs(rewards, torch.ones(3, 1, dtype=T64), index=np.array([4, 4, 4]))
    close(compute_advantage("grpo_passk", inputs, AdvantageParams()).advantages, [[1 / (1 + EPS)], [0.0], [0.0]])
    dr = AdvantageParams(norm_adv_by_std_in_grpo=False)
    close(compute_advantage("grpo_passk", inputs, dr).advantages, [[1.0], [0.0], [0.0]])


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_passk_random(norm_by_std):
    g = torch.Generator().manual_seed(3)
    index = np.array([9, 2, 9, 2, 2, 9, 6, 6])  # interleaved, no group of one
    rewards = torch.randn(8, 3, generator=g, dtype=T64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 1], [1, 0, 1], [1, 1, 0], [1, 1, 1]],
                        dtype=T64)
    rewards = rewards * mask  # rewards live on response tokens (estimators sum the whole row, as verl)
    inputs = AdvantageInputs(rewards, mask, index=index)
    adv, _ = compute_advantage("grpo_passk", inputs, AdvantageParams(norm_adv_by_std_in_grpo=norm_by_std))
    close(adv, per_token(passk_ref(scores_of(rewards.tolist(), mask.tolist()), list(index), norm_by_std), mask.tolist()))


def test_grpo_passk_rejects_groups_of_one():
    rewards, mask, _, _ = batch(4)
    with pytest.raises(ValueError, match="at least 2 responses per prompt"):
        run("grpo_passk", rewards, mask)


# ============================================================== opo, gpg
def opo_ref(scores, lengths, index):
    adv = [0.0] * len(scores)
    for rows in groups_of(index).values():
        total = sum(lengths[i] for i in rows)
        b = 0.0 if len(rows) == 1 or total == 0 else sum(lengths[i] * scores[i] for i in rows) / total
        for i in rows:
            adv[i] = scores[i] - b
    return adv


def test_opo_hand():
    # group: lengths 1 and 3, scores 2 and 0 -> baseline (1*2 + 3*0) / 4 = 0.5; a group of one: no baseline
    rewards = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0], [4.0, 0.0, 0.0]], dtype=T64)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=T64)
    inputs = AdvantageInputs(rewards, mask, index=np.array([1, 1, 2]))
    close(compute_advantage("opo", inputs, AdvantageParams()).advantages,
          [[1.5, 0, 0], [-0.5, -0.5, -0.5], [4.0, 4.0, 0]])


def test_opo_random():
    rewards, mask, _, _ = batch(5, outcome=False)
    adv, _ = run("opo", rewards, mask)
    lengths = [sum(r) for r in MASK]
    close(adv, per_token(opo_ref(scores_of(rewards.tolist(), MASK), lengths, list(INDEX)), MASK))


def gpg_ref(scores, index):
    alpha = len(scores) / max(sum(1 for s in scores if s != 0), 1)
    adv = [0.0] * len(scores)
    for rows in groups_of(index).values():
        mean = 0.0 if len(rows) == 1 else statistics.fmean(scores[i] for i in rows)
        for i in rows:
            adv[i] = alpha * (scores[i] - mean)
    return adv


def test_gpg_hand():
    # scores 1, 0 | 0, 3: two nonzero of four -> alpha 2; means 0.5 and 1.5 -> 2 * (0.5, -0.5, -1.5, 1.5)
    rewards = torch.tensor([[1.0], [0.0], [0.0], [3.0]], dtype=T64)
    inputs = AdvantageInputs(rewards, torch.ones(4, 1, dtype=T64), index=np.array(["a", "a", "b", "b"], dtype=object))
    close(compute_advantage("gpg", inputs, AdvantageParams()).advantages, [[1.0], [-1.0], [-3.0], [3.0]])


def test_gpg_random():
    rewards, mask, _, _ = batch(6)
    adv, _ = run("gpg", rewards, mask)
    close(adv, per_token(gpg_ref(scores_of(rewards.tolist(), MASK), list(INDEX)), MASK))


# ============================================================== gdpo
def gdpo_ref(components, weights, index, mask, norm_by_std):
    total = [0.0] * len(index)
    for comp, w in zip(components, weights):
        for i, a in enumerate(grpo_scalar_ref(comp, list(index), norm_by_std)):
            total[i] += w * a
    return whiten_ref(per_token(total, mask), mask)


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_gdpo_normalizes_each_component_then_whitens(norm_by_std):
    g = torch.Generator().manual_seed(7)
    rewards, mask, _, _ = batch(7)
    fmt = torch.randint(0, 2, (len(MASK),), generator=g).to(T64) * 0.1  # a small reward...
    acc = torch.randint(0, 2, (len(MASK),), generator=g).to(T64) * 10.0  # ...and a large one
    params = AdvantageParams(norm_adv_by_std_in_grpo=norm_by_std, gdpo_reward_keys=("fmt", "acc"),
                             gdpo_reward_weights=(2.0, 0.5))
    adv, ret = run("gdpo", rewards, mask, params, reward_components={"acc": acc, "fmt": fmt})
    exp = gdpo_ref([fmt.tolist(), acc.tolist()], [2.0, 0.5], INDEX, MASK, norm_by_std)
    close(adv, exp)
    close(ret, exp)


def test_gdpo_without_keys_uses_the_total_score_and_names_missing_keys():
    rewards, mask, _, _ = batch(8)
    adv, _ = run("gdpo", rewards, mask)
    close(adv, gdpo_ref([scores_of(rewards.tolist(), MASK)], [1.0], INDEX, MASK, True))
    params = AdvantageParams(gdpo_reward_keys=("fmt",))
    with pytest.raises(KeyError, match=r"\['fmt'\] are not among the reward components \['acc'\]"):
        run("gdpo", rewards, mask, params, reward_components={"acc": torch.zeros(len(MASK), dtype=T64)})
    with pytest.raises(ValueError, match="one weight per key"):
        AdvantageParams(gdpo_reward_keys=("a", "b"), gdpo_reward_weights=(1.0,))


# ============================================================== optimal token baseline
def otb_rows(rewards, mask, old, spsq, is_w):
    """Per row: reward-to-go G and cumulative path weight W (lists over all T columns)."""
    out = []
    for i in range(len(rewards)):
        G = [sum(rewards[i][k] * mask[i][k] for k in range(t, T)) for t in range(T)]
        w = [(1 - 2 * math.exp(old[i][t]) + spsq[i][t]) * (is_w[i][t] ** 2 if is_w else 1.0) for t in range(T)]
        W = [sum(w[j] * mask[i][j] for j in range(t + 1)) for t in range(T)]
        out.append((G, W))
    return out


def baseline_ref(G, W, M, rows, lengths, width, zero_tail=True):
    """B[i][t] for the rows of one group (zeros for a group of one)."""
    B = {i: [0.0] * width for i in rows}
    if len(rows) < 2:
        return B
    for t in range(width):
        num = sum(G[i][t] * W[i][t] * M[i][t] for i in rows)
        den = sum(W[i][t] * M[i][t] for i in rows) + 1e-8
        for i in rows:
            B[i][t] = num / den
    ordered = sorted(lengths[i] for i in rows)
    longest = [i for i in rows if lengths[i] == ordered[-1]]
    if zero_tail and len(longest) == 1 and ordered[-1] > ordered[-2]:
        for t in range(int(ordered[-2]), width):
            B[longest[0]][t] = 0.0
    return B


def otb_ref(rewards, mask, old, spsq, index, is_w=None):
    rows = otb_rows(rewards, mask, old, spsq, is_w)
    G, W = [r[0] for r in rows], [r[1] for r in rows]
    lengths = [sum(m) for m in mask]
    adv = [[0.0] * T for _ in rewards]
    for members in groups_of(index).values():
        B = baseline_ref(G, W, mask, members, lengths, T)
        for i in members:
            adv[i] = [(G[i][t] - B[i][t]) * mask[i][t] for t in range(T)]
    return adv, G


def tir_ref(rewards, mask, old, spsq, index, is_w=None):
    rows = otb_rows(rewards, mask, old, spsq, is_w)
    resp = [[t for t in range(T) if mask[i][t]] for i in range(len(rewards))]
    g = [[rows[i][0][t] for t in resp[i]] for i in range(len(rewards))]  # compacted to the row's own tokens
    w = [[rows[i][1][t] for t in resp[i]] for i in range(len(rewards))]
    width = max(len(r) for r in resp)
    pad = lambda x: x + [0.0] * (width - len(x))  # noqa: E731
    gp, wp = [pad(x) for x in g], [pad(x) for x in w]
    mp = [pad([1.0] * len(r)) for r in resp]
    lengths = [len(r) for r in resp]
    adv = [[0.0] * T for _ in rewards]
    for members in groups_of(index).values():
        members = [i for i in members if lengths[i] > 0]  # rows without a response token leave their group
        B = baseline_ref(gp, wp, mp, members, lengths, width)
        for i in members:
            for j, t in enumerate(resp[i]):
                adv[i][t] = gp[i][j] - B[i][j]
    return adv, [rows[i][0] for i in range(len(rewards))]


def test_otb_hand():
    # one group, two rows, w = 1 - 2 * 0.5 + 1 = 1 on every token. Both length 2: W = (1, 2); G row0 (1, 1),
    # row1 (0, 0) -> B_0 = 1 * 1 / 2 = 0.5, B_1 = 1 * 2 / 4 = 0.5 -> A row0 (0.5, 0.5), row1 (-0.5, -0.5)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=T64)
    old = torch.full((2, 2), math.log(0.5), dtype=T64)
    spsq = torch.ones(2, 2, dtype=T64)
    inputs = dict(index=np.array([0, 0]), old_log_probs=old, sum_pi_squared=spsq)
    adv, ret = compute_advantage("optimal_token_baseline",
                                 AdvantageInputs(rewards, torch.ones(2, 2, dtype=T64), **inputs), AdvantageParams())
    close(adv, [[0.5, 0.5], [-0.5, -0.5]], atol=1e-7)
    close(ret, [[1.0, 1.0], [0.0, 0.0]])
    # row1 one token long: row0 is the only longest, so past row1's length its baseline is 0 (zero tail)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=T64)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 9.0]], dtype=T64)
    adv, _ = compute_advantage("optimal_token_baseline", AdvantageInputs(rewards, mask, **inputs), AdvantageParams())
    close(adv, [[0.5, 1.0], [-0.5, 0.0]], atol=1e-7)


@pytest.mark.parametrize("with_is", [False, True])
@pytest.mark.parametrize("name,ref", [("optimal_token_baseline", otb_ref), ("tir_optimal_token_baseline", tir_ref)])
def test_otb_random(name, ref, with_is):
    rewards, mask, old, spsq = batch(9, outcome=False)
    is_w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(10), dtype=T64) * 2 if with_is else None
    adv, ret = run(name, rewards, mask, old_log_probs=old, sum_pi_squared=spsq, rollout_is_weights=is_w)
    exp_adv, exp_ret = ref(rewards.tolist(), MASK, old.tolist(), spsq.tolist(), list(INDEX),
                           is_w.tolist() if with_is else None)
    close(adv, exp_adv)
    close(ret, exp_ret)


def test_tir_otb_aligns_own_tokens_across_observation_holes():
    # row0 (0 1 1) and row1 (1 1 0) both have 2 policy tokens; the TIR variant compares token k with token k,
    # the plain one column with column, so they differ exactly when holes shift the tokens
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=T64)
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=T64)
    old = torch.full((2, 3), math.log(0.5), dtype=T64)
    extra = dict(index=np.array([0, 0]), old_log_probs=old, sum_pi_squared=torch.ones(2, 3, dtype=T64))
    tir, _ = compute_advantage("tir_optimal_token_baseline", AdvantageInputs(rewards, mask, **extra), AdvantageParams())
    plain, _ = compute_advantage("optimal_token_baseline", AdvantageInputs(rewards, mask, **extra), AdvantageParams())
    # TIR: own tokens G row0 (1, 1), row1 (0, 0), W (1, 2) each -> B = (0.5, 0.5)
    close(tir, [[0.0, 0.5, 0.5], [-0.5, -0.5, 0.0]], atol=1e-7)
    # columns: col0 only row1 (B = 0), col1 both (W 1 and 2: B = 1*1/3), col2 only row0 (B = 1)
    close(plain, [[0.0, 1 - 1 / 3, 0.0], [0.0, -1 / 3, 0.0]], atol=1e-7)


def test_otb_needs_its_inputs():
    rewards, mask, old, _ = batch(11)
    with pytest.raises(ValueError, match="needs AdvantageInputs.sum_pi_squared"):
        run("optimal_token_baseline", rewards, mask, old_log_probs=old)
