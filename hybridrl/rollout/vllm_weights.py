"""Where HF-named weights live in vLLM 0.26's parameters, for the direct weight copy and the sync checks:
fused members (qkv_proj, gate_up_proj), tensor-parallel blocks, routed experts (FusedMoE's w13/w2), and the
float64 sums the checks compare (hybridrl.hybrid.checks). Pure tensor code: it runs on CPU in the tests with
fake parameters; only `_local_sums` across tp ranks needs vLLM's process groups.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Optional

import torch

from .base import PieceView, WeightPiece, covering_pieces, covering_views, piece_view, shaped_view

if TYPE_CHECKING:
    from hybridrl.adapters.base import WeightRegion

# HF projections that vLLM fuses into one parameter, in the order it stacks them.
PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

# Routed experts: HF checkpoints name one gate/up/down per expert (<prefix>.experts.<e>.<proj>.weight); vLLM's
# FusedMoE holds a layer's local experts in two parameters under the same <prefix>.experts module (0.26:
# ...experts.routed_experts.w13_weight [E_local, 2 f_local, h] = [gate rows; up rows] per expert, and
# ...w2_weight [E_local, h, f_local]). f_local = f / tp_g and E_local = E (tensor parallel experts, vLLM's
# default), or f_local = f and E_local = E / tp_g (enable_expert_parallel: rank r holds experts r*E_local..).
CHECKPOINT_PROJ = {"qwen": ("down_proj", "gate_proj", "up_proj"), "mixtral": ("w2", "w1", "w3")}
_EXPERT_NAME = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")


def _expert_of(hf_name: str) -> Optional[tuple[str, int, Optional[int], str]]:
    """(experts prefix, expert, member of w13 (0 gate, 1 up) or None for w2, naming kind) of an expert weight."""
    m = _EXPERT_NAME.match(hf_name)
    if m is None:
        return None
    kind = "mixtral" if m["proj"] in ("w1", "w2", "w3") else "qwen"
    down, gate, up = CHECKPOINT_PROJ[kind]
    member = {gate: 0, up: 1, down: None}[m["proj"]]
    return m["prefix"], int(m["expert"]), member, kind


def _expert_params(params: dict[str, torch.Tensor]) -> dict[tuple[str, str], str]:
    """(experts prefix, "w13" | "w2") -> the vLLM parameter name holding them."""
    out = {}
    for name in params:
        for kind in ("w13", "w2"):
            if name.endswith(f".{kind}_weight") and ".experts." in name:
                out[(name[: name.index(".experts.") + len(".experts")], kind)] = name
    return out


def _expert_block(p: torch.Tensor, expert: int, member: Optional[int], experts: int, tp: int, rank: int,
                  extent: int) -> tuple[Optional[int], int, int, int, int, int]:
    """Where vLLM's fused expert parameter `p` holds an expert's member: (index in p or None when this rank holds
    no such expert, dim, lo, n, offset, held): HF elements [lo, lo + n) of the member along `dim` sit at
    `offset` along that dim of p[index]; `held` = HF elements of the member held here."""
    local = p.shape[0]
    e = expert if local == experts else expert - rank * local  # expert parallel: a block of experts per rank
    if not 0 <= e < local:
        return None, 0, 0, 0, 0, 0
    dim = 0 if member is not None else 1  # gate/up: rows of [f, h]; down: columns of [h, f]
    n = p.shape[1] // 2 if member is not None else p.shape[2]
    lo = rank * n if tp > 1 and n < extent else 0
    held = n * (p.shape[2] if member is not None else p.shape[1])
    return e, dim, lo, n, (member * n if member is not None else 0), held


def _place_expert(p: torch.Tensor, r: WeightRegion, expert: int, member: Optional[int], experts: int, tp: int,
                  rank: int) -> tuple[Optional[torch.Tensor], int]:
    """(view of vLLM's fused expert parameter `p` holding region r, HF elements of r's weight held here)."""
    e, dim, lo, n, offset, held = _expert_block(p, expert, member, experts, tp, rank, r.extent)
    if e is None:
        return None, 0
    if r.dim != dim or r.start < lo or r.stop > lo + n:
        return None, held
    return shaped_view(p[e].narrow(dim, offset + r.start - lo, r.stop - r.start), r.src.shape), held


def _place_expert_piece(p: torch.Tensor, piece: WeightPiece, expert: int, member: Optional[int], experts: int,
                        tp: int, rank: int) -> tuple[Optional[PieceView], int]:
    e, dim, lo, n, offset, held = _expert_block(p, expert, member, experts, tp, rank, piece.shape[piece.dim])
    if e is None:
        return PieceView(piece.start, piece.start), 0
    if piece.dim != dim:
        return None, held
    a, b = max(piece.start, lo), min(piece.stop, lo + n)
    return piece_view(p[e], dim, a, b, piece.narrowed(a, b), offset + a - lo), held


def _num_experts(hf: Any) -> int:
    return int(getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", None) or 0)


def _vllm_name(hf_name: str) -> tuple[str, int, int]:
    """(vLLM parameter name, index within its fused group, group size) of an HF weight name."""
    for fused, members in PACKED.items():
        for i, m in enumerate(members):
            if f".{m}." in hf_name:
                return hf_name.replace(f".{m}.", f".{fused}."), i, len(members)
    return hf_name, 0, 1


def _target(params: dict[str, torch.Tensor], fused_experts: dict, name: str, extent: int,
            fused_rows: dict[str, tuple[int, ...]], experts: int) -> tuple[tuple, Optional[torch.Tensor], Any]:
    """(key of the (parameter, member) holding HF weight `name`, the parameter or None, how it is laid out:
    ("expert", expert, member) for routed experts, else ("dense", fused rows or None, member))."""
    expert = _expert_of(name) if experts else None
    if expert is not None:
        prefix, e, member, _ = expert
        vname = fused_experts.get((prefix, "w13" if member is not None else "w2"))
        return (vname, e, member), params.get(vname) if vname is not None else None, ("expert", e, member)
    vname, member, _ = _vllm_name(name)
    fused = vname.split(".")[-2]
    # gate_up members have their weight's own rows (the dense MLP's or a shared expert's intermediate size)
    rows = (extent, extent) if fused == "gate_up_proj" else fused_rows.get(fused)
    return (vname, member), params.get(vname), ("dense", rows, member)


def _weight_views(model: torch.nn.Module, regions: list[WeightRegion], tp: int, rank: int,
                  fused_rows: dict[str, tuple[int, ...]], experts: int = 0) -> list[Optional[torch.Tensor]]:
    """Where each region lands in this tp rank's vLLM parameters (RolloutEngine.weight_views).

    vLLM's layout on tp rank r of t: a fused parameter stacks its members' local rows (each member's HF
    rows split t ways); a parameter smaller than the HF weight along the region's dim holds block r of
    it (vocab rows padded past the HF extent); otherwise all of it. A (parameter, member) gets views only
    if the regions cover every HF element it holds here; the proof against load_weights (hybrid.direct)
    checks the rest.
    """
    params = dict(model.named_parameters())
    fused_experts = _expert_params(params) if experts else {}
    placed: list[tuple[tuple, Optional[torch.Tensor]]] = []
    need: dict[tuple, int] = {}
    for r in regions:
        key, p, (kind, a, member) = _target(params, fused_experts, r.name, r.extent, fused_rows, experts)
        if p is None:
            placed.append((key, None))
            continue
        if kind == "expert":
            view, need[key] = _place_expert(p, r, a, member, experts, tp, rank)
        else:
            view, need[key] = _place(p, r, a, member, tp, rank)
        placed.append((key, view))
    return covering_views(placed, need)


def _piece_views(model: torch.nn.Module, pieces: list[WeightPiece], tp: int, rank: int,
                 fused_rows: dict[str, tuple[int, ...]], experts: int = 0,
                 replicated_kv: bool = False) -> list[Optional[PieceView]]:
    """RolloutEngine.piece_views: the same layout as `_weight_views`, for pieces any rank holds: each piece's
    intersection with this rank's block (a piece may straddle blocks, e.g. a tp=1 actor's whole q_proj at tp_g=2).
    `replicated_kv` (tp_g above the KV heads): each rank holds whole KV heads, no block of rows: qkv is refused
    (a whole region can tell by its size, a piece cut to a block cannot)."""
    params = dict(model.named_parameters())
    fused_experts = _expert_params(params) if experts else {}
    placed: list[tuple[tuple, Optional[PieceView]]] = []
    need: dict[tuple, int] = {}
    for piece in pieces:
        key, p, (kind, a, member) = _target(params, fused_experts, piece.name, piece.shape[piece.dim], fused_rows,
                                            experts)
        if p is None or (replicated_kv and ".qkv_proj." in key[0]):
            placed.append((key, None))
            continue
        if kind == "expert":
            view, need[key] = _place_expert_piece(p, piece, a, member, experts, tp, rank)
        else:
            view, need[key] = _place_piece(p, piece, a, member, tp, rank)
        placed.append((key, view))
    return covering_pieces(placed, need)


def _block(p: torch.Tensor, dim: int, extent: int, fused: Optional[tuple[int, ...]], member: int, tp: int,
           rank: int) -> Optional[tuple[int, int, int, int, int]]:
    """Where `p` holds an HF weight of `extent` along `dim`: (dim, lo, n, offset, held): HF elements [lo, lo + n)
    along dim sit at `offset` in p; `held` = HF elements of the weight held here. None: not a plain split."""
    if fused is not None:  # members stacked along dim 0, each split over tp
        if any(rows % tp for rows in fused):
            return None  # replicated kv heads: not a plain split
        local = [rows // tp for rows in fused]
        dim, lo, n, offset = 0, rank * local[member], local[member], sum(local[:member])
    else:
        if p.dim() <= dim:
            return None
        # From shapes, not vLLM's tp attributes: linear weights carry both output_dim and input_dim
        # whichever they shard, and the tied embedding carried neither at tp_g=2.
        lo = rank * p.shape[dim] if tp > 1 and p.shape[dim] < extent else 0  # a tp block, or all of it
        n, offset = p.shape[dim], 0
    held = max(0, min(lo + n, extent) - lo) * (p.numel() // p.shape[dim])  # rows past the extent: padding
    return dim, lo, n, offset, held


def _place(p: torch.Tensor, r: WeightRegion, fused: Optional[tuple[int, ...]], member: int, tp: int,
           rank: int) -> tuple[Optional[torch.Tensor], int]:
    """(the view of `p` holding region r, the number of HF elements of r's weight that `p` holds here)."""
    block = _block(p, r.dim, r.extent, fused, member, tp, rank)
    if block is None:
        return None, -1
    dim, lo, n, offset, held = block
    if r.dim != dim or r.start < lo or r.stop > lo + n:
        return None, held
    return shaped_view(p.narrow(dim, offset + r.start - lo, r.stop - r.start), r.src.shape), held


def _place_piece(p: torch.Tensor, piece: WeightPiece, fused: Optional[tuple[int, ...]], member: int, tp: int,
                 rank: int) -> tuple[Optional[PieceView], int]:
    block = _block(p, piece.dim, piece.shape[piece.dim], fused, member, tp, rank)
    if block is None:
        return None, -1
    dim, lo, n, offset, held = block
    if piece.dim != dim:
        return None, held
    a, b = max(piece.start, lo), min(piece.stop, lo + n)
    return piece_view(p, dim, a, b, piece.narrowed(a, b), offset + a - lo), held


def _local_sums(model: torch.nn.Module, hf_names: list[str], tp_size: int) -> dict[str, float]:
    params = dict(model.named_parameters())
    fused_experts = _expert_params(params)
    out: dict[str, float] = {}
    cache: dict[str, float] = {}
    for hf in hf_names:
        vname, _, _ = _vllm_name(hf)
        expert = _expert_of(hf)
        if expert is not None:  # the fused parameter: every expert of the layer (checksum_terms)
            vname = fused_experts.get((expert[0], "w13" if expert[2] is not None else "w2"), hf)
        if vname not in params:
            if hf == "lm_head.weight" and "model.embed_tokens.weight" in params:
                vname = "model.embed_tokens.weight"  # tied embeddings
            else:
                raise KeyError(f"vLLM model has no parameter for HF weight {hf} (looked for {vname})")
        if vname not in cache:
            p = params[vname].detach()
            local = p.double().sum()
            if tp_size > 1:
                sums = torch.empty(tp_size, dtype=local.dtype, device=local.device)
                torch.distributed.all_gather_into_tensor(sums, local.reshape(1), group=_tp_group())
                # vLLM's tp attributes are not on every parameter it shards (seen: the tied embedding at
                # tp_g=2), so a parameter whose ranks hold different sums counts as sharded too
                sharded = _is_sharded(p) or bool((sums != sums[0]).any())
                local = sums.sum() if sharded else sums[0]
            cache[vname] = float(local)
        out[hf] = cache[vname]
    return out


def _is_sharded(p: torch.Tensor) -> bool:
    # vLLM tags tensor-parallel weights with input_dim/output_dim; norms and other replicated
    # weights carry neither. Row-parallel weights shard input_dim, column-parallel output_dim.
    return getattr(p, "output_dim", None) is not None or getattr(p, "input_dim", None) is not None


def _tp_group() -> Any:
    from vllm.distributed.parallel_state import get_tp_group

    return get_tp_group().device_group
