"""Batches in verl's padded layout -> megatron micro-batches -> per-response-token outputs.

Why re-align: verl batches are left-padded prompts + right-padded responses with HF position_ids,
but megatron's RoPE (local and TE specs) uses positions 0..s-1 and a plain causal mask. Moving each
row's contiguous valid tokens to the front makes RoPE positions equal HF's position_ids and keeps
padding after every real token, where a causal mask never lets real tokens see it; rows are then
trimmed to the longest one in the micro-batch. Exact for any contiguous attention_mask (checked).

Log-probs, entropy and sum of squared probabilities are computed vocab-parallel: each tp rank holds
logits [.., V/tp]; reductions (max, sum of exp, sum of p*z) are all-reduced over the tp group, so full
logits are never gathered. Padded vocab entries (rows added for tp divisibility) are masked to -inf
before any softmax. Without autograd (the log-prob passes) entropy and sum_pi_squared walk the response
tokens CHUNK_TOKENS at a time, so their [tokens, V/tp] temporaries stay small for large vocabularies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch

from . import compat

CHUNK_TOKENS = 512  # response tokens per chunk of the no-grad entropy / sum_pi_squared: [512, V/tp] fp32 temporaries


@dataclass
class MicroBatch:
    """One micro-batch, re-aligned. Shapes: b rows, L packed length, R response length."""

    input_ids: torch.Tensor  # [b, L] valid tokens first, then 0
    position_ids: torch.Tensor  # [b, L] 0..L-1
    resp_index: torch.Tensor  # [b, R] packed position whose output predicts response token j
    resp_valid: torch.Tensor  # [b, R] bool: response token j is inside the attention mask
    responses: torch.Tensor  # [b, R] response token ids (labels)
    extras: dict[str, torch.Tensor]  # per-row training inputs ([b, R]: old_log_probs, advantages, ...)
    rows: torch.Tensor  # [b] indices of these rows in the caller's batch
    padding_mask: Optional[torch.Tensor] = None  # [b, L] True after each row's tokens (MoE routing skips them)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, responses: torch.Tensor,
         rows: torch.Tensor, extras: Optional[dict[str, torch.Tensor]] = None, multiple: int = 1) -> MicroBatch:
    """Re-align a [b, T] left/right-padded batch whose last R columns are the response."""
    b, T = input_ids.shape
    R = responses.shape[1]
    mask = attention_mask.bool()
    lengths = mask.sum(1)
    start = torch.where(lengths > 0, mask.float().argmax(1), torch.zeros_like(lengths))
    ar = torch.arange(T, device=mask.device)
    contiguous = (mask == ((ar >= start[:, None]) & (ar < (start + lengths)[:, None]))).all(1)
    if not bool(contiguous.all()):
        bad = torch.nonzero(~contiguous).flatten().tolist()
        raise ValueError(f"attention_mask rows {bad} have holes; the megatron adapter needs one contiguous run of "
                         "1s per row (left-padded prompt + response)")
    L = max(int(lengths.max()), 1)
    L = -(-L // multiple) * multiple
    pos = torch.arange(L, device=mask.device)
    src = (start[:, None] + pos[None]).clamp(max=T - 1)
    packed = torch.where(pos[None] < lengths[:, None], input_ids.gather(1, src), torch.zeros_like(src))
    j = torch.arange(R, device=mask.device)
    resp_pos = (T - R) + j[None] - start[:, None]  # packed position of response token j
    valid = (resp_pos >= 1) & (resp_pos < lengths[:, None])
    dev = compat.device()
    return MicroBatch(
        input_ids=packed.to(dev),
        position_ids=pos[None].expand(b, L).contiguous().to(dev),
        resp_index=(resp_pos - 1).clamp(0, L - 1).to(dev),
        resp_valid=valid.to(dev),
        responses=responses.to(dev),
        extras={k: v.to(dev) for k, v in (extras or {}).items()},
        rows=rows,
        padding_mask=(pos[None] >= lengths[:, None]).to(dev),
    )


def gather_response(out: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """[b, L, X] model outputs at the positions predicting each response token -> [b, R, X]."""
    idx = mb.resp_index[..., None].expand(-1, -1, out.shape[-1])
    return out.gather(1, idx)


# ------------------------------------------------------------------------------------------ vocab-parallel
def mask_vocab_padding(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """-inf on this tp rank's padded vocab columns (only the last ranks have any)."""
    from megatron.core import parallel_state as ps

    local = logits.shape[-1]
    start = ps.get_tensor_model_parallel_rank() * local
    real = max(0, min(local, vocab_size - start))
    if real == local:
        return logits
    keep = torch.arange(local, device=logits.device) < real
    return logits.masked_fill(~keep, float("-inf"))


