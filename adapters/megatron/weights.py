"""Moving weights between a HuggingFace folder and this rank's megatron chunks, through mapping.py.

`load_hf_weights` (import): each rank reads only the tensors (and rows/columns) of its own shards.
`loses_precision`: whether a checkpoint tensor holds values the (bf16) parameter cannot (role.py then starts the
fp32 master weights from the checkpoint's values).
`export_hf_weights` (export, collective over all ranks of the role): bucket by bucket in the fixed
plan order (never the whole model at once), the owning pipeline stage all-gathers the tp shards
(several parameters per collective) and un-fuses them into HF tensors, then broadcasts them over the
pipeline group, so EVERY rank receives full HF tensors. Data-parallel replicas hold identical weights
and do the same work independently. This is also what the rollout weight sync calls.
Routed experts (MoE) are split over the expert-tensor-parallel group and spread over the expert-parallel
group: the owner's etp ranks all-gather an expert's shards, then the ep ranks all-gather the bucket's
experts (one collective per bucket), so every rank again ends with every expert.
`local_regions` (no communication): what this rank's own shards hold of each HF weight, as views, for the
rollout's direct copy (of this rank's pieces, and of other ranks' pieces over the cross-GPU copy).
"""
from __future__ import annotations

import math
from typing import Callable, Collection, Iterator, Mapping, Optional

import torch
import torch.distributed as dist

from hybridrl.adapters.base import WeightBucket, WeightRegion
from hybridrl.config.layout import ParallelLayout

from . import compat
from .builder import unwrap
from .hf_config import ModelArch
from .hf_io import SafetensorsReader
from .mapping import Entry, Topology, hf_to_shard, is_tp_split, plan, shard_regions, shards_to_hf


def topology(chunks: list[torch.nn.Module], layout: ParallelLayout, value_head: bool, head_bias: bool = False) -> Topology:
    """The mapping topology of built chunks (param naming follows the layer spec actually used). `head_bias` is given,
    not read from the names: only the last pipeline stage holds the head, and every rank must walk the same plan."""
    names = {n for c in chunks for n, _ in unwrap(c).named_parameters()}
    te = any(n.endswith("linear_qkv.layer_norm_weight") for n in names)
    grouped = any(".experts.linear_fc1.weight" in n for n in names)
    return Topology(tp=layout.tp, pp=layout.pp, vpp=layout.vpp, te_names=te, value_head=value_head, ep=layout.ep,
                    etp=layout.expert_tp, grouped_experts=grouped, head_bias=value_head and head_bias)


def _params(chunks: list[torch.nn.Module]) -> list[dict[str, torch.nn.Parameter]]:
    return [dict(unwrap(c).named_parameters()) for c in chunks]


def _ranks() -> tuple[int, int]:
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()


def _owns(entry: Entry, pp_rank: int) -> bool:
    """This rank holds (a shard of) `entry`: its pipeline stage and, for a routed expert, its ep rank."""
    if entry.pp_rank != pp_rank:
        return False
    return entry.ep_rank is None or entry.ep_rank == _expert_ranks()[0]


def _expert_ranks() -> tuple[int, int]:
    """(ep rank, etp rank) of this process."""
    from megatron.core import parallel_state as ps

    return ps.get_expert_model_parallel_rank(), ps.get_expert_tensor_parallel_rank()


def _split_rank(entry: Entry, tp_rank: int) -> int:
    """This rank's index among the ranks that split `entry` (etp for routed experts, tp otherwise)."""
    return _expert_ranks()[1] if entry.ep_rank is not None else tp_rank


