"""LoRA adapters on the Megatron actor's linear layers, in each tensor-parallel shard.

An adapted linear computes base(x) + scaling * B(A(x)) with scaling = lora_alpha / lora_rank, one (A, B)
pair per HF module it stands for (linear_qkv: q_proj, k_proj, v_proj; linear_fc1: gate_proj, up_proj), as
PEFT adapts each HF module, so an adapter exported under PEFT's names computes the same function.

Tensor parallelism (mapping.lora_plan says which piece each rank holds):
  column-parallel (linear_qkv, linear_fc1): x is the whole input on every rank; A [r, in] is replicated and
    B holds this rank's output rows. The rank-r activation A(x) passes copy_to_tensor_model_parallel_region:
    forward identity, backward the sum of the ranks' partial gradients, so A's gradient (and the input
    gradient through the adapter) is the whole one on every rank without another all-reduce.
  row-parallel (linear_proj, linear_fc2): x is this rank's input columns; A holds those columns, A(x) is a
    partial sum that reduce_from_tensor_model_parallel_region completes; B [out, r] is replicated and gets
    the same gradient on every rank.
So tp=2 computes what tp=1 does, up to float rounding. The adapters' outputs are arranged like the fused
layer's own rows (qkv per query group, fc1 as [gate; up]) so they add onto its output.

The adapter lives on the linear (`linear.lora`, parameters `lora.lora_A.<module>` / `lora.lora_B.<module>`)
and a forward hook adds its output, so the base parameters keep their names and the one mapping, the
weight sync and the checkpoint keys of the base are untouched. The base is frozen (requires_grad False),
so megatron's DDP and optimizer hold the adapters only. `disabled()` switches every adapter off: the
reference policy is the actor with its adapters off. `merged_params()` gives W + scaling * B @ A per shard
(each rank's B and A pieces multiply into exactly its shard of the full product) for the weight sync into
the rollout engine and for the merged HF export.
"""
from __future__ import annotations

import contextlib
import math
import zlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

import torch
import torch.nn.functional as F

from hybridrl.config.layout import ParallelLayout
from hybridrl.config.lora_checks import lora_targets

from .builder import unwrap
from .hf_config import ModelArch
from .mapping import LORA_LINEARS, Entry, Topology, hf_to_shard, lora_plan, shard_shape

MODEL_KEY = "actor_rollout_ref.model"


@dataclass(frozen=True)
class LoraSpec:
    """What adapters to build: rank, alpha, the HF modules that get them, an optional PEFT adapter to start from."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    adapter_path: Optional[str] = None
    # the rollout engine gets the adapters merged into the base (export_weights merges them); false: it holds the
    # base once and takes export_adapter_weights() each step (hybridrl/rollout/lora.py)
    merge: bool = False

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_model(cls, model: Any) -> Optional["LoraSpec"]:
        """From actor_rollout_ref.model's keys; None without LoRA (lora_rank 0)."""
        if not model.lora_rank:
            return None
        return cls(int(model.lora_rank), float(model.lora_alpha),
                   lora_targets(model.target_modules, model.exclude_modules), model.lora_adapter_path,
                   merge=bool(model.lora.merge))


