"""masked reductions, entropy/log-prob helpers and loss aggregation vs plain-Python references."""

import math

import pytest
import torch

from hybridrl.algos import (
    LOSS_AGG_MODES,
    agg_loss,
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
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
def agg_reference(loss, mask, mode, horizon=None):
    """Plain-Python loops over rows/tokens."""
    B, T = len(loss), len(loss[0])
    tok_sum = [sum(loss[i][t] for t in range(T) if mask[i][t]) for i in range(B)]
    tok_cnt = [sum(1 for t in range(T) if mask[i][t]) for i in range(B)]
    if mode == "token-mean":
        return sum(tok_sum) / sum(tok_cnt) if sum(tok_cnt) else 0.0
    if mode == "seq-mean-token-sum":
        return sum(tok_sum) / B
    if mode == "seq-mean-token-mean":
        return sum(s / c for s, c in zip(tok_sum, tok_cnt) if c) / B
    if mode == "seq-mean-token-sum-norm":
        return sum(tok_sum) / (T if horizon is None else horizon)
    raise AssertionError(mode)


AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def test_agg_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=T64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=T64)
    close(agg_loss(loss, mask, "token-mean"), 7 / 3)  # (1+2+4) / 3 tokens
    close(agg_loss(loss, mask, "seq-mean-token-sum"), 3.5)  # (3 + 4) / 2 rows
    close(agg_loss(loss, mask, "seq-mean-token-mean"), 2.75)  # (1.5 + 4) / 2
    close(agg_loss(loss, mask, "seq-mean-token-sum-norm"), 7 / 3)  # 7 / T=3
    close(agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=7.0), 1.0)
    # a fully masked row counts as a row that contributes 0
    loss3 = torch.cat([loss, torch.tensor([[7.0, 8.0, 9.0]], dtype=T64)])
    mask3 = torch.cat([mask, torch.zeros(1, 3, dtype=T64)])
    close(agg_loss(loss3, mask3, "token-mean"), 7 / 3)
    close(agg_loss(loss3, mask3, "seq-mean-token-sum"), 7 / 3)
    close(agg_loss(loss3, mask3, "seq-mean-token-mean"), 5.5 / 3)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_random_ragged(mode):
    g = torch.Generator().manual_seed(2)
    lengths, T = [1, 8, 3, 8, 5, 1, 0, 2], 8
    loss = torch.randn(len(lengths), T, generator=g, dtype=T64)
    loss[torch.tensor(ragged(lengths, T)) == 0] = float("nan")  # padding garbage must not leak
    mask = torch.tensor(ragged(lengths, T), dtype=T64)
    expected = agg_reference(loss.tolist(), mask.tolist(), mode)
    close(agg_loss(loss, mask, mode), expected)
    if mode == "seq-mean-token-sum-norm":
        close(
            agg_loss(loss, mask, mode, loss_scale_factor=4096), agg_reference(loss.tolist(), mask.tolist(), mode, 4096)
        )


def test_agg_registry_is_complete_and_errors():
    assert set(AGG_MODES) <= set(LOSS_AGG_MODES.names())
    loss, mask = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(
        ValueError, match="actor_rollout_ref.actor.loss_agg_mode='token_mean'.*did you mean 'token-mean'"
    ):
        agg_loss(loss, mask, "token_mean")
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        agg_loss(loss, torch.ones(2, 4), "token-mean")


def test_agg_user_mode_roundtrip():
    @LOSS_AGG_MODES.register("test-token-max", override=True)  # override: idempotent across reruns
    def token_max(loss_mat, loss_mask, loss_scale_factor):
        return loss_mat.masked_fill(loss_mask == 0, float("-inf")).max()

    loss = torch.tensor([[1.0, 9.0], [4.0, 2.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    close(agg_loss(loss, mask, "test-token-max"), 4.0)  # 9 is masked out