def load_hf_weights(chunks: list[torch.nn.Module], hf_dir: str, arch: ModelArch, layout: ParallelLayout,
                    value_head: bool = False, reader: Optional[SafetensorsReader] = None,
                    into: Optional[Callable[[torch.nn.Parameter, torch.Tensor], None]] = None,
                    head_bias: bool = False) -> int:
    """Copy this rank's shards from the HF safetensors in `hf_dir`; returns the number of tensors set.

    Call before building the optimizer (the distributed optimizer copies params into its fp32 shards).
    `into(param, shard)` receives each shard in the checkpoint's dtype instead of the copy into `param`
    (role.py: the fp32 master weights of a float32 checkpoint).
    Raises with the tensor, file and expected shape when the folder does not match the config.
    """
    reader = reader or SafetensorsReader(hf_dir)
    tp_rank, pp_rank = _ranks()
    params = _params(chunks)
    assigned: set[tuple[int, str]] = set()
    topo = topology(chunks, layout, value_head, head_bias)
    for entry in plan(arch, topo):
        if not _owns(entry, pp_rank):
            continue
        param = _param(params, entry)
        if entry.optional and not reader.has(entry.hf[0]):
            assigned.add((entry.vp_stage, entry.mcore))  # keeps its initialisation (a fresh value head)
            continue
        _check_shapes(entry, reader)
        shard = hf_to_shard(entry, reader, arch, _split_rank(entry, tp_rank), topo.split(entry))
        if tuple(shard.shape) != tuple(param.shape):
            raise AssertionError(f"mapping bug: {entry.mcore} shard {tuple(shard.shape)} vs param {tuple(param.shape)}")
        if into is not None:
            into(param, shard)
        else:
            with torch.no_grad():
                param.copy_(shard)
        assigned.add((entry.vp_stage, entry.mcore))
    missing = [f"chunk {v}: {n}" for v, p in enumerate(params) for n in p if (v, n) not in assigned]
    if missing:
        raise AssertionError(f"mapping bug: parameters with no HF source: {missing}")
    return len(assigned)


def loses_precision(param: torch.Tensor, shard: torch.Tensor) -> bool:
    """The checkpoint's `shard` has values that `param`'s dtype rounds away (a float32 checkpoint, bf16 params)."""
    if not (shard.is_floating_point() and param.is_floating_point()):
        return False
    if torch.finfo(shard.dtype).eps >= torch.finfo(param.dtype).eps:
        return False
    return not torch.equal(shard.to(param.dtype).to(shard.dtype), shard)


def _param(params: list[dict[str, torch.nn.Parameter]], entry: Entry) -> torch.nn.Parameter:
    try:
        return params[entry.vp_stage][entry.mcore]
    except KeyError:
        raise AssertionError(f"mapping bug: model chunk {entry.vp_stage} has no parameter {entry.mcore!r}") from None


def _check_shapes(entry: Entry, reader: SafetensorsReader) -> None:
    for name, want in zip(entry.hf, entry.hf_shapes):
        got = reader.shape(name)
        if got != tuple(want):
            raise ValueError(f"{reader.folder}: tensor {name} in {reader.where[name]} has shape {got} but config.json "
                             f"implies {tuple(want)}; the weights do not belong to this config")


