"""Advantage estimators vs plain-Python references (hand-derived cases and random ragged batches).

References below loop over rows/tokens with Python floats and never call hybridrl code.
"""

import dataclasses
import math
import statistics

import numpy as np
import pytest
import torch

from hybridrl.algos import ADVANTAGE_ESTIMATORS, AdvantageInputs, AdvantageParams, compute_advantage

T64 = torch.float64
EPS = 1e-6


def close(actual, expected, rtol=1e-6, atol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=T64), torch.as_tensor(expected, dtype=T64), rtol=rtol, atol=atol
    )


def ragged(lengths, T):
    return [[1.0 if t < n else 0.0 for t in range(T)] for n in lengths]


def whiten_ref(x, mask):
    """Whiten a list-of-lists over mask==1 entries (unbiased var, +1e-8), every entry transformed."""
    vals = [v for row, mrow in zip(x, mask) for v, m in zip(row, mrow) if m]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in x]


def groups_of(index):
    out = {}
    for i, key in enumerate(index):
        out.setdefault(key, []).append(i)
    return out


# Random batch: ragged right-padded rows (lengths include 1), groups of sizes 3, 2, 1, 2 interleaved.
LENGTHS = [1, 7, 3, 7, 2, 5, 1, 4]
INDEX = np.array(["a", "b", "a", "c", "b", "a", "d", "d"], dtype=object)
T = 7


def random_batch(seed, sparse_outcome=False):
    g = torch.Generator().manual_seed(seed)
    B = len(LENGTHS)
    rewards = torch.randn(B, T, generator=g, dtype=T64)
    mask = torch.tensor(ragged(LENGTHS, T), dtype=T64)
    if sparse_outcome:  # outcome reward on the last response token only
        rewards = torch.zeros(B, T, dtype=T64)
        for i, n in enumerate(LENGTHS):
            rewards[i, n - 1] = float(torch.randint(0, 3, (1,), generator=g))
    else:
        rewards = rewards * mask
    values = torch.randn(B, T, generator=g, dtype=T64)
    baselines = torch.randn(B, generator=g, dtype=T64)
    return rewards, mask, values, baselines


