"""masked reductions, entropy/log-prob helpers and loss aggregation vs plain-Python references."""

import math

import pytest
import torch

from hybridrl.algos import (
    LOSS_AGG_MODES,
    GlobalBatch,
    agg_loss,
    calculate_sum_pi_squared_from_logits,
    clip_by_value,
    entropy_from_logits,
    entropy_from_logits_chunked,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    sum_pi_squared_from_logits,
)

T64 = torch.float64


def close(actual, expected, rtol=1e-6, atol=1e-7):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=T64), torch.as_tensor(expected, dtype=T64), rtol=rtol, atol=atol
    )


def ragged(lengths, T):
    return [[1.0 if t < n else 0.0 for t in range(T)] for n in lengths]


# ---------------------------------------------------------------- masked reductions
def test_masked_reductions_hand():
    x = torch.tensor([[1.0, 2.0], [3.0, 100.0]], dtype=T64)
    m = torch.tensor([[1, 1], [1, 0]])
    # sum over set entries 1+2+3 = 6, mean 2, unbiased var ((1-2)^2 + 0 + (3-2)^2) / (3-1) = 1
    close(masked_sum(x, m), 6.0)
    close(masked_mean(x, m), 2.0)
    close(masked_var(x, m), 1.0)
    close(masked_var(x, m, unbiased=False), 2.0 / 3.0)
    # per-row: row0 mean 1.5, row1 mean 3
    close(masked_mean(x, m, axis=-1), [1.5, 3.0])
    # whiten: (x - 2) / sqrt(1 + 1e-8); the masked-out 100 is transformed too
    s = math.sqrt(1 + 1e-8)
    close(masked_whiten(x, m), [[-1 / s, 0.0], [1 / s, 98 / s]])
    close(masked_whiten(x, m, shift_mean=False), [[-1 / s + 2, 2.0], [1 / s + 2, 98 / s + 2]])


def test_masked_reductions_ignore_nan_and_inf_off_mask():
    x = torch.tensor([1.0, float("nan"), float("-inf"), 3.0], dtype=T64)
    m = torch.tensor([True, False, False, True])
    close(masked_sum(x, m), 4.0)
    close(masked_mean(x, m), 2.0)


def test_masked_var_rejects_degenerate_masks():
    x = torch.ones(3, dtype=T64)
    with pytest.raises(ValueError, match="no element"):
        masked_var(x, torch.zeros(3))
    with pytest.raises(ValueError, match="single element"):
        masked_var(x, torch.tensor([0.0, 1.0, 0.0]))


def test_masked_whiten_random_ragged():
    g = torch.Generator().manual_seed(0)
    lengths, T = [1, 6, 3, 6, 2], 6
    x = torch.randn(len(lengths), T, generator=g, dtype=T64)
    m = torch.tensor(ragged(lengths, T), dtype=T64)
    vals = [x[i, t].item() for i in range(len(lengths)) for t in range(lengths[i])]
    n = len(vals)
    mean = sum(vals) / n
    var = sum((v - mean) ** 2 for v in vals) / (n - 1)
    expected = [[(x[i, t].item() - mean) / math.sqrt(var + 1e-8) for t in range(T)] for i in range(len(lengths))]
    close(masked_whiten(x, m), expected)


# ---------------------------------------------------------------- logits helpers
def test_entropy_hand_and_stable():
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)], [1000.0, 1000.0], [-1e4, 0.0]], dtype=T64)
    # uniform over 2: ln 2; probs (1/4, 3/4): -(1/4 ln 1/4 + 3/4 ln 3/4); huge equal logits: still ln 2;
    # one logit 1e4 below the other: ~0 and finite
    expected = [math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(2), 0.0]
    close(entropy_from_logits(logits), expected, atol=1e-12)


def test_entropy_random_reference():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 4, 11, generator=g, dtype=T64) * 3
    out = entropy_from_logits(logits)
    for idx in [(0, 0), (1, 2), (2, 3)]:
        z = logits[idx].tolist()
        zmax = max(z)
        denom = sum(math.exp(v - zmax) for v in z)
        p = [math.exp(v - zmax) / denom for v in z]
        close(out[idx], -sum(pi * math.log(pi) for pi in p))


