"""The direct weight copy: the actor's own shards straight into the engine's weights, no export.

When the engine holds each piece of a weight on the rank that trains that piece (rollout tp_g equal
to the training tp, no pipeline stages: the usual colocated layouts), a sync needs no collective and
no HF-shaped tensors: every piece is one device copy from a view of the actor's parameter
(`ActorModel.weight_regions`) into a view of the engine's (`RolloutEngine.weight_views`).

How it is trusted: the first sync of a run goes the bucketed way (export + the engine's own
`load_weights`), then every planned destination must equal its source bitwise, and all ranks agree
on the weights that passed everywhere (a fused group, e.g. vLLM's qkv_proj, passes or fails as one).
Only those are copied directly from then on; the rest keep streaming through the export. Each later
sync checks the sampled weights' destination sums against their sources (`check`).

Speed: a sync is a few hundred copies (over a thousand for a mixture of experts: three per routed expert);
one big memcpy of the same bytes is the floor. Small dense pairs (norms, biases, most routed experts' pieces) go
through one `_foreach_copy_` (a few kernels instead of a memcpy each), the rest one copy each. On CUDA the whole
set runs as a CUDA graph, one per storage layout (the addresses of the actor's and the engine's storages).
A graph is captured for the first layout and for any layout seen before; a layout seen for the first time is
copied eagerly. Param offload re-allocates the actor's storages on every onload, often at other addresses: a
capture costs an eager copy (the warm-up), the capture itself and the replay, several times the copy, so
capturing at every move made a sync cost its capture (moe_grpo.md, 2026-11-25: 8-13 ms against 2.6 ms for the
one step whose storages stayed put). Layouts that come back (the allocator tends to hand out the same few
blocks) replay their graph; at most MAX_GRAPHS are kept.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from hybridrl.adapters.base import WeightRegion

from .checks import WeightSyncError, is_sampled, tensor_checksum

log = logging.getLogger(__name__)
MAX_GRAPHS = 4  # storage layouts with a captured graph, kept for replay
FOREACH_MAX_BYTES = 4 << 20


@dataclass(frozen=True)
class CopyPair:
    name: str  # the HF weight
    dst: torch.Tensor  # a view of the engine's weight, shaped like src
    src: torch.Tensor  # a view of the actor's parameter


class GraphLayouts:
    """Which storage layouts (tuples of storage addresses) run as a captured CUDA graph (module docstring):
    `choose(key)` says "replay", "capture" or "eager" for this sync and records the choice."""

    def __init__(self, limit: int = MAX_GRAPHS) -> None:
        self.limit = limit
        self.captured: set[tuple[int, ...]] = set()
        self.seen: set[tuple[int, ...]] = set()  # copied eagerly once

    def choose(self, key: tuple[int, ...]) -> str:
        if key in self.captured:
            return "replay"
        first = not self.captured and not self.seen
        if (first or key in self.seen) and len(self.captured) < self.limit:
            self.captured.add(key)
            return "capture"
        self.seen.add(key)
        return "eager"


class DirectCopy:
    """The proven copies of one run; `run()` performs them all."""

    def __init__(self, pairs: list[CopyPair], graph: bool = True) -> None:
        self.pairs = pairs
        self.names = {p.name for p in pairs}
        self.bytes = sum(p.dst.numel() * p.dst.element_size() for p in pairs)
        self._split_at: Optional[int] = None
        self._split_cache: tuple = (([], []), [])
        # one tensor per storage: its data_ptr moves when the storage is re-allocated (offload/onload)
        by_storage = {t.untyped_storage().data_ptr(): t for p in pairs for t in (p.dst, p.src)}
        self._storages = list(by_storage.values())
        self.reset(graph)

    def reset(self, graph: bool = True) -> None:
        """Forget the captured graphs; `graph`: run as CUDA graphs from now on (where the tensors are on CUDA)."""
        pairs = self.pairs
        self._use_graph = graph and bool(pairs) and pairs[0].dst.is_cuda and pairs[0].src.is_cuda
        self._graphs: dict[tuple[int, ...], torch.cuda.CUDAGraph] = {}
        self._layouts = GraphLayouts()
        self._warm = self._told = False
        self.last = "eager"  # what the last run did: replay | capture | eager

    @property
    def graphed(self) -> bool:
        """The last run replayed a CUDA graph (captured in that run or before)."""
        return self.last in ("replay", "capture")

    @torch.no_grad()
    def run(self) -> None:
        if not self._use_graph:
            self.last = "eager"
            self._copy()
            return
        key = tuple(t.data_ptr() for t in self._storages)
        self.last = self._layouts.choose(key)
        if self.last == "capture":
            try:
                self._graphs[key] = self._capture()
            except RuntimeError as e:  # a capture problem must not cost the run: the eager copy is the same
                log.warning("direct weight copy: CUDA graph capture failed (%s); copying eagerly", e)
                self._use_graph, self.last = False, "eager"
                self._copy()
                return
        if self.last == "eager":
            if len(self._layouts.captured) >= self._layouts.limit and not self._told:
                log.info("direct weight copy: %d storage layouts captured and the storages keep moving (param "
                         "offload?); other layouts are copied eagerly", self._layouts.limit)
                self._told = True
            self._copy()
            return
        self._graphs[key].replay()

    def _copy(self) -> None:
        small, rest = self._split()
        if small[0]:
            torch._foreach_copy_(*small)
        for p in rest:
            p.dst.copy_(p.src)

    def _split(self) -> tuple[tuple[list[torch.Tensor], list[torch.Tensor]], list[CopyPair]]:
        """Small dense pairs (norms, biases, ...) for one _foreach_copy_ (a few kernels); the rest one by one
        (large ones as memcpy, strided ones as copy kernels). Cached per threshold."""
        if self._split_at != FOREACH_MAX_BYTES:
            small = [p for p in self.pairs if _dense(p) and p.dst.numel() * p.dst.element_size() <= FOREACH_MAX_BYTES]
            chosen = {id(p) for p in small}
            self._split_cache = (([p.dst for p in small], [p.src for p in small]),
                                 [p for p in self.pairs if id(p) not in chosen])
            self._split_at = FOREACH_MAX_BYTES
        return self._split_cache

    def _capture(self) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        if not self._warm:  # warm-up outside capture, as torch recommends (once: later captures find it done)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._copy()
            torch.cuda.current_stream().wait_stream(side)
            self._warm = True
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self._copy()
        return graph

    @torch.no_grad()
    def check(self, step: int, fraction: float, group_of: Callable[[str], str]) -> dict[str, float]:
        """Sampled weights: the engine's destination sums equal the source sums (same dtype, bitwise)."""
        sampled = [p for p in self.pairs if is_sampled(group_of(p.name), step, fraction)]
        if not sampled:
            return {"sync_check/direct_checked": 0.0}
        got = torch.stack([tensor_checksum(p.dst) for p in sampled]).cpu().tolist()
        want = torch.stack([tensor_checksum(p.src.to(p.dst.dtype)) for p in sampled]).cpu().tolist()
        for p, g, w in zip(sampled, got, want):
            if g != w:
                raise WeightSyncError(
                    f"weight check at step {step}: the direct copy of {p.name!r} did not land: engine sum {g!r} vs "
                    f"actor sum {w!r}. A storage moved without the copy plan noticing; set "
                    f"actor_rollout_ref.rollout.direct_weight_copy=false to stream through load_weights instead")
        return {"sync_check/direct_checked": float(len({p.name for p in sampled}))}


