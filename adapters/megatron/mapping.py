"""THE weight mapping between HuggingFace names/layouts and megatron-core GPTModel shards.

Import (HF safetensors -> shards), export (shards -> HF tensors, also used by the rollout weight
sync), the rollout's direct copy, the converter CLIs and the merger all go through `plan()` and
`shard_regions()`; no other file knows how QKV is fused or where padding goes.

Layouts (h hidden, d head_dim, n heads, k kv heads, p = n/k heads per group, f ffn, V vocab,
Vp padded vocab, tp rank r of t):
  qkv   megatron linear_qkv rows are grouped per query group g: [q heads of g (p*d rows); k_g (d); v_g (d)];
        rank r holds the contiguous groups [r*k/t, (r+1)*k/t). HF keeps q_proj, k_proj, v_proj apart.
  fc1   megatron linear_fc1 on rank r is [gate rows of r; up rows of r] (each f/t rows); HF gate_proj, up_proj.
  vocab embedding / output rows padded from V to Vp with zeros; rank r holds rows [r*Vp/t, (r+1)*Vp/t).
  column / row  split along dim 0 / dim 1; replicated: norms, q/k norms, the critic's value head and the reward
        model's score head (HF `score.weight`, and `score.bias` of *ForTokenClassification).
Pipeline: global layer g lives in chunk c = g // (L/(pp*vpp)) -> vp stage c // pp, pp rank c % pp
(megatron's interleaved assignment), local index g % (L/(pp*vpp)).
Experts (MoE layers): routed expert x of E lives on ep rank x // (E/ep) as local expert x % (E/ep)
(megatron's SequentialMLP `local_experts.i`, or TE's grouped `weight{i}`), its fc1/fc2 split over the
expert-tensor-parallel (etp) ranks like a dense MLP's over tp; the router is replicated; a shared expert
is a dense MLP over tp plus a replicated [1, h] gate. HF keeps one gate/up/down per expert.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .hf_config import ModelArch

# (hf name, rows, cols) -> tensor; rows/cols are slices of the HF tensor to read (None: all).
Reader = Callable[[str, Optional[slice], Optional[slice]], torch.Tensor]


@dataclass(frozen=True)
class Entry:
    """One megatron parameter of one chunk and the HF tensors it corresponds to."""

    mcore: str  # parameter name inside the (unwrapped) GPTModel chunk
    hf: tuple[str, ...]
    hf_shapes: tuple[tuple[int, ...], ...]
    kind: str  # replicated | column | row | vocab | qkv | fc1
    pp_rank: int
    vp_stage: int
    export: bool = True  # False for the tied output-layer copy on the last stage
    optional: bool = False  # may be absent from the HF folder (a fresh value head)
    ep_rank: Optional[int] = None  # a routed expert's owner (split over etp, not tp); None: not an expert


@dataclass(frozen=True)
class Topology:
    tp: int
    pp: int
    vpp: Optional[int] = None
    te_names: bool = False  # transformer-engine spec: norms fused into the following linear
    value_head: bool = False
    head_bias: bool = False  # the value/score head has a bias (HF *ForTokenClassification's `score.bias`)
    extra: dict = field(default_factory=dict, compare=False)
    ep: int = 1
    etp: Optional[int] = None  # None: tp
    grouped_experts: bool = False  # TE's grouped GEMM experts (weight{i}) instead of SequentialMLP

    @property
    def chunks(self) -> int:
        return self.vpp or 1

    def split(self, entry: "Entry") -> int:
        """How many ranks split `entry`'s tensor: etp for routed experts, tp for the rest."""
        return (self.etp or self.tp) if entry.ep_rank is not None else self.tp


def layer_owner(layer: int, arch: ModelArch, topo: Topology) -> tuple[int, int, int]:
    """(pp_rank, vp_stage, local index) of a global layer."""
    per_chunk = arch.num_layers // (topo.pp * topo.chunks)
    chunk = layer // per_chunk
    return chunk % topo.pp, chunk // topo.pp, layer % per_chunk