def test_logprobs_from_logits():
    logits = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]], dtype=T64)
    labels = torch.tensor([[2, 0]])
    # 3 - ln(e + e^2 + e^3), and ln(1/3)
    expected = [[3 - math.log(math.e + math.e**2 + math.e**3), -math.log(3)]]
    close(logprobs_from_logits(logits, labels), expected)
    # bf16 logits are upcast: result is float32 and close to the float64 answer
    out = logprobs_from_logits(logits.to(torch.bfloat16), labels)
    assert out.dtype == torch.float32
    close(out, expected, rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------- aggregation
def agg_reference(loss, mask, mode, dp=1, tokens=None, rows=None, horizon=None):
    """verl 0.9.1's agg_loss as plain-Python loops over rows/tokens (tokens/rows: the global counts)."""
    B, T = len(loss), len(loss[0])
    tok_sum = [sum(loss[i][t] for t in range(T) if mask[i][t]) for i in range(B)]
    tok_cnt = [sum(1 for t in range(T) if mask[i][t]) for i in range(B)]
    n_tokens = sum(tok_cnt) if tokens is None else tokens
    n_rows = sum(1 for c in tok_cnt if c) if rows is None else rows  # rows without a token leave the divisor
    div = lambda x, d: x / d if d else 0.0  # noqa: E731
    if mode == "token-mean":
        return dp * div(sum(tok_sum), n_tokens)
    if mode == "token-sum":
        return dp * sum(tok_sum)
    if mode == "seq-mean-token-sum":
        return dp * div(sum(tok_sum), n_rows)
    if mode == "seq-mean-token-mean":
        return dp * div(sum(s / c for s, c in zip(tok_sum, tok_cnt) if c), n_rows)
    if mode == "seq-mean-token-sum-norm":
        return dp * div(sum(tok_sum), n_rows) / (T if horizon is None else horizon)
    raise AssertionError(mode)


AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def test_agg_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=T64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=T64)
    close(agg_loss(loss, mask, "token-mean"), 7 / 3)  # (1+2+4) / 3 tokens
    close(agg_loss(loss, mask, "token-sum"), 7.0)
    close(agg_loss(loss, mask, "seq-mean-token-sum"), 3.5)  # (3 + 4) / 2 rows
    close(agg_loss(loss, mask, "seq-mean-token-mean"), 2.75)  # (1.5 + 4) / 2
    close(agg_loss(loss, mask, "seq-mean-token-sum-norm"), 3.5 / 3)  # (3 + 4) / 2 rows / T=3
    close(agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=7.0), 0.5)
    # verl 0.9.1: a fully masked row leaves the row count (the old code divided 7 by 3 rows here)
    loss3 = torch.cat([loss, torch.tensor([[7.0, 8.0, 9.0]], dtype=T64)])
    mask3 = torch.cat([mask, torch.zeros(1, 3, dtype=T64)])
    close(agg_loss(loss3, mask3, "token-mean"), 7 / 3)
    close(agg_loss(loss3, mask3, "seq-mean-token-sum"), 3.5)
    close(agg_loss(loss3, mask3, "seq-mean-token-mean"), 2.75)
    close(agg_loss(loss3, mask3, "seq-mean-token-sum-norm"), 3.5 / 3)
    # nothing valid at all: 0, not NaN
    for mode in AGG_MODES:
        close(agg_loss(loss, torch.zeros_like(mask), mode), 0.0)


def test_agg_global_batch_arguments_hand():
    # verl 0.9's meaning: the scalar is this batch's share of the global objective, times dp_size
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=T64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=T64)
    close(agg_loss(loss, mask, "token-mean", dp_size=2, batch_num_tokens=10), 2 * 7 / 10)
    close(agg_loss(loss, mask, "token-sum", dp_size=2), 14.0)
    close(agg_loss(loss, mask, "seq-mean-token-sum", dp_size=2, global_batch_size=8), 2 * 7 / 8)
    close(agg_loss(loss, mask, "seq-mean-token-mean", dp_size=2, global_batch_size=8), 2 * 5.5 / 8)
    close(agg_loss(loss, mask, "seq-mean-token-sum-norm", dp_size=2, global_batch_size=8, loss_scale_factor=4),
          2 * 7 / 8 / 4)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        with pytest.raises(ValueError, match="dp_size > 1 needs the global"):
            agg_loss(loss, mask, mode, dp_size=2)
    with pytest.raises(ValueError, match="loss_scale_factor must be > 0"):
        agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=0)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_random_ragged(mode):
    g = torch.Generator().manual_seed(2)
    lengths, T = [1, 8, 3, 8, 5, 1, 0, 2, 0], 8
    loss = torch.randn(len(lengths), T, generator=g, dtype=T64)
    mask = torch.tensor(ragged(lengths, T), dtype=T64)
    mask[3, 2:5] = 0  # a hole inside a response (a multi-turn observation)
    loss[mask == 0] = float("nan")  # padding garbage must not leak
    expected = agg_reference(loss.tolist(), mask.tolist(), mode)
    close(agg_loss(loss, mask, mode), expected)
    close(agg_loss(loss, mask, mode, dp_size=4, batch_num_tokens=123, global_batch_size=37, loss_scale_factor=4096),
          agg_reference(loss.tolist(), mask.tolist(), mode, 4, 123, 37, 4096))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_micro_batch_shares_sum_to_the_whole_batch(mode):
    # the rule the actor relies on: with the global counts, the shares of any split add up to the whole batch
    g = torch.Generator().manual_seed(3)
    lengths, T = [3, 0, 7, 1, 7, 5, 2, 6], 7
    loss = torch.randn(len(lengths), T, generator=g, dtype=T64)
    mask = torch.tensor(ragged(lengths, T), dtype=T64)
    whole = agg_loss(loss, mask, mode, global_batch_size=len(lengths))  # verl's trainer counts every row
    counts = dict(batch_num_tokens=float(mask.sum()), global_batch_size=len(lengths))
    parts = [slice(0, 3), slice(3, 4), slice(4, 8)]
    close(sum(agg_loss(loss[p], mask[p], mode, dp_size=1, **counts) for p in parts), whole)
    # two "ranks" holding halves: each share carries a factor dp, undone by an averaging reduce
    halves = [agg_loss(loss[h], mask[h], mode, dp_size=2, **counts) for h in (slice(0, 4), slice(4, 8))]
    close(sum(halves) / 2, whole)