def _dense(p: CopyPair) -> bool:
    return p.dst.is_contiguous() and p.src.is_contiguous() and p.dst.dtype == p.src.dtype


@torch.no_grad()
def prove(regions: Sequence[WeightRegion], views: Sequence[Optional[torch.Tensor]],
          group_of: Callable[[str], str], *, graph: bool = True) -> DirectCopy:
    """After a bucketed sync: the pairs whose destination equals the source bitwise on every rank.

    A weight qualifies when each of its regions has a view here and every rank found the same; the
    members of one engine group (`group_of`) qualify together. Collective over the default group.
    """
    if len(views) != len(regions):
        raise ValueError(f"engine.weight_views returned {len(views)} views for {len(regions)} regions")
    pairs, failed = [], set()
    for region, view in zip(regions, views):
        group = group_of(region.name)
        if view is None or view.shape != region.src.shape or not torch.equal(view, region.src.to(view.dtype)):
            failed.add(group)
        else:
            pairs.append(CopyPair(region.name, view, region.src))
    passed = _agree({group_of(p.name) for p in pairs} - failed)
    return DirectCopy([p for p in pairs if group_of(p.name) in passed], graph=graph)


def _agree(groups: set[str]) -> set[str]:
    """The groups every rank passed (one all_gather_object, once per run)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return groups
    everyone: list[Optional[set[str]]] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, groups)
    return set.intersection(*everyone)