def plan(arch: ModelArch, topo: Topology) -> list[Entry]:
    """Every parameter of the whole model in a fixed order (the same on every rank)."""
    h, V = arch.hidden_size, arch.vocab_size
    first, last = (0, 0), (topo.pp - 1, topo.chunks - 1)
    out = [Entry("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), ((V, h),), "vocab", *first)]
    for layer in range(arch.num_layers):
        out += _layer_entries(arch, topo, layer)
    out.append(Entry("decoder.final_layernorm.weight", ("model.norm.weight",), ((h,),), "replicated", *last))
    if topo.value_head:
        out.append(Entry("output_layer.weight", ("score.weight",), ((1, h),), "replicated", *last, optional=True))
        if topo.head_bias:
            out.append(Entry("output_layer.bias", ("score.bias",), ((1,),), "replicated", *last, optional=True))
    elif not arch.tie_embeddings:
        out.append(Entry("output_layer.weight", ("lm_head.weight",), ((V, h),), "vocab", *last))
    elif topo.pp > 1:
        # Tied weights on several stages: the last stage keeps its own copy of the embedding.
        out.append(Entry("output_layer.weight", ("model.embed_tokens.weight",), ((V, h),), "vocab", *last,
                         export=False))
    return out


def _layer_entries(arch: ModelArch, topo: Topology, layer: int) -> list[Entry]:
    h, d, f = arch.hidden_size, arch.head_dim, arch.ffn_hidden_size
    nq, nkv = arch.num_heads * d, arch.num_kv_heads * d
    pp_rank, vp_stage, local = layer_owner(layer, arch, topo)
    m, hf = f"decoder.layers.{local}.", f"model.layers.{layer}."
    in_norm = "self_attention.linear_qkv.layer_norm_weight" if topo.te_names else "input_layernorm.weight"
    mlp_norm = "mlp.linear_fc1.layer_norm_weight" if topo.te_names else "pre_mlp_layernorm.weight"
    qkv = tuple(f"{hf}self_attn.{x}_proj.weight" for x in "qkv")

    def e(mname, hf_names, shapes, kind):
        return Entry(m + mname, tuple(hf_names), tuple(shapes), kind, pp_rank, vp_stage)

    out = [
        e(in_norm, [hf + "input_layernorm.weight"], [(h,)], "replicated"),
        e("self_attention.linear_qkv.weight", qkv, [(nq, h), (nkv, h), (nkv, h)], "qkv"),
    ]
    if arch.qkv_bias:
        out.append(e("self_attention.linear_qkv.bias", [n.replace(".weight", ".bias") for n in qkv],
                     [(nq,), (nkv,), (nkv,)], "qkv"))
    if arch.qk_norm:
        out.append(e("self_attention.q_layernorm.weight", [hf + "self_attn.q_norm.weight"], [(d,)], "replicated"))
        out.append(e("self_attention.k_layernorm.weight", [hf + "self_attn.k_norm.weight"], [(d,)], "replicated"))
    out.append(e("self_attention.linear_proj.weight", [hf + "self_attn.o_proj.weight"], [(h, nq)], "row"))
    if arch.is_moe:  # megatron never fuses the norm into an MoE layer's experts
        return out + [e("pre_mlp_layernorm.weight", [hf + "post_attention_layernorm.weight"], [(h,)], "replicated"),
                      *_moe_entries(arch, topo, e, m, hf, pp_rank, vp_stage)]
    out += [
        e(mlp_norm, [hf + "post_attention_layernorm.weight"], [(h,)], "replicated"),
        e("mlp.linear_fc1.weight", [hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"], [(f, h), (f, h)], "fc1"),
        e("mlp.linear_fc2.weight", [hf + "mlp.down_proj.weight"], [(h, f)], "row"),
    ]
    return out


# HF checkpoint names of one MoE layer's pieces: (block, gate, up, down) of routed experts.
HF_EXPERT_NAMES = {"mixtral": ("block_sparse_moe", "w1", "w3", "w2")}
HF_EXPERT_DEFAULT = ("mlp", "gate_proj", "up_proj", "down_proj")


def _moe_entries(arch: ModelArch, topo: Topology, e, m: str, hf: str, pp_rank: int, vp_stage: int) -> list[Entry]:
    """Router, routed experts (owned by their ep rank) and the optional shared expert of one MoE layer."""
    h, fe, E = arch.hidden_size, arch.moe_ffn_hidden_size, arch.num_experts
    block, gate, up, down = HF_EXPERT_NAMES.get(arch.model_type, HF_EXPERT_DEFAULT)
    out = [e("mlp.router.weight", [f"{hf}{block}.gate.weight"], [(E, h)], "replicated")]
    per_rank = E // topo.ep
    for x in range(E):
        owner, local = divmod(x, per_rank)
        src = f"{hf}{block}.experts.{x}."
        if topo.grouped_experts:
            fc1, fc2 = f"mlp.experts.linear_fc1.weight{local}", f"mlp.experts.linear_fc2.weight{local}"
        else:
            fc1, fc2 = (f"mlp.experts.local_experts.{local}.linear_fc{i}.weight" for i in (1, 2))
        out += [Entry(m + fc1, (f"{src}{gate}.weight", f"{src}{up}.weight"), ((fe, h), (fe, h)), "fc1", pp_rank,
                      vp_stage, ep_rank=owner),
                Entry(m + fc2, (f"{src}{down}.weight",), ((h, fe),), "row", pp_rank, vp_stage, ep_rank=owner)]
    fs = arch.shared_expert_ffn_hidden_size
    if fs:
        shared = f"{hf}mlp.shared_expert."
        out += [e("mlp.shared_experts.linear_fc1.weight", [shared + "gate_proj.weight", shared + "up_proj.weight"],
                  [(fs, h), (fs, h)], "fc1"),
                e("mlp.shared_experts.linear_fc2.weight", [shared + "down_proj.weight"], [(h, fs)], "row"),
                e("mlp.shared_experts.gate_weight", [f"{hf}mlp.shared_expert_gate.weight"], [(1, h)], "replicated")]
    return out


# ------------------------------------------------------------------------------------------ regions
@dataclass(frozen=True)
class Region:
    """Where one piece of an HF tensor sits inside a tp rank's shard.

    `view` is a view of the shard whose elements, in C order, are HF[hf].narrow(dim, start, stop - start)
    in C order (for qkv with several query groups it is 3-D: [groups, rows per group, *tail]).
    """

    hf: str
    dim: int  # 0: a range of the HF tensor's rows, 1: of its columns
    start: int
    stop: int
    view: torch.Tensor


def shard_regions(entry: Entry, shard: torch.Tensor, arch: ModelArch, rank: int, tp: int) -> list[Region]:
    """The pieces of HF tensors that tp rank `rank`'s shard of `entry` holds: the one statement of every
    layout above. Import, export and the rollout's direct copy are all built on it."""
    shapes, hf = entry.hf_shapes, entry.hf
    if entry.kind == "replicated":
        return [Region(hf[0], 0, 0, shapes[0][0], shard)]
    if entry.kind == "column":
        n = shapes[0][0] // tp
        return [Region(hf[0], 0, rank * n, (rank + 1) * n, shard)]
    if entry.kind == "row":
        n = shapes[0][1] // tp
        return [Region(hf[0], 1, rank * n, (rank + 1) * n, shard)]
    if entry.kind == "vocab":  # padding rows past the real vocabulary belong to no HF row
        rows = shard.shape[0]
        start, stop = rank * rows, min((rank + 1) * rows, arch.vocab_size)
        return [Region(hf[0], 0, start, stop, shard[: stop - start])] if stop > start else []
    if entry.kind == "fc1":  # dense, shared or routed expert: each member has the MLP's own ffn rows
        n = shapes[0][0] // tp
        return [Region(hf[0], 0, rank * n, (rank + 1) * n, shard[:n]),
                Region(hf[1], 0, rank * n, (rank + 1) * n, shard[n:])]
    if entry.kind == "qkv":
        d, p = arch.head_dim, arch.heads_per_group
        groups = arch.num_kv_heads // tp
        g0, tail = rank * groups, shard.shape[1:]
        q, k, v = shard.view(groups, (p + 2) * d, *tail).split([p * d, d, d], dim=1)
        if groups == 1:  # one group: each piece is a contiguous block of rows
            q, k, v = (x.reshape(-1, *tail) for x in (q, k, v))
        return [Region(hf[0], 0, g0 * p * d, (g0 + groups) * p * d, q),
                Region(hf[1], 0, g0 * d, (g0 + groups) * d, k),
                Region(hf[2], 0, g0 * d, (g0 + groups) * d, v)]
    raise AssertionError(f"unknown mapping kind {entry.kind!r}")


# ------------------------------------------------------------------------------------------ HF -> shard
def hf_to_shard(entry: Entry, read: Reader, arch: ModelArch, rank: int, tp: int) -> torch.Tensor:
    """This tp rank's megatron shard of `entry`, reading only the rows/columns it needs."""
    if entry.kind == "replicated":
        return read(entry.hf[0], None, None)
    shard: Optional[torch.Tensor] = None
    probe = torch.empty(shard_shape(entry, arch, tp), device="meta")
    for region in shard_regions(entry, probe, arch, rank, tp):
        span = slice(region.start, region.stop)
        part = read(region.hf, span, None) if region.dim == 0 else read(region.hf, None, span)
        if shard is None:  # zeros: vocab padding rows stay 0
            shard = torch.zeros(probe.shape, dtype=part.dtype, device=part.device)
        _view_like(shard, region).copy_(part.reshape(region.view.shape))
    return torch.zeros(probe.shape) if shard is None else shard  # None: a vocab shard of padding rows only


def _view_like(shard: torch.Tensor, region: Region) -> torch.Tensor:
    """The same view `region.view` is of a (meta) probe, taken of the real `shard`."""
    v = region.view
    return shard.as_strided(v.shape, v.stride(), v.storage_offset())


# ------------------------------------------------------------------------------------------ shards -> HF
def shards_to_hf(entry: Entry, shards: list[torch.Tensor], arch: ModelArch) -> list[tuple[str, torch.Tensor]]:
    """Full HF tensors from all tp ranks' shards of `entry` (rank order), padding stripped."""
    tp = len(shards)
    regions = [(r, region) for r, s in enumerate(shards) for region in shard_regions(entry, s, arch, r, tp)]
    out = []
    for name, shape in zip(entry.hf, entry.hf_shapes):
        mine = [region for _, region in regions if region.hf == name]
        if len(mine) == 1 and mine[0].view.is_contiguous() and mine[0].view.numel() == _numel(shape):
            out.append((name, mine[0].view.reshape(shape)))  # the whole tensor in one piece: no copy
            continue
        full = shards[0].new_empty(shape)
        for region in mine:
            target = full.narrow(region.dim, region.start, region.stop - region.start)
            if region.dim == 0:  # a block of rows: contiguous, so it takes the region's (3-D qkv) shape
                target = target.view(region.view.shape)
            target.copy_(region.view)
        out.append((name, full))
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def is_tp_split(entry: Entry) -> bool:
    return entry.kind != "replicated"


def shard_shape(entry: Entry, arch: ModelArch, tp: int) -> tuple[int, ...]:
    """Shape of one tp rank's shard (the same on every rank)."""
    shapes = entry.hf_shapes
    if entry.kind == "replicated":
        return shapes[0]
    if entry.kind == "vocab":
        return (arch.padded_vocab(tp) // tp, shapes[0][1])
    if entry.kind == "row":
        return (shapes[0][0], shapes[0][1] // tp)
    rows = sum(s[0] for s in shapes) // tp
    return (rows, *shapes[0][1:])


# ------------------------------------------------------------------------------------------ LoRA adapters
# megatron linear -> (its HF modules, parallel style). A column-parallel layer splits its output rows over tp,
# so an adapter's B splits with them (kind column) and A, which reads the whole input, is replicated; a
# row-parallel layer splits its input columns, so A splits them (kind row) and B is replicated.
LORA_LINEARS = {"self_attention.linear_qkv": (("q_proj", "k_proj", "v_proj"), "column"),
                "self_attention.linear_proj": (("o_proj",), "row"),
                "mlp.linear_fc1": (("gate_proj", "up_proj"), "column"),
                "mlp.linear_fc2": (("down_proj",), "row")}
PEFT_PREFIX = "base_model.model."  # PEFT keys an adapter by the wrapped model's module path


def lora_param_name(linear: str, which: str, module: str) -> str:
    """The adapter parameter of HF module `module` on megatron linear `linear` (which: A or B)."""
    return f"{linear}.lora.lora_{which}.{module}"


def lora_plan(arch: ModelArch, topo: Topology, rank: int, targets: tuple[str, ...]) -> list[Entry]:
    """Every LoRA adapter parameter (A [rank, in], B [out, rank] per targeted HF module) with its PEFT name,
    in a fixed order: the rows export, import and the checkpoint's layout-free keys share."""
    h, f = arch.hidden_size, arch.ffn_hidden_size
    nq, nkv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    dims = {"q_proj": (h, nq), "k_proj": (h, nkv), "v_proj": (h, nkv), "o_proj": (nq, h),
            "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}  # (in, out) of each HF module
    out = []
    for layer in range(arch.num_layers):
        pp_rank, vp_stage, local = layer_owner(layer, arch, topo)
        for linear, (modules, style) in LORA_LINEARS.items():
            block = "self_attn" if linear.startswith("self_attention") else "mlp"
            for module in (m for m in modules if m in targets):
                fan_in, fan_out = dims[module]
                hf = f"{PEFT_PREFIX}model.layers.{layer}.{block}.{module}"
                mcore = f"decoder.layers.{local}.{linear}"
                out += [Entry(lora_param_name(mcore, "A", module), (f"{hf}.lora_A.weight",), ((rank, fan_in),),
                              "row" if style == "row" else "replicated", pp_rank, vp_stage),
                        Entry(lora_param_name(mcore, "B", module), (f"{hf}.lora_B.weight",), ((fan_out, rank),),
                              "column" if style == "column" else "replicated", pp_rank, vp_stage)]
    return out
