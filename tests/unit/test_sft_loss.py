"""hybridrl.algos.sft against a float64 negative log-likelihood written here, and its split invariance:
micro-batch shares of the global token-mean add up to the whole batch's mean NLL."""
from __future__ import annotations

import torch

from hybridrl.algos import GlobalBatch
from hybridrl.algos.sft import sft_loss


def reference_nll(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> float:
    """-sum(mask * log softmax(logits)[target]) / sum(mask), in float64, by hand."""
    z = logits.double()
    log_z = torch.log(torch.exp(z - z.max(-1, keepdim=True).values).sum(-1)) + z.max(-1).values
    picked = z.gather(-1, targets[..., None])[..., 0]
    m = mask.double()
    return float(-((picked - log_z) * m).sum() / m.sum())


def test_sft_loss_is_the_mean_nll_of_the_trained_tokens():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g)
    targets = torch.randint(0, 11, (3, 7), generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0, 0], [1, 1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1, 1]])
    log_prob = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0]
    out = sft_loss(log_prob, mask)
    assert abs(float(out.loss) - reference_nll(logits, targets, mask)) < 1e-6
    assert float(out.tokens) == 9
    assert abs(float(out.nll_sum) / 9 - reference_nll(logits, targets, mask)) < 1e-6


def test_micro_batch_shares_add_up_to_the_global_mean_and_scale_with_dp():
    g = torch.Generator().manual_seed(1)
    log_prob = -torch.rand(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).long()
    whole = float(sft_loss(log_prob, mask).loss)
    n = float(mask.sum())
    parts = [sft_loss(log_prob[rows], mask[rows], GlobalBatch(1, n)).loss for rows in ([0, 1], [2], [3, 4, 5])]
    assert abs(float(sum(parts)) - whole) < 1e-6
    # dp ranks: verl's convention multiplies by dp_size (an averaging all-reduce divides it again)
    assert abs(float(sft_loss(log_prob, mask, GlobalBatch(4, n)).loss) - 4 * whole) < 1e-6
    # a masked-out token's log-prob (even NaN there) changes nothing
    poisoned = torch.where(mask.bool(), log_prob, torch.full_like(log_prob, float("nan")))
    assert abs(float(sft_loss(poisoned, mask).loss) - whole) < 1e-6
