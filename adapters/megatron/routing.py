"""Mixture-of-experts routing measured against the rollout's: agreement (a metric) and replay (R3).

With actor_rollout_ref.rollout.enable_rollout_routing_replay the rollout engine returns `routed_experts`
[B, T, layers, k] (int16, -1 where no forward pass routed the token) in the batch's input_ids layout. A
micro-batch reaches megatron re-aligned by forward.pack (each row's valid tokens first); a router sees its
[s, b] tokens flattened sequence-major, under sequence parallelism only this tp rank's s/tp positions.

Agreement: a forward hook on every router recomputes the router's own top-k from its input (its gating
logits; top-k of the logits is top-k of their softmax, and these families route without expert bias or
groups) and compares the set with the rollout's, per token and layer. Per response token the agreeing and
the known layers are counted, summed over sequence-parallel ranks and pipeline stages. The hook measures the
router's own choice, so it reports the same thing with replay on.
Replay (actor.router_replay.mode=R3): megatron-core 0.16.1's RouterReplay (moe_enable_routing_replay) in
REPLAY_FORWARD: before each micro-batch's forward every router is handed the rollout's experts for its
layer and tokens; megatron then weighs them with its own probabilities (gathered at those experts), so the
gradient still flows through the router. Unknown ids (padding, a row's last token, which no later position
reads) replay experts 0..k-1.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch

from hybridrl.protocol import DataProto

from .builder import unwrap
from .forward import MicroBatch

KEY = "routed_experts"


class Routing:
    """The routers of this rank's model chunks; `session` wraps one log-prob or update pass."""

    def __init__(self, chunks: list[torch.nn.Module], replay: bool) -> None:
        from megatron.core.transformer.moe.router import Router

        self.routers = [m for c in chunks for m in unwrap(c).modules() if isinstance(m, Router)]
        self.replay = replay
        if replay and any(getattr(r, "router_replay", None) is None for r in self.routers):
            raise AssertionError("router replay: the routers were built without moe_enable_routing_replay")
        for router in self.routers:
            router.register_forward_hook(self._compare)
        self._session: Optional[_Session] = None

    @contextlib.contextmanager
    def session(self, data: DataProto, measure: bool) -> Iterator[Optional["_Session"]]:
        """During the block, `prepare(mb)` (the engine calls it before each micro-batch's forward) replays
        and/or measures. Yields None when the batch has no rollout routing (and replay is off)."""
        if KEY not in data.batch:
            if self.replay:
                raise KeyError(f"actor.router_replay.mode=R3 but the batch has no {KEY!r}: the rollout must record "
                               "routing (actor_rollout_ref.rollout.enable_rollout_routing_replay=true)")
            yield None
            return
        self._session = _Session(data, bool(self.routers) and measure)
        try:
            yield self._session
        finally:
            self._session = None
            for router in self.routers if self.replay else []:
                router.router_replay.clear_indices()
                router.router_replay.clear_router_replay_action()

    def prepare(self, mb: MicroBatch) -> None:
        session = self._session
        if session is None:
            return
        session.current = mb
        session.aligned = _align(session.routed, session.mask, mb)
        if not self.replay:
            return
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for router in self.routers:
            ids = _local(session.aligned, router.layer_number - 1, router.config)  # [s_local, b, k]
            k = ids.shape[-1]
            ids = torch.where(ids < 0, torch.arange(k, device=ids.device), ids).reshape(-1, k)
            router.router_replay.clear_indices()
            router.router_replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
            router.router_replay.set_target_indices(ids)

    def _compare(self, router: torch.nn.Module, inputs: tuple, output: Any) -> None:
        session = self._session
        if session is None or not session.measure or session.current is None:
            return
        with torch.no_grad():
            hidden = inputs[0]  # [s_local, b, h]
            logits = router.gating(hidden).reshape(-1, router.config.num_moe_experts)
            mine = torch.zeros_like(logits, dtype=torch.bool)
            mine.scatter_(1, logits.topk(router.config.moe_router_topk, dim=-1).indices, True)
            theirs = _local(session.aligned, router.layer_number - 1, router.config)  # [s_local, b, k]
            theirs = theirs.reshape(-1, theirs.shape[-1])
            known = (theirs >= 0).all(-1)
            agree = mine.gather(1, theirs.clamp(min=0)).all(-1) & known
            session.add(router.config, agree.view(hidden.shape[:2]), known.view(hidden.shape[:2]))


