"""Batches in verl's padded layout -> megatron micro-batches -> per-response-token outputs.

Why re-align: verl batches are left-padded prompts + right-padded responses with HF position_ids,
but megatron's RoPE (local and TE specs) uses positions 0..s-1 and a plain causal mask. Moving each
row's contiguous valid tokens to the front makes RoPE positions equal HF's position_ids and keeps
padding after every real token, where a causal mask never lets real tokens see it; rows are then
trimmed to the longest one in the micro-batch. Exact for any contiguous attention_mask (checked).

Packed (`use_remove_padding`, `pack_thd`): the rows' valid tokens are concatenated into ONE sequence
[1, T] in megatron's THD format; cu_seqlens marks where each row starts, attention stays inside each
row (TE's varlen kernels; attention.py on the local spec) and RoPE restarts at every row (megatron
applies it per cu_seqlens segment), so every token sees exactly what it sees in the padded layout,
without computing on padding.

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
    # Packed (THD) micro-batches only: input_ids/position_ids are [1, T] and resp_index indexes T.
    cu_seqlens: Optional[torch.Tensor] = None  # [segments + 1] int32 cumulative lengths of the rows (then padding)
    cu_seqlens_padded: Optional[torch.Tensor] = None  # where each segment starts in T when rows are padded (cp)
    max_seqlen: int = 0
    cp_size: int = 1  # > 1: this rank holds 1/cp of every sequence (split_for_cp); outputs are summed over cp

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None

    def packed_seq_params(self):
        """megatron's PackedSeqParams for a packed micro-batch (None for the padded layout)."""
        if self.cu_seqlens is None:
            return None
        from megatron.core.packed_seq_params import PackedSeqParams

        return PackedSeqParams(qkv_format="thd", cu_seqlens_q=self.cu_seqlens, cu_seqlens_kv=self.cu_seqlens,
                               cu_seqlens_q_padded=self.cu_seqlens_padded, cu_seqlens_kv_padded=self.cu_seqlens_padded,
                               max_seqlen_q=self.max_seqlen, max_seqlen_kv=self.max_seqlen)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, responses: torch.Tensor,
         rows: torch.Tensor, extras: Optional[dict[str, torch.Tensor]] = None, multiple: int = 1) -> MicroBatch:
    """Re-align a [b, T] left/right-padded batch whose last R columns are the response."""
    b, T = input_ids.shape
    start, lengths = _spans(attention_mask)
    L = max(int(lengths.max()), 1)
    L = -(-L // multiple) * multiple
    pos = torch.arange(L, device=attention_mask.device)
    src = (start[:, None] + pos[None]).clamp(max=T - 1)
    packed = torch.where(pos[None] < lengths[:, None], input_ids.gather(1, src), torch.zeros_like(src))
    resp_pos, valid = _response_positions(start, lengths, T, responses.shape[1])
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


def pack_thd(input_ids: torch.Tensor, attention_mask: torch.Tensor, responses: torch.Tensor, rows: torch.Tensor,
             extras: Optional[dict[str, torch.Tensor]] = None, multiple: int = 1, align: int = 1) -> MicroBatch:
    """The rows' valid tokens back to back as one [1, T] sequence (THD) with cu_seqlens at the row starts.

    Each row gets a slot of its length rounded up to `align` (context parallelism splits every sequence
    2*cp ways; then cu_seqlens_padded gives the slots). T is rounded up to `multiple` (sequence parallelism
    splits T over tp) with padding tokens that form one more segment of their own, so no real token
    attends to them.
    """
    b, cols = input_ids.shape
    start, lengths = _spans(attention_mask)
    slots = -(-lengths // align) * align
    offsets = torch.cumsum(slots, 0) - slots  # where row i starts in T
    used = int(slots.sum())
    T = max(-(-used // multiple) * multiple, 1)
    total = int(lengths.sum())
    row_of = torch.repeat_interleave(torch.arange(b, device=lengths.device), lengths)
    pos = torch.arange(total, device=lengths.device) - (torch.cumsum(lengths, 0) - lengths)[row_of]  # inside its row
    ids = input_ids.new_zeros(1, T)
    ids[0, offsets[row_of] + pos] = input_ids[row_of, start[row_of] + pos]
    positions = torch.zeros(1, T, dtype=torch.long, device=lengths.device)
    positions[0, offsets[row_of] + pos] = pos
    tail = [lengths.new_tensor([T - used])] if T > used else []
    real = torch.cat([lengths.new_zeros(1), torch.cumsum(torch.cat([lengths] + tail), 0)])
    padded = torch.cat([lengths.new_zeros(1), torch.cumsum(torch.cat([slots] + tail), 0)])
    resp_pos, valid = _response_positions(start, lengths, cols, responses.shape[1])
    padding = torch.ones(1, T, dtype=torch.bool, device=lengths.device)
    padding[0, offsets[row_of] + pos] = False  # slot and tail padding: routed, but out of MoE router losses
    dev = compat.device()
    return MicroBatch(
        input_ids=ids.to(dev),
        position_ids=positions.to(dev),
        resp_index=(offsets[:, None] + resp_pos - 1).clamp(0, T - 1).to(dev),
        resp_valid=valid.to(dev),
        responses=responses.to(dev),
        extras={k: v.to(dev) for k, v in (extras or {}).items()},
        rows=rows,
        padding_mask=padding.to(dev),
        cu_seqlens=real.to(device=dev, dtype=torch.int32),
        cu_seqlens_padded=padded.to(device=dev, dtype=torch.int32) if align > 1 else None,
        max_seqlen=int((padded[1:] - padded[:-1]).max()),
    )


def split_for_cp(mb: MicroBatch, rank: int, size: int) -> MicroBatch:
    """This context-parallel rank's share of a micro-batch, as megatron / TE lay it out: every sequence
    (each padded row, or each THD slot) is cut into 2*size equal chunks and rank r keeps chunks r and
    2*size-1-r (balancing causal attention work). Lengths must already be multiples of 2*size. Response
    positions this rank does not hold become invalid here; the per-token outputs are summed over cp
    (sum_over_cp), where each token is counted by exactly one rank."""
    if size == 1:
        return mb
    if mb.packed:
        bounds = (mb.cu_seqlens if mb.cu_seqlens_padded is None else mb.cu_seqlens_padded).tolist()
        spans = list(zip(bounds[:-1], bounds[1:]))
    else:
        spans = [(0, mb.input_ids.shape[1])]
    keep = torch.cat([_cp_chunks(a, b, rank, size) for a, b in spans]).to(mb.input_ids.device)
    local = torch.full((mb.input_ids.shape[1],), -1, dtype=torch.long, device=keep.device)
    local[keep] = torch.arange(len(keep), device=keep.device)
    at = local[mb.resp_index]
    return MicroBatch(input_ids=mb.input_ids[:, keep], position_ids=mb.position_ids[:, keep],
                      resp_index=at.clamp(min=0), resp_valid=mb.resp_valid & (at >= 0), responses=mb.responses,
                      extras=mb.extras, rows=mb.rows,
                      padding_mask=None if mb.padding_mask is None else mb.padding_mask[:, keep],
                      cu_seqlens=mb.cu_seqlens, cu_seqlens_padded=mb.cu_seqlens_padded,
                      max_seqlen=mb.max_seqlen, cp_size=size)


def _cp_chunks(start: int, stop: int, rank: int, size: int) -> torch.Tensor:
    n = (stop - start) // (2 * size)
    if n * 2 * size != stop - start:
        raise AssertionError(f"sequence of {stop - start} tokens is not a multiple of 2*context_parallel_size={2 * size}")
    first, second = start + rank * n, start + (2 * size - 1 - rank) * n
    return torch.cat([torch.arange(first, first + n), torch.arange(second, second + n)])


def sum_over_cp(t: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """Per-token outputs [b, R] computed from this cp rank's tokens (0 elsewhere) -> the full tensor on every
    cp rank. The backward is the identity: each rank's gradient flows back through its own tokens only,
    and megatron sums parameter gradients over the cp ranks."""
    if mb.cp_size == 1:
        return t
    return _SumOverCP.apply(t)


class _SumOverCP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        from megatron.core import parallel_state as ps

        out = t.clone()
        torch.distributed.all_reduce(out, group=ps.get_context_parallel_group())
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


def _spans(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first valid column, number of valid tokens) of each row; rejects masks with holes."""
    mask = attention_mask.bool()
    lengths = mask.sum(1)
    start = torch.where(lengths > 0, mask.float().argmax(1), torch.zeros_like(lengths))
    ar = torch.arange(mask.shape[1], device=mask.device)
    contiguous = (mask == ((ar >= start[:, None]) & (ar < (start + lengths)[:, None]))).all(1)
    if not bool(contiguous.all()):
        bad = torch.nonzero(~contiguous).flatten().tolist()
        raise ValueError(f"attention_mask rows {bad} have holes; the megatron adapter needs one contiguous run of "
                         "1s per row (left-padded prompt + response)")
    return start, lengths


def _response_positions(start: torch.Tensor, lengths: torch.Tensor, cols: int, R: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position of response token j inside its re-aligned row [b, R], and whether it is a real token that
    some earlier token predicts (the response is the last R of the batch's `cols` columns)."""
    j = torch.arange(R, device=start.device)
    resp_pos = (cols - R) + j[None] - start[:, None]
    return resp_pos, (resp_pos >= 1) & (resp_pos < lengths[:, None])


def gather_response(out: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """[b, L, X] model outputs at the positions predicting each response token -> [b, R, X]
    (packed: [1, T, X], one flat index per response token)."""
    if mb.packed:
        return out[0][mb.resp_index]
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
        spsq = _chunked(vocab_parallel_sum_pi_squared, z.detach())
        spsq = sum_over_cp(torch.where(valid, spsq, torch.zeros_like(spsq)), mb)
    # megatron's cross entropy subtracts the max from its input in place: hand it its own copy.
    logp = -vocab_parallel_cross_entropy(z.clone() if with_entropy or with_sum_pi_squared else z, mb.responses)
    logp = sum_over_cp(torch.where(valid, logp, torch.zeros_like(logp)), mb)
    if entropy is not None:
        entropy = sum_over_cp(torch.where(valid, entropy, torch.zeros_like(entropy)), mb)
    return TokenStats(logp, entropy, spsq)