def test_agg_registry_is_complete_and_errors():
    assert set(AGG_MODES) == set(n for n in LOSS_AGG_MODES.names() if not n.startswith("test"))
    loss, mask = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(
        ValueError, match="actor_rollout_ref.actor.loss_agg_mode='token_mean'.*did you mean 'token-mean'"
    ):
        agg_loss(loss, mask, "token_mean")
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        agg_loss(loss, torch.ones(2, 4), "token-mean")


def test_agg_user_mode_roundtrip():
    @LOSS_AGG_MODES.register("test-token-max", override=True)  # override: idempotent across reruns
    def token_max(loss_mat, loss_mask, batch: GlobalBatch):
        return loss_mat.masked_fill(loss_mask == 0, float("-inf")).max() * batch.dp_size

    loss = torch.tensor([[1.0, 9.0], [4.0, 2.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    close(agg_loss(loss, mask, "test-token-max"), 4.0)  # 9 is masked out
    close(agg_loss(loss, mask, "test-token-max", dp_size=3, batch_num_tokens=3, global_batch_size=2), 12.0)


def test_global_batch_unpacks_as_verl_keywords():
    batch = GlobalBatch(dp_size=2, batch_num_tokens=10, global_batch_size=4, loss_scale_factor=8)
    assert dict(**batch) == {"dp_size": 2, "batch_num_tokens": 10, "global_batch_size": 4, "loss_scale_factor": 8}
    with pytest.raises(ValueError, match="dp_size"):
        GlobalBatch(dp_size=0)


def test_clip_by_value_tensor_bounds():
    x = torch.tensor([0.0, 5.0, -5.0, 1.0], dtype=T64)
    lo = torch.tensor([1.0, -1.0, -1.0, 2.0], dtype=T64)
    hi = torch.tensor([2.0, 1.0, 1.0, 0.0], dtype=T64)  # last: hi < lo -> verl's order max(min(x, hi), lo) = lo
    close(clip_by_value(x, lo, hi), [1.0, 1.0, -1.0, 2.0])


# ---------------------------------------------------------------- chunked entropy and sum of squared probabilities
def softmax64(z):
    zmax = max(z)
    e = [math.exp(v - zmax) for v in z]
    return [v / sum(e) for v in e]


def test_sum_pi_squared_hand():
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)], [1000.0, -1000.0]], dtype=T64)
    close(sum_pi_squared_from_logits(logits), [0.5, 1 / 16 + 9 / 16, 1.0])
    close(calculate_sum_pi_squared_from_logits(logits), [0.5, 0.625, 1.0])


@pytest.mark.parametrize("chunk", [1, 5, 7, 2048])
def test_chunked_entropy_and_sum_pi_squared_random(chunk):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 5, 13, generator=g, dtype=T64) * 4
    ent = entropy_from_logits_chunked(logits, chunk_size=chunk)
    spsq = sum_pi_squared_from_logits(logits, chunk_size=chunk)
    assert ent.shape == spsq.shape == (3, 5)
    for i in range(3):
        for t in range(5):
            p = softmax64(logits[i, t].tolist())
            close(ent[i, t], -sum(q * math.log(q) for q in p))
            close(spsq[i, t], sum(q * q for q in p))


def test_chunked_entropy_gradient_and_chunk_sizes(monkeypatch):
    import hybridrl.algos.entropy as entropy_mod

    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 6, 9, generator=g, dtype=T64)
    weights = torch.randn(4, 6, generator=g, dtype=T64)
    a = logits.clone().requires_grad_(True)
    (entropy_from_logits(a) * weights).sum().backward()
    seen = []
    inner = entropy_mod._entropy
    monkeypatch.setattr(entropy_mod, "_entropy", lambda z: seen.append(z.shape[0]) or inner(z))
    b = logits.clone().requires_grad_(True)
    (entropy_from_logits_chunked(b, chunk_size=5) * weights).sum().backward()
    close(b.grad, a.grad, rtol=1e-10, atol=1e-12)
    # 24 token rows in chunks of at most 5, each recomputed once in the backward pass (checkpointing)
    assert max(seen) == 5 and sum(seen) == 2 * 24
    # half precision is upcast before the softmax
    assert entropy_from_logits_chunked(logits.to(torch.bfloat16)).dtype == torch.float32