class _Session:
    def __init__(self, data: DataProto, measure: bool) -> None:
        self.routed = data.batch[KEY]
        self.mask = data.batch["attention_mask"]
        self.measure = measure
        shape = tuple(data.batch["responses"].shape)
        self.agree = torch.zeros(shape, dtype=torch.float64)  # [B, R] agreeing layers per response token
        self.known = torch.zeros(shape, dtype=torch.float64)  # [B, R] layers whose rollout routing is known
        self.current: Optional[MicroBatch] = None
        self.aligned: Optional[torch.Tensor] = None

    def add(self, config: Any, agree: torch.Tensor, known: torch.Tensor) -> None:
        """Count this router's agreement at the response tokens' own positions (in this rank's shard)."""
        from megatron.core import parallel_state as ps

        mb = self.current
        seq = mb.input_ids.shape[1]
        offset = ps.get_tensor_model_parallel_rank() * agree.shape[0] if config.sequence_parallel else 0
        if not config.sequence_parallel and ps.get_tensor_model_parallel_rank() > 0:
            return  # every tp rank saw every token: count them once
        full = torch.zeros(2, seq, agree.shape[1], dtype=torch.float64, device=agree.device)
        full[0, offset:offset + agree.shape[0]] = agree.double()
        full[1, offset:offset + agree.shape[0]] = known.double()
        own = (mb.resp_index + 1).clamp(max=seq - 1)  # [b, R] packed position of each response token
        counts = full.permute(0, 2, 1).gather(2, own[None].expand(2, -1, -1)).cpu()  # [2, b, R]
        counts *= mb.resp_valid.cpu()
        self.agree[mb.rows] += counts[0]
        self.known[mb.rows] += counts[1]

    def result(self) -> torch.Tensor:
        """[B, R] fraction of layers agreeing with the rollout per response token, -1 where none is known;
        summed over sequence shards and pipeline stages (collective over tp and pp)."""
        from megatron.core import parallel_state as ps

        from . import compat

        both = torch.stack([self.agree, self.known]).to(compat.device())
        for group, size in ((ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_world_size()),
                            (ps.get_pipeline_model_parallel_group(), ps.get_pipeline_model_parallel_world_size())):
            if size > 1:
                torch.distributed.all_reduce(both, group=group)
        agree, known = both.cpu()
        return torch.where(known > 0, agree / known.clamp(min=1), torch.full_like(agree, -1.0)).float()


def _align(routed: torch.Tensor, mask: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """The rollout's ids of a micro-batch's rows in pack()'s layout: [b, L, layers, k] int64, -1 past a row."""
    rows = mb.rows
    m = mask[rows].bool()
    start = m.float().argmax(1)
    length = m.sum(1)
    seq = mb.input_ids.shape[1]
    pos = torch.arange(seq)
    src = (start[:, None] + pos[None]).clamp(max=routed.shape[1] - 1)  # [b, L]
    ids = routed[rows].long().gather(1, src[..., None, None].expand(-1, -1, *routed.shape[2:]))
    ids[pos[None].expand(len(rows), -1) >= length[:, None]] = -1
    return ids.to(mb.input_ids.device)


def _local(aligned: torch.Tensor, layer: int, config: Any) -> torch.Tensor:
    """One layer's ids as its router sees the tokens: [s, b, k], this tp rank's shard under sequence parallelism."""
    from megatron.core import parallel_state as ps

    ids = aligned[:, :, layer].transpose(0, 1)  # [L, b, k]
    if config.sequence_parallel:
        tp = ps.get_tensor_model_parallel_world_size()
        size = ids.shape[0] // tp
        ids = ids[ps.get_tensor_model_parallel_rank() * size:(ps.get_tensor_model_parallel_rank() + 1) * size]
    return ids