class LoraAdapter(torch.nn.Module):
    """The adapters of one megatron linear on this rank: A [r, in_local] and B [out_local, r] per HF module.

    `members` are all the HF modules the linear stands for with this rank's output size of each (untargeted
    ones add zeros); `groups` is how many blocks the fused output interleaves them in (qkv: the local query
    groups; otherwise 1)."""

    def __init__(self, style: str, members: dict[str, int], shapes: dict[str, tuple[tuple[int, ...], ...]],
                 groups: int, scaling: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.style, self.members, self.groups, self.scaling = style, members, groups, scaling
        self.enabled = True
        self.lora_A = torch.nn.ParameterDict({m: _param(a, dtype, device) for m, (a, _) in shapes.items()})
        self.lora_B = torch.nn.ParameterDict({m: _param(b, dtype, device) for m, (_, b) in shapes.items()})

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """scaling * B(A(x)) of every adapted module, in the fused layer's output layout: [..., out_local]."""
        from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region as copy_to_tp
        from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region as reduce_tp

        names = list(self.lora_A)
        z = F.linear(x, torch.cat([self.lora_A[m] for m in names]))  # [..., r * len(names)]
        z = copy_to_tp(z) if self.style == "column" else reduce_tp(z)
        pieces = {m: F.linear(zm, self.lora_B[m]) for m, zm in zip(names, z.chunk(len(names), dim=-1))}
        return self._combine(pieces, x.shape[:-1], x) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """scaling * B @ A of every adapted module as this rank's shard of the fused weight: [out_local, in_local]."""
        pieces = {m: (self.lora_B[m] @ self.lora_A[m]).t() for m in self.lora_A}  # [in, out_m]
        a = next(iter(self.lora_A.values()))
        return self._combine(pieces, (a.shape[1],), a).t() * self.scaling

    def _combine(self, pieces: dict[str, torch.Tensor], lead: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """Per-module outputs [..., out_m] -> the fused layout: per group, the members' rows in order."""
        parts = []
        for m, size in self.members.items():
            t = pieces.get(m)
            if t is None:  # a module without an adapter adds nothing to its rows
                t = like.new_zeros(*lead, size)
            parts.append(t.reshape(*lead, self.groups, size // self.groups))
        return torch.cat(parts, dim=-1).reshape(*lead, -1)


def _param(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.zeros(shape, dtype=dtype, device=device))


def _add_delta(module: torch.nn.Module, args: tuple, output: Any) -> Any:
    """Forward hook of an adapted linear: megatron linears return (output, bias)."""
    adapter = module.lora
    if not adapter.enabled:
        return output
    out, bias = output
    return out + adapter.delta(args[0]).to(out.dtype), bias


# ------------------------------------------------------------------------------------------ attach
def attach(chunks: list[torch.nn.Module], arch: ModelArch, layout: ParallelLayout, spec: LoraSpec,
           seed: int) -> list[Entry]:
    """Freeze this rank's chunks and add adapters to the targeted linears; A and B start as PEFT's (A
    kaiming-uniform, B zeros: the model starts equal to the base) or from spec.adapter_path. Call after the
    base weights are loaded and before the Engine (DDP and the optimizer then see the adapters only).
    Returns the adapter entries this rank holds."""
    from megatron.core import parallel_state as ps

    _refuse_unsupported(chunks, arch)
    topo = Topology(tp=layout.tp, pp=layout.pp, vpp=layout.vpp)
    pp_rank = ps.get_pipeline_model_parallel_rank()
    entries = [e for e in lora_plan(arch, topo, spec.rank, spec.targets) if e.pp_rank == pp_rank]
    for chunk in chunks:
        chunk.requires_grad_(False)
        _recompute_needs_grad_input(unwrap(chunk))
    _install(chunks, entries, arch, layout.tp, spec.scaling)
    _fill(chunks, entries, _adapter_reader(spec) if spec.adapter_path else _InitReader(seed, entries), arch, layout.tp)
    return entries


def _recompute_needs_grad_input(model: torch.nn.Module) -> None:
    """Under full activation recompute, megatron's checkpoint function passes gradients only to inputs that require
    them; the frozen embedding's output does not, so the recomputed layers' adapters would get none. Marking that
    output as requiring grad (what peft does with enable_input_require_grads) lets the backward reach them."""
    if getattr(model.config, "recompute_granularity", None) is None or not hasattr(model, "embedding"):
        return

    def needs_grad(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output if output.requires_grad else output.requires_grad_()

    model.embedding.register_forward_hook(needs_grad)


def _install(chunks: list[torch.nn.Module], entries: list[Entry], arch: ModelArch, tp: int, scaling: float) -> None:
    """A LoraAdapter (zeros) on every linear the entries name, with the hook that adds its output."""
    linears: dict[tuple[int, str], dict[str, tuple]] = {}
    for a, b in zip(entries[::2], entries[1::2]):  # lora_plan gives each module's A, then its B
        linear, module = a.mcore.split(".lora.")[0], a.mcore.rsplit(".", 1)[1]
        linears.setdefault((a.vp_stage, linear), {})[module] = (shard_shape(a, arch, tp), shard_shape(b, arch, tp))
    for (vp_stage, name), shapes in linears.items():
        linear = unwrap(chunks[vp_stage]).get_submodule(name)
        style, members, groups = _fused_layout(name, arch, tp)
        linear.lora = LoraAdapter(style, members, shapes, groups, scaling, linear.weight.dtype, linear.weight.device)
        linear.register_forward_hook(_add_delta)


def _fill(chunks: list[torch.nn.Module], entries: list[Entry], reader: Any, arch: ModelArch, tp: int) -> None:
    """Each adapter parameter's shard from `reader` (HF-shaped tensors by PEFT name), cut by the one mapping."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

    tp_rank = ps.get_tensor_model_parallel_rank()
    params = [dict(unwrap(c).named_parameters()) for c in chunks]
    with torch.no_grad():
        for entry in entries:
            param = params[entry.vp_stage][entry.mcore]
            param.copy_(hf_to_shard(entry, reader, arch, tp_rank, tp))
            if entry.kind != "replicated":
                # megatron's grad norm counts a tp-split param on every rank, a replicated one on tp rank 0 only
                set_tensor_model_parallel_attributes(param, True, 0 if entry.kind == "column" else 1, 1)


def _refuse_unsupported(chunks: list[torch.nn.Module], arch: ModelArch) -> None:
    """What the adapters do not handle yet, as errors naming the key to change."""
    model = unwrap(chunks[0])
    names = [n for n, _ in model.named_parameters()]
    if any(n.endswith("layer_norm_weight") for n in names):  # TE fuses the norm into linear_qkv / linear_fc1
        raise ValueError(f"{MODEL_KEY}.lora_rank>0 needs the local layer spec (transformer-engine's fused "
                         "norm+linear layers take the un-normalised input); set "
                         "actor_rollout_ref.actor.megatron.transformer_impl=local")
    if arch.is_moe:
        raise ValueError(f"{MODEL_KEY}.lora_rank>0: LoRA on mixture-of-experts models ({arch.source}) is not "
                         "supported yet; set lora_rank=0")
    if model.config.sequence_parallel:
        raise ValueError(f"{MODEL_KEY}.lora_rank>0 with sequence parallelism is not supported yet; set "
                         "actor_rollout_ref.actor.megatron.sequence_parallel=false")


def _fused_layout(linear: str, arch: ModelArch, tp: int) -> tuple[str, dict[str, int], int]:
    """(parallel style, this rank's output rows per HF module, interleaved groups) of a megatron linear."""
    d, h, f = arch.head_dim, arch.hidden_size, arch.ffn_hidden_size
    key = linear.split(".", 3)[3]  # decoder.layers.<i>.<linear>
    modules, style = LORA_LINEARS[key]
    sizes = {"q_proj": arch.num_heads * d // tp, "k_proj": arch.num_kv_heads * d // tp,
             "v_proj": arch.num_kv_heads * d // tp, "o_proj": h, "gate_proj": f // tp, "up_proj": f // tp,
             "down_proj": h}
    groups = arch.num_kv_heads // tp if modules[0] == "q_proj" else 1
    return style, {m: sizes[m] for m in modules}, groups


class _InitReader:
    """PEFT's initial values as a mapping.Reader over the full HF-shaped tensors: A kaiming-uniform (a=sqrt(5),
    i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in))), B zeros. Each A comes from a generator seeded by (seed, its PEFT
    name), so every layout slices the same full tensor: tp2 starts where tp1 does."""

    def __init__(self, seed: int, entries: list[Entry]) -> None:
        self.seed = seed
        self.shapes = {e.hf[0]: e.hf_shapes[0] for e in entries}

    def __call__(self, name: str, rows: Optional[slice] = None, cols: Optional[slice] = None) -> torch.Tensor:
        full = self.full(name, self.shapes[name])
        return full[rows or slice(None)][:, cols or slice(None)]

    def full(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if ".lora_B." in name:
            return torch.zeros(shape)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
        bound = 1.0 / math.sqrt(shape[1])
        return torch.empty(shape).uniform_(-bound, bound, generator=gen)


def _adapter_reader(spec: LoraSpec) -> Any:
    from . import lora_io

    return lora_io.PeftReader(spec)


# ------------------------------------------------------------------------------------------ use
def adapters(chunks: list[torch.nn.Module]) -> Iterator[tuple[int, str, LoraAdapter]]:
    """(chunk index, linear name, adapter) of this rank."""
    for i, chunk in enumerate(chunks):
        for name, module in unwrap(chunk).named_modules():
            if isinstance(module, LoraAdapter):
                yield i, name.rsplit(".lora", 1)[0], module


def has_adapters(chunks: list[torch.nn.Module]) -> bool:
    return next(adapters(chunks), None) is not None


@contextlib.contextmanager
def disabled(chunks: list[torch.nn.Module]):
    """Every adapter off: the chunks compute the base model (the reference policy)."""
    found = [a for _, _, a in adapters(chunks)]
    before = [a.enabled for a in found]
    for a in found:
        a.enabled = False
    try:
        yield
    finally:
        for a, was in zip(found, before):
            a.enabled = was


class _Merged(Mapping):
    """A chunk's parameters by name, with W + scaling * B @ A in place of each adapted linear's weight
    (computed when read, one tensor at a time: never a second copy of the model)."""

    def __init__(self, params: dict[str, torch.nn.Parameter], adapted: dict[str, LoraAdapter]) -> None:
        self.params, self.adapted = params, adapted

    def __getitem__(self, name: str) -> torch.Tensor:
        p = self.params[name]
        adapter = self.adapted.get(name)
        if adapter is None or not adapter.enabled:
            return p
        with torch.no_grad():
            return p + adapter.delta_weight().to(p.dtype)

    def __iter__(self):
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)


def merged_params(chunks: list[torch.nn.Module]) -> list[Mapping[str, torch.Tensor]]:
    """Per chunk, its parameters with the adapters merged into the base weights (weights.export_hf_weights'
    `params`): the rollout engine and the merged HF export receive the model the actor computes."""
    adapted: list[dict[str, LoraAdapter]] = [{} for _ in chunks]
    for i, linear, adapter in adapters(chunks):
        adapted[i][f"{linear}.weight"] = adapter
    return [_Merged(dict(unwrap(c).named_parameters()), a) for c, a in zip(chunks, adapted)]


def adapter_params(chunks: list[torch.nn.Module]) -> list[torch.nn.Parameter]:
    return [p for _, _, a in adapters(chunks) for p in a.parameters()]