def export_hf_weights(chunks: list[torch.nn.Module], arch: ModelArch, layout: ParallelLayout,
                      bucket_bytes: int = 512 << 20, value_head: bool = False,
                      names: Optional[Collection[str]] = None, entries: Optional[list[Entry]] = None,
                      params: Optional[list[Mapping[str, torch.Tensor]]] = None,
                      head_bias: bool = False, topo: Optional[Topology] = None,
                      dtype: Optional[torch.dtype] = None) -> Iterator[WeightBucket]:
    """Yield lists of (hf_name, full tensor) of about `bucket_bytes` on every rank (collective).

    Every rank must iterate to the end (the collectives run inside the generator) and pass the same
    `names` (only those HF weights; None: all). Tensors are in the model dtype on the training device
    and may alias live parameters: copy them before the next update.
    Bucket boundaries follow the plan order and the HF sizes alone, so every rank cuts the same buckets.
    `entries` (default: the model's plan) and `params` (default: the chunks' parameters by name) let LoRA
    export its adapters under PEFT's names, or the base weights with the adapters merged in (lora.py).
    `head_bias`: the value head has `score.bias` (as the model was built; topology() says why it is given).
    `topo` (topology() of these chunks) and `dtype` (the chunks' parameter dtype): a caller that exports every step
    gives them once found (each is a walk over every parameter of the model otherwise).
    """
    from megatron.core import parallel_state as ps

    _, pp_rank = _ranks()
    params = params if params is not None else _params(chunks)
    dtype = dtype if dtype is not None else next(iter(_params(chunks)[0].values())).dtype
    wanted = None if names is None else set(names)
    topo = topo if topo is not None else topology(chunks, layout, value_head, head_bias)
    entries = [e for e in (plan(arch, topo) if entries is None else entries)
               if e.export and (wanted is None or not wanted.isdisjoint(e.hf))]
    for group in _buckets(entries, wanted, dtype.itemsize, bucket_bytes):
        owned = [e for e in group if _owns(e, pp_rank)]
        full = _gather_on_owner(owned, params, arch, topo)
        if layout.ep > 1:
            full.update(_exchange_experts([e for e in group if e.pp_rank == pp_rank and e.ep_rank is not None],
                                          full, dtype, layout.ep))
        bucket: WeightBucket = []
        for entry in group:
            tensors = full.get(id(entry))
            if layout.pp > 1:
                tensors = _broadcast_from_owner(entry, tensors, dtype, ps.get_pipeline_model_parallel_group())
            bucket += [(n, t) for n, t in tensors if wanted is None or n in wanted]
        yield bucket
        del full, bucket, tensors  # before the next bucket is gathered: never two alive (weight_sync.py relies on it)


def _buckets(entries: list[Entry], wanted: Optional[set[str]], itemsize: int, bucket_bytes: int) -> Iterator[list[Entry]]:
    """Consecutive entries whose wanted HF tensors add up to `bucket_bytes` (the last one may pass it)."""
    group: list[Entry] = []
    size = 0
    for entry in entries:
        group.append(entry)
        size += sum(math.prod(shape) * itemsize for name, shape in zip(entry.hf, entry.hf_shapes)
                    if wanted is None or name in wanted)
        if size >= bucket_bytes:
            yield group
            group, size = [], 0
    if group:
        yield group


def local_regions(chunks: list[torch.nn.Module], arch: ModelArch, layout: ParallelLayout,
                  value_head: bool = False, head_bias: bool = False) -> Optional[list[WeightRegion]]:
    """Every exported HF weight's pieces in this rank's shards (views of the live parameters), in plan order.
    Under pipeline parallelism only this stage's layers: the direct copy then plans the rest from the other
    stages' pieces (hybridrl.hybrid.remote)."""
    tp_rank, pp_rank = _ranks()
    params = _params(chunks)
    out = []
    topo = topology(chunks, layout, value_head, head_bias)
    for entry in plan(arch, topo):
        if not entry.export or not _owns(entry, pp_rank):
            continue
        shard = _param(params, entry).detach()
        extents = dict(zip(entry.hf, entry.hf_shapes))
        for r in shard_regions(entry, shard, arch, _split_rank(entry, tp_rank), topo.split(entry)):
            out.append(WeightRegion(r.hf, r.dim, r.start, r.stop, extents[r.hf][r.dim], r.view))
    return out


# Bytes of local shards fused into one tp all-gather. One collective per tensor (about 200 per sync of a
# 1.5B model) is latency-bound; one per bucket would hold the bucket twice (gathered shards + HF tensors).
GATHER_BYTES = 64 << 20


