"""The cross-GPU direct copy: engine weights filled from actor shards that other ranks hold.

The local direct copy (direct.py) needs each piece of the engine's shard on the rank that trains it. When the
layouts differ (rollout tp_g below the training tp, pipeline stages, expert parallel) a rank's engine also needs
pieces held elsewhere: for tp2 -> tp_g1 the tp peer's halves, for pp2 -> tp_g2 the other stage's layers (only
this rank's tp_g block of them). The bucketed export instead sends every rank full HF tensors of every weight,
which the engine then cuts and re-fuses in its per-tensor loaders; here each rank receives only the bytes of its
engine shard that it does not hold, straight into the engine's own views.

Plan (once per run, after the first sync went the bucketed way; collective over the default group):
  1. every rank's region metadata (a WeightPiece, the dtype, how finely the source view can be narrowed) goes to
     every rank;
  2. each rank asks its engine where every distinct piece lands (RolloutEngine.piece_views): the part of its own
     pieces becomes local copy pairs (run by direct.DirectCopy), the rest are needs;
  3. every rank's needs go to every rank; each assigns every need to a holder (fewest bytes sent so far, then the
     lowest rank: data-parallel copies share the sending) and cuts the transfers into rounds in which no rank
     stages more than half of `bucket_bytes` (its sends plus its receives). All ranks compute the same plan;
  4. proof: one exchange whose received pieces must equal what the engine got from load_weights, bitwise, as
     the local pairs must; an engine group (e.g. vLLM's fused qkv) failing anywhere streams through the export
     everywhere (the export is collective: every rank must ask it for the same names).
With `zero_copy` (off by default), zero-copy transfers go first: a piece whose source view and engine view are
both contiguous and of one dtype goes straight from the actor's storage into the engine's (batch_isend_irecv of
the views themselves, no staging). The idea: NCCL moved a pair's 384 MiB at 326 GB/s as one message. Measured on
4 x H200 (7B, tp2 -> tp_g1 x dp_g4, same machine, back to back) it lost: 67.6 ms with 4.9 of the 7.6 GB view to
view, 56.7 ms all staged, so staged is the default. Both ends must agree that a transfer qualifies, so the plan
gathers every rank's verdict. The rest go in staged rounds: the owner packs its outgoing pieces into one
staging buffer (one _foreach_copy_), the messages go out with batch_isend_irecv (NCCL p2p on GPU, gloo on CPU),
and the received bytes land in the engine's views (one _foreach_copy_). Rounds alternate between two staging
buffers, so one round's copies overlap
the other's messages; a round stages at most half of `bucket_bytes` (unless one piece alone is larger), so both
buffers together stay within it, and none is alive after the sync.
Check (sampled as checks.py picks): the senders' float64 sums of what they sent against the receivers' sums of
what landed, exchanged the same way, in the plan's transfer order on both ends.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from hybridrl.adapters.base import WeightRegion
from hybridrl.rollout.base import RolloutEngine, WeightPiece, shaped_view

from .checks import WeightSyncError, is_sampled, tensor_abs_sum, tensor_checksum
from .direct import CopyPair

log = logging.getLogger(__name__)
ALIGN = 16  # bytes: every staged piece starts aligned, so its dtype view is legal and copies vectorize
# |sender sum - receiver sum| allowed, times the sum of magnitudes: both sum the same values, but a GPU reduction's
# order may follow the pointer's alignment; a stale or misplaced piece moves the sum by far more
CHECK_RTOL = 1e-12
ZERO_COPY_OPS = 64  # zero-copy transfers (of the plan's list) per batch_isend_irecv: every rank cuts it alike


@dataclass(frozen=True)
class PieceMeta:
    """What every rank learns of one region of another rank."""

    piece: WeightPiece
    dtype: torch.dtype
    grain: int  # HF indices per step of the source view along its narrowable dim; 0: only sent whole


@dataclass(frozen=True)
class Transfer:
    src: int  # sending rank
    dst: int  # receiving rank
    piece: int  # index into the plan's distinct pieces
    lo: int  # HF indices [lo, hi) of the piece along its dim
    hi: int
    nbytes: int  # staged in the sender's dtype
    src_dtype: torch.dtype
    dst_dtype: torch.dtype  # the engine's: the check sums what the engine holds


@dataclass
class _Round:
    """One round as this rank sees it: its messages and where its pieces sit in the staging buffer."""

    size: int = 0
    messages: list = field(default_factory=list)  # (is_send, peer, offset, nbytes)
    pack: list = field(default_factory=list)  # (offset, source view): what this rank sends
    unpack: list = field(default_factory=list)  # (offset, engine view, transfer index): what it receives


# ------------------------------------------------------------------------------------------ the copy
class RemoteCopy:
    """The cross-GPU transfers of one run (the same list on every rank); `run()` performs this rank's part."""

    def __init__(self, pieces: list[WeightPiece], transfers: list[Transfer], sources: dict[int, WeightRegion],
                 views: dict[int, torch.Tensor], group_of: Callable[[str], str], bucket_bytes: int,
                 device: torch.device, zero_copy: frozenset[int] = frozenset()) -> None:
        self.rank = dist.get_rank()
        self.pieces, self.transfers, self.device = pieces, transfers, device
        self._sources = sources  # piece index -> this rank's region (what it sends from)
        self._views = views  # transfer index -> the engine's view it lands in (this rank's receives)
        self.groups = [group_of(pieces[t.piece].name) for t in transfers]
        self.names = {pieces[t.piece].name for t in transfers if self.rank in (t.src, t.dst)}
        self.recv_bytes = sum(t.nbytes for t in transfers if t.dst == self.rank)
        self.sent_bytes = sum(t.nbytes for t in transfers if t.src == self.rank)
        # the same list on every rank (plan order): straight from the source view into the engine's
        self.zero_copy = sorted(zero_copy)
        self.zero_copy_bytes = sum(transfers[j].nbytes for j in self.zero_copy if transfers[j].dst == self.rank)
        staged = [j for j in range(len(transfers)) if j not in zero_copy]
        # half the budget a round: run() keeps two rounds' staging alive at once
        rounds = [self._local([staged[k] for k in r], views)
                  for r in _rounds([transfers[j] for j in staged], max(1, bucket_bytes // 2))]
        self.rounds = [r for r in rounds if r.messages]
        # run()'s two buffers, even and odd rounds: each as large as its largest round
        self.buffer_bytes = [max((r.size for r in self.rounds[k::2]), default=0) for k in range(2)]
        self.staging_bytes = sum(self.buffer_bytes)

    def _local(self, indices: list[int], views: dict[int, torch.Tensor]) -> _Round:
        """This rank's part of one round: per peer one message out and one in, pieces in transfer order."""
        rnd = _Round()
        by_peer: dict[tuple[int, bool], list[int]] = defaultdict(list)
        for i in indices:
            t = self.transfers[i]
            if t.src == self.rank:
                by_peer[(t.dst, True)].append(i)
            elif t.dst == self.rank:
                by_peer[(t.src, False)].append(i)
        for peer, is_send in sorted(by_peer):
            start = rnd.size
            for i in by_peer[(peer, is_send)]:
                t = self.transfers[i]
                if is_send:
                    rnd.pack.append((rnd.size, self._source(i)))
                else:
                    rnd.unpack.append((rnd.size, views[i], i))
                rnd.size += _aligned(t.nbytes)
            rnd.messages.append((is_send, peer, start, rnd.size - start))
        return rnd

    def _source(self, i: int) -> torch.Tensor:
        t = self.transfers[i]
        return _narrow(self._sources[t.piece], t.lo, t.hi)

    @torch.no_grad()
    def run(self, compare: bool = False) -> set[int]:
        """Every round: pack, exchange, unpack. `compare` (the proof): leave the engine alone and return the
        transfers whose received values differ from what the engine holds.

        Two staging buffers take turns, so the device copies of one round (packing the next, unpacking the last)
        run while the other round's messages are on the wire; round k's buffer is reused by round k + 2 only
        after round k has landed (its messages waited for, its pieces copied out on this stream)."""
        failed: set[int] = set()
        if compare and self.zero_copy:
            raise ValueError("the proof compares staged pieces: build it without zero-copy transfers")
        direct = self._start_zero_copy()  # on NCCL's stream ahead of the staged rounds, waited for at the end
        bufs = [torch.empty(n, dtype=torch.uint8, device=self.device) for n in self.buffer_bytes if n]
        in_flight: Optional[tuple[_Round, torch.Tensor, list]] = None
        for k, rnd in enumerate(self.rounds):
            buf = bufs[k % len(bufs)]
            if rnd.pack:
                torch._foreach_copy_([_at(buf, o, s.dtype, s.shape) for o, s in rnd.pack], [s for _, s in rnd.pack])
            works = _start(buf, rnd.messages)
            if in_flight is not None:
                failed |= self._land(*in_flight, compare)
            in_flight = (rnd, buf, works)
        if in_flight is not None:
            failed |= self._land(*in_flight, compare)
        for work in direct:
            work.wait()
        del bufs, in_flight  # before the KV cache wakes: the staging is the sync's only extra memory
        return failed

    def _start_zero_copy(self) -> list:
        """This rank's zero-copy sends and receives posted, ZERO_COPY_OPS transfers of the plan's list a group
        (each pair of ranks then posts its messages in the same order); the works to wait for."""
        works = []
        for k in range(0, len(self.zero_copy), ZERO_COPY_OPS):
            ops = []
            for j in self.zero_copy[k:k + ZERO_COPY_OPS]:
                t = self.transfers[j]
                if t.src == self.rank:
                    ops.append(dist.P2POp(dist.isend, self._source(j), t.dst))
                elif t.dst == self.rank:
                    ops.append(dist.P2POp(dist.irecv, self._views[j], t.src))
            if ops:
                works += dist.batch_isend_irecv(ops)
        return works

    def _land(self, rnd: _Round, buf: torch.Tensor, works: list, compare: bool) -> set[int]:
        """Wait for one round's messages, then copy what it received into the engine (or compare, for the proof)."""
        for work in works:
            work.wait()
        staged = [(v, _at(buf, o, self.transfers[i].src_dtype, v.shape), i) for o, v, i in rnd.unpack]
        if compare:
            return {i for v, got, i in staged if not torch.equal(v, got.to(v.dtype))}
        if staged:
            torch._foreach_copy_([v for v, _, _ in staged], [got for _, got, _ in staged])
        return set()

    @torch.no_grad()
    def check(self, step: int, fraction: float) -> dict[str, float]:
        """Sampled transfers: the receiver's sum of the engine's view equals the sender's sum of its source."""
        sums: dict[int, list[torch.Tensor]] = defaultdict(list)  # peer -> [sum, abs sum, ...] in plan order
        expect: dict[int, list[int]] = defaultdict(list)  # peer -> transfer indices, same order
        views: dict[int, torch.Tensor] = {}
        for i, t in enumerate(self.transfers):
            if self.rank not in (t.src, t.dst) or not is_sampled(self.groups[i], step, fraction):
                continue
            if t.src == self.rank:
                flat = self._source(i).to(t.dst_dtype)
                sums[t.dst] += [tensor_checksum(flat), tensor_abs_sum(flat)]
            else:
                expect[t.src].append(i)
                views[i] = self._views[i]
        recv = {p: torch.empty(2 * len(ids), dtype=torch.float64, device=self.device) for p, ids in expect.items()}
        _batch([dist.P2POp(dist.isend, torch.stack(v), p) for p, v in sums.items()]
               + [dist.P2POp(dist.irecv, t, p) for p, t in recv.items()])
        if not views:
            return {"sync_check/remote_checked": 0.0}
        order = [i for p in expect for i in expect[p]]
        sent = torch.cat([recv[p] for p in expect]).view(-1, 2).cpu().tolist()
        got = torch.stack([tensor_checksum(views[i]) for i in order]).cpu().tolist()
        for i, (total, scale), mine in zip(order, sent, got):
            if not abs(mine - total) <= CHECK_RTOL * scale:  # `not <=`: a NaN fails too
                t = self.transfers[i]
                raise WeightSyncError(
                    f"weight check at step {step}: the cross-GPU copy of {self.pieces[t.piece].name!r} "
                    f"[{t.lo}:{t.hi}] from rank {t.src} did not land on rank {t.dst}: engine sum {mine!r} vs sender "
                    f"sum {total!r}. Set actor_rollout_ref.rollout.direct_weight_copy=false to stream through "
                    f"load_weights instead")
        return {"sync_check/remote_checked": float(len(order))}


# ------------------------------------------------------------------------------------------ the plan
def plan_remote(regions: Sequence[WeightRegion], engine: RolloutEngine, skip: set[str],
                group_of: Callable[[str], str], bucket_bytes: int,
                zero_copy: bool = True) -> tuple[list[CopyPair], Optional[RemoteCopy]]:
    """After a bucketed sync: (local copy pairs, cross-GPU transfers), proven bitwise on every rank, for the
    weights not in `skip` that the engine can place; with `zero_copy`, the transfers whose two ends allow it go
    view to view. Collective over the default group (every rank calls it)."""
    rank = dist.get_rank()
    mine = [r for r in regions if r.name not in skip]
    pieces, holders, meta = _distinct(_all_gather([PieceMeta(_piece(r), r.src.dtype, _grain(r)) for r in mine]))
    own = {_key(r): r for r in mine}
    failed: set[str] = set()
    local, needs = [], {}
    for index, (piece, pv) in enumerate(zip(pieces, engine.piece_views(pieces))):
        if pv is None or not _fits(meta[index], pv.lo, pv.hi):
            failed.add(group_of(piece.name))
        elif pv.hi > pv.lo and _key(piece) in own:  # this rank holds it: a local copy, proven here
            src = _narrow(own[_key(piece)], pv.lo, pv.hi)
            dst = shaped_view(pv.view, src.shape)
            if dst is None or not torch.equal(dst, src.to(dst.dtype)):
                failed.add(group_of(piece.name))
            else:
                local.append(CopyPair(piece.name, dst, src))
        elif pv.hi > pv.lo:
            needs[(index, pv.lo, pv.hi)] = pv.view
    transfers = _assign(_all_gather([(*k, v.dtype) for k, v in needs.items()]), pieces, holders, meta)
    sources = {t.piece: own[_key(pieces[t.piece])] for t in transfers if t.src == rank}
    device = regions[0].src.device if regions else torch.device("cpu")

    def build(chosen: list[Transfer], direct: frozenset[Transfer] = frozenset()) -> RemoteCopy:
        views = {j: needs[(t.piece, t.lo, t.hi)] for j, t in enumerate(chosen) if t.dst == rank}
        return RemoteCopy(pieces, chosen, sources, views, group_of, bucket_bytes, device,
                          frozenset(j for j, t in enumerate(chosen) if t in direct))

    proof = build(transfers)  # staged: it compares what arrives with what the engine got from load_weights
    failed |= {proof.groups[j] for j in proof.run(compare=True)}
    failed = set().union(*_all_gather(failed))  # the export is collective: a group fails everywhere or nowhere
    local = [p for p in local if group_of(p.name) not in failed]
    direct = _zero_copy_ok(transfers, sources, needs, rank) if zero_copy else frozenset()
    remote = build([t for j, t in enumerate(transfers) if proof.groups[j] not in failed], direct)
    log.info("cross-GPU weight copy: %d transfers, %d of them view to view, the rest in %d rounds; this rank "
             "receives %.1f MiB (%.1f MiB view to view), sends %.1f MiB, stages at most %.1f MiB; %d engine groups "
             "stay with the export", len(remote.transfers), len(remote.zero_copy), len(remote.rounds),
             remote.recv_bytes / 2**20, remote.zero_copy_bytes / 2**20, remote.sent_bytes / 2**20,
             remote.staging_bytes / 2**20, len(failed))
    return local, (remote if remote.transfers else None)


def _zero_copy_ok(transfers: list[Transfer], sources: dict[int, WeightRegion], needs: dict[tuple, torch.Tensor],
                  rank: int) -> frozenset[Transfer]:
    """The transfers both ends can run view to view: one dtype, the sender's narrowed source and the receiver's
    engine view contiguous and of the transfer's size. Each rank judges its own ends; the verdicts are gathered
    (collective), so every rank holds the same set."""
    bad = set()
    for j, t in enumerate(transfers):
        if t.src_dtype != t.dst_dtype:
            bad.add(j)
        elif t.src == rank and not _fits_message(_narrow(sources[t.piece], t.lo, t.hi), t):
            bad.add(j)
        elif t.dst == rank and not _fits_message(needs[(t.piece, t.lo, t.hi)], t):
            bad.add(j)
    bad = set().union(*_all_gather(bad))
    return frozenset(t for j, t in enumerate(transfers) if j not in bad)


def _fits_message(view: torch.Tensor, t: Transfer) -> bool:
    return view.is_contiguous() and view.dtype == t.src_dtype and view.numel() * view.element_size() == t.nbytes


def _piece(r: WeightRegion) -> WeightPiece:
    return WeightPiece(r.name, r.dim, r.start, r.stop, _hf_shape(r))


def _hf_shape(r: WeightRegion) -> tuple[int, ...]:
    """The full HF shape, from the region (1-D or 2-D weights; a 2-D weight of width 1 reads as 1-D, and the
    engine then finds no view of that shape: it keeps streaming, never a wrong copy)."""
    n = r.stop - r.start
    rest = r.src.numel() // n
    if rest == 1:
        return (r.extent,)
    return (r.extent, rest) if r.dim == 0 else (rest, r.extent)


def _key(x) -> tuple[str, int, int, int]:
    return x.name, x.dim, x.start, x.stop


def _grain(r: WeightRegion) -> int:
    """How finely r.src narrows as a view along the piece's dim: each step of src's dim 0 (or of dim 1 of a
    2-D source cut along HF dim 1) is `grain` HF indices; 0: only the whole region. A source's elements are the
    HF piece's in C order whatever its strides, so a block of its leading index is a block of HF rows."""
    n = r.stop - r.start
    if r.dim == 0 and r.src.dim() >= 1 and n % r.src.shape[0] == 0:
        return n // r.src.shape[0]
    if r.dim == 1 and r.src.dim() == 2 and r.src.shape[1] == n:
        return 1
    return 0


def _fits(meta: PieceMeta, lo: int, hi: int) -> bool:
    p = meta.piece
    if (lo, hi) == (p.start, p.stop):
        return True
    return meta.grain > 0 and (lo - p.start) % meta.grain == 0 and (hi - p.start) % meta.grain == 0


def _narrow(r: WeightRegion, lo: int, hi: int) -> torch.Tensor:
    """The view of r.src holding HF indices [lo, hi) along r.dim (checked by _fits)."""
    if (lo, hi) == (r.start, r.stop):
        return r.src
    g = _grain(r)
    return r.src.narrow(0 if r.dim == 0 else 1, (lo - r.start) // g, (hi - lo) // g)


def _distinct(metas: list[list[PieceMeta]]) -> tuple[list[WeightPiece], dict[int, list[int]], list[PieceMeta]]:
    """Every distinct piece once (rank order, then each rank's order: the same list everywhere), who holds it
    (data-parallel copies hold the same pieces) and its metadata."""
    index: dict[tuple, int] = {}
    pieces, holders, meta = [], defaultdict(list), []
    for rank, rank_metas in enumerate(metas):
        for m in rank_metas:
            key = _key(m.piece)
            if key not in index:
                index[key] = len(pieces)
                pieces.append(m.piece)
                meta.append(m)
            holders[index[key]].append(rank)
    return pieces, holders, meta


def _assign(needs: list[list[tuple]], pieces: list[WeightPiece], holders: dict[int, list[int]],
            meta: list[PieceMeta]) -> list[Transfer]:
    """Each rank's needs -> transfers from the holder that has sent the fewest bytes so far (then the lowest rank)."""
    load: dict[int, int] = defaultdict(int)
    out = []
    for dst, rank_needs in enumerate(needs):
        for i, lo, hi, dst_dtype in rank_needs:
            src = min((h for h in holders[i] if h != dst), key=lambda h: (load[h], h))
            numel = 1
            for s in pieces[i].narrowed(lo, hi):
                numel *= s
            nbytes = numel * meta[i].dtype.itemsize
            load[src] += nbytes
            out.append(Transfer(src, dst, i, lo, hi, nbytes, meta[i].dtype, dst_dtype))
    return out


def _rounds(transfers: list[Transfer], budget: int) -> list[list[int]]:
    """Transfer indices per round, first fit: no rank stages more than `budget` bytes (sends + receives) in a
    round, unless one piece alone is larger (it then gets a round of its own)."""
    rounds: list[list[int]] = []
    used: list[dict[int, int]] = []
    for j, t in enumerate(transfers):
        need = _aligned(t.nbytes)
        k = next((k for k, u in enumerate(used) if u[t.src] + need <= budget and u[t.dst] + need <= budget), None)
        if k is None:
            rounds.append([])
            used.append(defaultdict(int))
            k = len(rounds) - 1
        rounds[k].append(j)
        used[k][t.src] += need
        used[k][t.dst] += need
    return rounds


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _at(buf: torch.Tensor, offset: int, dtype: torch.dtype, shape: torch.Size) -> torch.Tensor:
    numel = 1
    for s in shape:
        numel *= s
    return buf.narrow(0, offset, numel * dtype.itemsize).view(dtype).view(shape)


def _start(buf: torch.Tensor, messages: list[tuple[bool, int, int, int]]) -> list:
    """One round's messages posted (NCCL: queued behind this stream's packing); the works to wait for."""
    ops = [dist.P2POp(dist.isend if is_send else dist.irecv, buf.narrow(0, o, n), peer) for is_send, peer, o, n in messages]
    return list(dist.batch_isend_irecv(ops)) if ops else []


def _batch(ops: list) -> None:
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def _all_gather(obj) -> list:
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