# ============================================================== GRPO / Dr.GRPO
def grpo_ref(rewards, mask, index, norm_by_std, eps=EPS):
    scores = [sum(row) for row in rewards]
    adv = [0.0] * len(scores)
    for rows in groups_of(index).values():
        group = [scores[i] for i in rows]
        if len(group) == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = statistics.fmean(group), statistics.stdev(group)
        for i in rows:
            adv[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return [[adv[i] * m for m in mask[i]] for i in range(len(scores))]


def test_grpo_hand():
    # group a: scores 1, 0, 2 -> mean 1, std sqrt((0 + 1 + 1) / 2) = 1; group b (one row): mean 0, std 1
    rewards = torch.tensor([[0, 1, 0], [0, 0, 0], [2, 0, 0], [0, 5, 0]], dtype=T64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=T64)
    inputs = AdvantageInputs(rewards, mask, index=np.array(["a", "a", "a", "b"]))
    adv, ret = compute_advantage("grpo", inputs, AdvantageParams())
    d = 1 + EPS
    close(adv, [[0, 0, 0], [-1 / d, 0, 0], [1 / d, 1 / d, 1 / d], [5 / d, 5 / d, 0]])
    close(ret, adv)
    # Dr.GRPO: no std division: a -> 0, -1, +1; b keeps its score minus mean 0 -> 5
    adv, _ = compute_advantage("grpo", inputs, AdvantageParams(norm_adv_by_std_in_grpo=False))
    close(adv, [[0, 0, 0], [-1, 0, 0], [1, 1, 1], [5, 5, 0]])


def test_grpo_equal_scores_give_zero():
    rewards = torch.tensor([[1.0], [1.0], [1.0]], dtype=T64)
    adv, _ = compute_advantage(
        "grpo", AdvantageInputs(rewards, torch.ones(3, 1), index=np.array([7, 7, 7])), AdvantageParams()
    )
    close(adv, torch.zeros(3, 1))


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("sparse", [True, False])
def test_grpo_random(norm_by_std, sparse):
    rewards, mask, _, _ = random_batch(10, sparse_outcome=sparse)
    inputs = AdvantageInputs(rewards, mask, index=INDEX)
    adv, ret = compute_advantage("grpo", inputs, AdvantageParams(norm_adv_by_std_in_grpo=norm_by_std))
    expected = grpo_ref(rewards.tolist(), mask.tolist(), list(INDEX), norm_by_std)
    close(adv, expected)
    close(ret, expected)


def test_grpo_float32_and_int_index():
    rewards, mask, _, _ = random_batch(11)
    index = np.array([0, 1, 0, 2, 1, 0, 3, 3])  # same grouping as INDEX, numpy ints
    adv, _ = compute_advantage("grpo", AdvantageInputs(rewards.float(), mask.float(), index=index), AdvantageParams())
    assert adv.dtype == torch.float32
    close(adv, grpo_ref(rewards.tolist(), mask.tolist(), list(INDEX), True), rtol=1e-5, atol=1e-5)


# ============================================================== RLOO
def rloo_ref(rewards, mask, index):
    scores = [sum(row) for row in rewards]
    adv = list(scores)
    for rows in groups_of(index).values():
        if len(rows) > 1:
            for i in rows:
                others = [scores[j] for j in rows if j != i]
                adv[i] = scores[i] - sum(others) / len(others)
    return [[adv[i] * m for m in mask[i]] for i in range(len(scores))]


def test_rloo_hand():
    # group a: 3, 0, 0 -> 3 - 0 = 3, 0 - 1.5 = -1.5, -1.5; group b (one row): no baseline, keeps 2
    rewards = torch.tensor([[3, 0], [0, 0], [0, 0], [0, 2]], dtype=T64)
    mask = torch.tensor([[1, 0], [1, 1], [1, 0], [1, 1]], dtype=T64)
    adv, ret = compute_advantage(
        "rloo", AdvantageInputs(rewards, mask, index=np.array(["a", "a", "a", "b"])), AdvantageParams()
    )
    close(adv, [[3, 0], [-1.5, -1.5], [-1.5, 0], [2, 2]])
    close(ret, adv)


def test_rloo_random():
    rewards, mask, _, _ = random_batch(12)
    adv, _ = compute_advantage("rloo", AdvantageInputs(rewards, mask, index=INDEX), AdvantageParams())
    close(adv, rloo_ref(rewards.tolist(), mask.tolist(), list(INDEX)))


# ============================================================== GAE
def gae_ref(rewards, values, mask, gamma, lam):
    """GAE on the subsequence of response tokens (masked-out tokens are skipped), closed form
    A_k = sum_j (gamma*lam)^j delta_{k+j}; a masked-out position carries the advantage of the
    next response token (0 if none)."""
    advs, rets = [], []
    for r, v, m in zip(rewards, values, mask):
        pos = [t for t in range(len(r)) if m[t]]
        next_v = [v[pos[k + 1]] if k + 1 < len(pos) else 0.0 for k in range(len(pos))]
        delta = [r[p] + gamma * next_v[k] - v[p] for k, p in enumerate(pos)]
        a_resp = [sum((gamma * lam) ** j * delta[k + j] for j in range(len(pos) - k)) for k in range(len(pos))]
        adv_row = []
        for t in range(len(r)):
            if m[t]:
                adv_row.append(a_resp[pos.index(t)])
            else:
                later = [k for k, p in enumerate(pos) if p > t]
                adv_row.append(a_resp[later[0]] if later else 0.0)
        advs.append(adv_row)
        rets.append([a + vv for a, vv in zip(adv_row, v)])
    return whiten_ref(advs, mask), rets


def test_gae_hand():
    # gamma = lam = 1, response tokens 0 and 2 (token 1 is e.g. a tool observation: reward 7 and value 100
    # are skipped). delta_2 = 1 + 0 - 0.25 = 0.75; delta_0 = 0 + V_2 - V_0 = 0.25 - 0.5 = -0.25;
    # A_2 = 0.75, A_0 = -0.25 + 0.75 = 0.5, A_1 carries A_2 = 0.75. Returns = A + V = 1, 100.75, 1.
    # Whitening over {0.5, 0.75}: mean 0.625, unbiased var 2 * 0.125^2 / 1 = 0.03125.
    rewards = torch.tensor([[0.0, 7.0, 1.0]], dtype=T64)
    values = torch.tensor([[0.5, 100.0, 0.25]], dtype=T64)
    mask = torch.tensor([[1.0, 0.0, 1.0]], dtype=T64)
    adv, ret = compute_advantage("gae", AdvantageInputs(rewards, mask, values=values), AdvantageParams())
    s = math.sqrt(0.03125 + 1e-8)
    close(ret, [[1.0, 100.75, 1.0]])
    close(adv, [[-0.125 / s, 0.125 / s, 0.125 / s]])


def test_gae_hand_discounted():
    # gamma = 0.5, lam = 0.5, right padding. delta_1 = 1 - 0.2 = 0.8, delta_0 = 0 + 0.5*0.2 - 0.4 = -0.3;
    # A_1 = 0.8, A_0 = -0.3 + 0.25*0.8 = -0.1; padded position 2 has no later response token: A = 0.
    rewards = torch.tensor([[0.0, 1.0, 0.0]], dtype=T64)
    values = torch.tensor([[0.4, 0.2, 3.0]], dtype=T64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=T64)
    adv, ret = compute_advantage(
        "gae", AdvantageInputs(rewards, mask, values=values), AdvantageParams(gamma=0.5, lam=0.5)
    )
    close(ret, [[-0.1 + 0.4, 0.8 + 0.2, 3.0]])
    mean, var = 0.35, 2 * 0.45**2  # mean of {-0.1, 0.8}; unbiased var
    s = math.sqrt(var + 1e-8)
    close(adv, [[(-0.1 - mean) / s, (0.8 - mean) / s, (0 - mean) / s]])


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.7, 0.3)])
@pytest.mark.parametrize("holes", [False, True])
def test_gae_random(gamma, lam, holes):
    rewards, mask, values, _ = random_batch(13)
    if holes:  # multi-turn style: punch masked-out tokens inside the responses
        g = torch.Generator().manual_seed(14)
        mask = mask * (torch.rand(mask.shape, generator=g, dtype=T64) > 0.3)
        mask[:, 0] = 1.0
    adv, ret = compute_advantage(
        "gae", AdvantageInputs(rewards, mask, values=values), AdvantageParams(gamma=gamma, lam=lam)
    )
    exp_adv, exp_ret = gae_ref(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    close(ret, exp_ret)
    close(adv, exp_adv)


# ============================================================== REINFORCE++
def rfpp_ref(rewards, mask, gamma):
    """verl 0.9: G_t = sum over the row's response tokens k >= t of gamma^(response tokens in (t, k]) r_k; rewards
    on masked-out positions are dropped, masked-out positions (padding, observation holes) store 0."""
    rets = []
    for r, m in zip(rewards, mask):
        resp = [t for t in range(len(r)) if m[t]]
        row = [0.0] * len(r)
        for j, t in enumerate(resp):
            row[t] = sum(gamma ** (jj - j) * r[k] for jj, k in enumerate(resp) if jj >= j)
        rets.append(row)
    adv = [[a * m for a, m in zip(arow, mrow)] for arow, mrow in zip(whiten_ref(rets, mask), mask)]
    return adv, rets


def test_rfpp_hand():
    # gamma = 0.5: row0 rewards (0, 0, 4) all response -> G = (1, 2, 4); row1 (2, 0 | pad 9) -> G = (2, 0, 0)
    # (the padded reward 9 is dropped and returns are stored times the mask). Whitening over {1, 2, 4, 2, 0}:
    # mean 1.8, unbiased var (0.64 + 0.04 + 4.84 + 0.04 + 3.24) / 4 = 2.2
    rewards = torch.tensor([[0.0, 0.0, 4.0], [2.0, 0.0, 9.0]], dtype=T64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=T64)
    adv, ret = compute_advantage("reinforce_plus_plus", AdvantageInputs(rewards, mask), AdvantageParams(gamma=0.5))
    close(ret, [[1.0, 2.0, 4.0], [2.0, 0.0, 0.0]])
    s = math.sqrt(2.2 + 1e-8)
    close(adv, [[-0.8 / s, 0.2 / s, 2.2 / s], [0.2 / s, -1.8 / s, 0.0]])


def test_rfpp_carries_the_return_through_an_observation_hole():
    # multi-turn: rewards (1, 5, 0, 4), the second token is a tool observation (mask 0). gamma 0.5:
    # G_3 = 4, G_2 = 0 + 0.5 * 4 = 2, the hole stores 0 and drops its reward, G_0 = 1 + 0.5 * G_2 = 2
    rewards = torch.tensor([[1.0, 5.0, 0.0, 4.0], [3.0, 0.0, 0.0, 0.0]], dtype=T64)
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]], dtype=T64)
    _, ret = compute_advantage("reinforce_plus_plus", AdvantageInputs(rewards, mask), AdvantageParams(gamma=0.5))
    close(ret, [[2.0, 0.0, 2.0, 4.0], [3.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_rfpp_random(gamma):
    rewards, mask, _, _ = random_batch(15)
    mask[1, 2:4] = 0  # observation holes inside responses
    mask[5, 1] = 0
    rewards = rewards + (1 - mask) * 3.0  # garbage rewards off the mask must not leak into the response
    adv, ret = compute_advantage("reinforce_plus_plus", AdvantageInputs(rewards, mask), AdvantageParams(gamma=gamma))
    exp_adv, exp_ret = rfpp_ref(rewards.tolist(), mask.tolist(), gamma)
    close(ret, exp_ret)
    close(adv, exp_adv)


# ============================================================== REINFORCE++-baseline
def rfpp_baseline_ref(rewards, mask, index):
    scores = [sum(row) for row in rewards]
    centered = list(scores)
    for rows in groups_of(index).values():
        if len(rows) > 1:
            mean = sum(scores[i] for i in rows) / len(rows)
            for i in rows:
                centered[i] = scores[i] - mean
    tok = [[centered[i] * m for m in mask[i]] for i in range(len(scores))]
    return [[a * m for a, m in zip(arow, mrow)] for arow, mrow in zip(whiten_ref(tok, mask), mask)]


def test_rfpp_baseline_hand():
    # group a: scores 2, 0 -> centered 1, -1; group b (one row): keeps 3. Tokens: row0 (1, 1), row1 (-1),
    # row2 (3, 3, 3). Whitening over {1, 1, -1, 3, 3, 3}: mean 10/6, unbiased var
    # (2 * (2/3)^2 + (8/3)^2 + 3 * (4/3)^2) / 5 = (8/9 + 64/9 + 48/9) / 5 = 120/45
    rewards = torch.tensor([[0, 2, 0], [0, 0, 0], [1, 1, 1]], dtype=T64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=T64)
    adv, _ = compute_advantage(
        "reinforce_plus_plus_baseline",
        AdvantageInputs(rewards, mask, index=np.array(["a", "a", "b"])),
        AdvantageParams(),
    )
    mean, s = 10 / 6, math.sqrt(120 / 45 + 1e-8)
    w = lambda x: (x - mean) / s  # noqa: E731
    close(adv, [[w(1), w(1), 0], [w(-1), 0, 0], [w(3), w(3), w(3)]])


def test_rfpp_baseline_random():
    rewards, mask, _, _ = random_batch(16)
    adv, ret = compute_advantage(
        "reinforce_plus_plus_baseline", AdvantageInputs(rewards, mask, index=INDEX), AdvantageParams()
    )
    expected = rfpp_baseline_ref(rewards.tolist(), mask.tolist(), list(INDEX))
    close(adv, expected)
    close(ret, expected)


# ============================================================== ReMax
def test_remax_hand():
    # reward-to-go of masked rewards: row0 (1, 2 | pad 5) -> (3, 2, 0); minus baseline 1 on response tokens
    rewards = torch.tensor([[1.0, 2.0, 5.0]], dtype=T64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=T64)
    adv, ret = compute_advantage(
        "remax", AdvantageInputs(rewards, mask, reward_baselines=torch.tensor([1.0], dtype=T64)), AdvantageParams()
    )
    close(ret, [[3.0, 2.0, 0.0]])
    close(adv, [[2.0, 1.0, 0.0]])


def test_remax_random():
    rewards, mask, _, baselines = random_batch(17)
    rewards = rewards + (1 - mask) * 2.0
    adv, ret = compute_advantage("remax", AdvantageInputs(rewards, mask, reward_baselines=baselines), AdvantageParams())
    r, m, b = rewards.tolist(), mask.tolist(), baselines.tolist()
    exp_ret = [[sum(r[i][k] * m[i][k] for k in range(t, T)) for t in range(T)] for i in range(len(r))]
    exp_adv = [[exp_ret[i][t] - b[i] * m[i][t] for t in range(T)] for i in range(len(r))]
    close(ret, exp_ret)
    close(adv, exp_adv)


# ============================================================== contract
def full_inputs():
    rewards, mask, values, baselines = random_batch(18)
    return AdvantageInputs(rewards, mask, values=values, index=INDEX, reward_baselines=baselines)


def full_inputs_all():
    inputs = full_inputs()
    g = torch.Generator().manual_seed(19)
    B = len(LENGTHS)
    old = -torch.rand(B, T, generator=g, dtype=T64) * 2
    spsq = torch.rand(B, T, generator=g, dtype=T64)
    comps = {"fmt": torch.randn(B, generator=g, dtype=T64), "acc": torch.randn(B, generator=g, dtype=T64)}
    return dataclasses.replace(inputs, old_log_probs=old, sum_pi_squared=spsq, reward_components=comps)


@pytest.mark.parametrize("name", sorted(n for n in ADVANTAGE_ESTIMATORS.names() if not n.startswith("test")))
def test_every_builtin_estimator_contract(name):
    inputs = full_inputs_all()
    rewards = inputs.token_level_rewards.clone().requires_grad_(True)
    inputs = dataclasses.replace(inputs, token_level_rewards=rewards)
    if name == "grpo_passk":  # needs >= 2 samples in every group
        inputs = dataclasses.replace(inputs, index=np.array(["a", "b", "a", "b", "c", "c", "d", "d"], dtype=object))
    params = AdvantageParams(gamma=0.9, lam=0.8, gdpo_reward_keys=("fmt", "acc"))
    adv, ret = compute_advantage(name, inputs, params)
    assert adv.shape == ret.shape == rewards.shape
    assert adv.dtype == ret.dtype == torch.float64
    assert not adv.requires_grad and not ret.requires_grad
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()


@pytest.mark.parametrize(
    "name,field",
    [
        ("gae", "values"),
        ("grpo", "index"),
        ("rloo", "index"),
        ("reinforce_plus_plus_baseline", "index"),
        ("remax", "reward_baselines"),
    ],
)
def test_missing_input_names_the_field(name, field):
    inputs = full_inputs()
    missing = AdvantageInputs(
        **{
            **{
                k: getattr(inputs, k)
                for k in ("token_level_rewards", "response_mask", "values", "index", "reward_baselines")
            },
            field: None,
        }
    )
    with pytest.raises(ValueError, match=f"adv_estimator='{name}' needs AdvantageInputs.{field}"):
        compute_advantage(name, missing, AdvantageParams())


def test_input_validation():
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        AdvantageInputs(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="one group id per row"):
        AdvantageInputs(torch.zeros(2, 3), torch.zeros(2, 3), index=np.array([0]))
    with pytest.raises(ValueError, match="algorithm.gamma"):
        AdvantageParams(gamma=1.5)