def _gather_on_owner(entries: list[Entry], params, arch: ModelArch,
                     topo: Topology) -> dict[int, list[tuple[str, torch.Tensor]]]:
    """id(entry) -> its full HF tensors, for entries this rank holds. tp-split shards (etp-split for routed
    experts) travel flattened and concatenated, GATHER_BYTES of local shards per all-gather."""
    out: dict[int, list[tuple[str, torch.Tensor]]] = {}
    pending: dict[bool, list[tuple[Entry, torch.Tensor]]] = {False: [], True: []}  # keyed by "routed expert"
    pending_bytes = {False: 0, True: 0}
    for entry in entries:
        shard = _param(params, entry).detach()
        split, expert = topo.split(entry), entry.ep_rank is not None
        if split == 1 or not is_tp_split(entry):
            out[id(entry)] = shards_to_hf(entry, [shard], arch)
            continue
        pending[expert].append((entry, shard))
        pending_bytes[expert] += shard.numel() * shard.element_size()
        if pending_bytes[expert] >= GATHER_BYTES:
            out.update(_fused_tp_gather(pending[expert], arch, split, expert))
            pending[expert], pending_bytes[expert] = [], 0
    for expert, rest in pending.items():
        if rest:
            out.update(_fused_tp_gather(rest, arch, topo.split(rest[0][0]), expert))
    return out


def _fused_tp_gather(pending: list[tuple[Entry, torch.Tensor]], arch: ModelArch,
                     tp: int, expert: bool = False) -> dict[int, list[tuple[str, torch.Tensor]]]:
    """One all_gather_into_tensor for the flattened shards of several entries -> their full HF tensors
    (over the tp group, or the expert-tp group for routed experts)."""
    from megatron.core import parallel_state as ps

    local = torch.cat([shard.reshape(-1) for _, shard in pending])
    gathered = torch.empty(tp * local.numel(), dtype=local.dtype, device=local.device)
    group = ps.get_expert_tensor_parallel_group() if expert else ps.get_tensor_model_parallel_group()
    dist.all_gather_into_tensor(gathered, local, group=group)
    per_rank = gathered.view(tp, local.numel())
    del local
    out, offset = {}, 0
    for entry, shard in pending:
        n = shard.numel()
        shards = [per_rank[r, offset:offset + n].view(shard.shape) for r in range(tp)]
        out[id(entry)] = shards_to_hf(entry, shards, arch)
        offset += n
    return out


def _exchange_experts(experts: list[Entry], full: dict[int, list[tuple[str, torch.Tensor]]], dtype: torch.dtype,
                      ep: int) -> dict[int, list[tuple[str, torch.Tensor]]]:
    """The routed experts of one bucket (this stage's) on every ep rank: one all-gather of each rank's full
    tensors, flattened and padded to the largest rank's share (the plan gives every rank the sizes)."""
    from megatron.core import parallel_state as ps

    if not experts:
        return {}
    sizes = [sum(math.prod(s) for e in experts if e.ep_rank == r for s in e.hf_shapes) for r in range(ep)]
    mine = ps.get_expert_model_parallel_rank()
    local = torch.zeros(max(sizes), dtype=dtype, device=compat.device())
    offset = 0
    for e in experts:
        if e.ep_rank == mine:
            for _, t in full[id(e)]:
                local[offset:offset + t.numel()].copy_(t.reshape(-1))
                offset += t.numel()
    gathered = torch.empty(ep * local.numel(), dtype=dtype, device=local.device)
    dist.all_gather_into_tensor(gathered, local, group=ps.get_expert_model_parallel_group())
    per_rank = gathered.view(ep, local.numel())
    del local
    out, offsets = {}, [0] * ep
    for e in experts:
        tensors = []
        for name, shape in zip(e.hf, e.hf_shapes):
            n, o = math.prod(shape), offsets[e.ep_rank]
            tensors.append((name, per_rank[e.ep_rank, o:o + n].view(shape)))
            offsets[e.ep_rank] = o + n
        out[id(e)] = tensors
    return out


def _broadcast_from_owner(entry: Entry, tensors, dtype: torch.dtype, group) -> list[tuple[str, torch.Tensor]]:
    src = dist.get_global_rank(group, entry.pp_rank)
    out = []
    for i, (name, shape) in enumerate(zip(entry.hf, entry.hf_shapes)):
        if tensors is not None:
            buf = tensors[i][1].contiguous()
        else:
            buf = torch.empty(shape, dtype=dtype, device=compat.device())
        dist.broadcast(buf, src=src, group=group)
        out.append((name, buf))
    return out
