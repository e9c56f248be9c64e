"""Supervised fine-tuning's objective: the negative log-likelihood of the trained tokens (verl's sft_loss).

    loss = -sum_{i,t} mask_{i,t} * log p(x_{i,t} | x_{i,<t}) / N * dp_size

N is the number of trained tokens in the WHOLE step's batch (all micro-batches on all data-parallel ranks), so
every trained token weighs the same however the batch is split (agg_loss's token-mean with the global batch, the
one home of that rule). `mask` is 1 on the tokens the model is taught to write: assistant turns, never the system
prompt, user turns or tool outputs (hybridrl.data.sft_chat builds it).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .agg import GlobalBatch, agg_loss
from .torch_functional import masked_sum


class SFTLossOutput(NamedTuple):
    loss: torch.Tensor  # [] this micro-batch's share of the step's mean NLL, times dp_size (verl's convention)
    nll_sum: torch.Tensor  # [] detached: summed NLL of this micro-batch's trained tokens
    tokens: torch.Tensor  # [] trained tokens of this micro-batch


def sft_loss(log_prob: torch.Tensor, loss_mask: torch.Tensor, batch: GlobalBatch = GlobalBatch()) -> SFTLossOutput:
    """log_prob, loss_mask: [B, T] (the log-probability of each token given the ones before it, 1 where trained)."""
    mask = loss_mask.to(log_prob.dtype)
    loss = agg_loss(-log_prob, mask, "token-mean", batch.dp_size, batch.batch_num_tokens)
    return SFTLossOutput(loss, masked_sum(-log_prob.detach(), mask), mask.sum())