def vocab_parallel_entropy(z: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(z) over the full vocab from tp-sharded z [.., V/tp] (differentiable).

    H = log S - (sum_v e_v (z_v - m)) / S with e = exp(z - m), S = sum_v e_v, m the global max (a
    constant: H does not depend on it). Sums are all-reduced with megatron's identity-backward
    reduction, the right gradient because every tp rank holds the same replicated loss.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    m = z.detach().max(dim=-1, keepdim=True).values
    torch.distributed.all_reduce(m, op=torch.distributed.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    shifted = z - m
    e = torch.exp(shifted)
    finite = torch.where(torch.isinf(shifted), torch.zeros_like(shifted), shifted)  # 0 * -inf would be nan
    s = reduce_from_tensor_model_parallel_region(e.sum(-1))
    ez = reduce_from_tensor_model_parallel_region((e * finite).sum(-1))
    return torch.log(s) - ez / s


@torch.no_grad()
def vocab_parallel_sum_pi_squared(z: torch.Tensor) -> torch.Tensor:
    """sum_v softmax(z)_v^2 over the full vocab from tp-sharded z [.., V/tp] (no gradient).

    With e = exp(z - m) (m the global max): S1 = sum e, S2 = sum e^2, both all-reduced; the result is S2 / S1^2.
    """
    from megatron.core import parallel_state as ps

    group = ps.get_tensor_model_parallel_group()
    m = z.max(dim=-1, keepdim=True).values
    torch.distributed.all_reduce(m, op=torch.distributed.ReduceOp.MAX, group=group)
    e = torch.exp(z - m)
    sums = torch.stack([e.sum(-1), e.square().sum(-1)])
    torch.distributed.all_reduce(sums, group=group)
    return sums[1] / sums[0].square()


@torch.no_grad()
def _chunked(fn: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """fn over CHUNK_TOKENS rows of z [b, R, V/tp] at a time -> [b, R]; every tp rank takes the same chunks."""
    flat = z.reshape(-1, z.shape[-1])
    return torch.cat([fn(c) for c in flat.split(CHUNK_TOKENS)]).reshape(z.shape[:-1])


class TokenStats(NamedTuple):
    log_probs: torch.Tensor  # [b, R]
    entropy: Optional[torch.Tensor]  # [b, R] when asked
    sum_pi_squared: Optional[torch.Tensor]  # [b, R] when asked


def response_log_probs(logits: torch.Tensor, mb: MicroBatch, vocab_size: int, temperature: float,
                       with_entropy: bool, entropy_grad: bool = True, with_sum_pi_squared: bool = False) -> TokenStats:
    """Log-probs [b, R] of the response tokens (and entropy, sum of squared probabilities [b, R]) at
    `temperature`, vocab-parallel.

    logits: this tp rank's [b, L, V/tp]. Outputs are 0 at positions outside the attention mask.
    entropy_grad=False computes the entropy as a metric only (no autograd graph over [b, R, V/tp]).
    """
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    z = gather_response(logits, mb).float()
    if temperature != 1.0:
        z = z / temperature  # exactly what the rollout samples from: softmax(logits / T)
    z = mask_vocab_padding(z, vocab_size)
    valid = mb.resp_valid
    entropy = spsq = None
    if with_entropy and entropy_grad and torch.is_grad_enabled():
        entropy = vocab_parallel_entropy(z)
    elif with_entropy:
        entropy = _chunked(vocab_parallel_entropy, z.detach())
    if with_sum_pi_squared:
        spsq = torch.where(valid, _chunked(vocab_parallel_sum_pi_squared, z.detach()), torch.zeros_like(valid, dtype=z.dtype))
    # megatron's cross entropy subtracts the max from its input in place: hand it its own copy.
    logp = -vocab_parallel_cross_entropy(z.clone() if with_entropy or with_sum_pi_squared else z, mb.responses)
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    if entropy is not None:
        entropy = torch.where(valid, entropy, torch.zeros_like(entropy))
    return TokenStats(logp, entropy, spsq)
