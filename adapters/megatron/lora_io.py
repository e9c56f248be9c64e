"""LoRA adapters in and out: PEFT adapter folders (import and export) and the checkpoint's adapter tensors.

A PEFT adapter folder is adapter_config.json + adapter_model.safetensors keyed by PEFT's names
(base_model.model.model.layers.<i>.self_attn.q_proj.lora_A.weight, ...): mapping.lora_plan gives every
adapter parameter its name, so import, export and checkpoints go through the one mapping like the base.
Checkpoints hold the adapters only, keyed by those names (layout-free, so a tp2 save loads at tp1); the
frozen base comes from the HF folder the actor was built from, recorded in meta.json.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist

from hybridrl.config.layout import ParallelLayout
from hybridrl.config.lora_checks import lora_targets

from .builder import unwrap
from .hf_config import ModelArch
from .hf_io import SafetensorsReader
from .lora import MODEL_KEY, LoraSpec, adapters
from .mapping import Entry, Topology, lora_plan, shards_to_hf

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


# ------------------------------------------------------------------------------------------ PEFT folders
def read_peft_config(folder: str) -> dict:
    path = os.path.join(os.path.expanduser(folder), CONFIG)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{MODEL_KEY}.lora_adapter_path={folder}: no {CONFIG} (a PEFT adapter folder holds "
                                f"{CONFIG} and {WEIGHTS})")
    with open(path) as f:
        return json.load(f)


def check_peft_config(config: dict, spec: LoraSpec, folder: str) -> None:
    """The adapter must be the LoRA the keys describe: plain LoRA, same r, alpha and modules."""
    where = f"{MODEL_KEY}.lora_adapter_path={folder}"
    if config.get("peft_type", "LORA") != "LORA" or config.get("use_dora") or config.get("use_rslora"):
        raise ValueError(f"{where}: only plain LoRA adapters load (peft_type LORA, no DoRA, no rsLoRA)")
    if config.get("bias", "none") != "none" or config.get("lora_bias") or config.get("modules_to_save"):
        raise ValueError(f"{where}: adapters with trained biases or modules_to_save are not supported")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError(f"{where}: per-layer rank_pattern / alpha_pattern are not supported")
    if int(config.get("r", 0)) != spec.rank:
        raise ValueError(f"{where} has r={config.get('r')}; set {MODEL_KEY}.lora_rank={config.get('r')}")
    if float(config.get("lora_alpha", 0)) != spec.alpha:
        raise ValueError(f"{where} has lora_alpha={config.get('lora_alpha')}; set "
                         f"{MODEL_KEY}.lora_alpha={config.get('lora_alpha')}")
    theirs = lora_targets(config.get("target_modules"), config.get("exclude_modules"))
    if theirs != spec.targets:
        raise ValueError(f"{where} adapts {', '.join(theirs)}; set {MODEL_KEY}.target_modules=[{','.join(theirs)}] "
                         f"(now {', '.join(spec.targets)})")


class PeftReader(SafetensorsReader):
    """A mapping.Reader over a PEFT adapter folder whose config matches the spec."""

    def __init__(self, spec: LoraSpec) -> None:
        check_peft_config(read_peft_config(spec.adapter_path), spec, spec.adapter_path)
        super().__init__(spec.adapter_path)


def export_adapter(chunks: list[torch.nn.Module], arch: ModelArch, layout: ParallelLayout, spec: LoraSpec,
                   bucket_bytes: int = 512 << 20) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Collective: every adapter as (PEFT name, full tensor) buckets on every rank (weights.export_hf_weights over
    mapping.lora_plan's rows): what a PEFT folder holds, and what an adapter-only weight sync would send."""
    from .weights import export_hf_weights

    topo = Topology(tp=layout.tp, pp=layout.pp, vpp=layout.vpp)
    return export_hf_weights(chunks, arch, layout, bucket_bytes, entries=lora_plan(arch, topo, spec.rank, spec.targets))


class AdapterExport:
    """export_adapter() for an actor that exports its adapters every step (the adapter-only weight sync), planned once.

    Every export walked the whole model's parameters three times (names, dtype, topology) and cut each adapter's
    views again. Where the export is local (one tp rank and one pipeline stage: the full tensors are the parameters
    themselves, reshaped), its buckets are the same views every step: they are cut once per bucket size, and each
    export first checks that every view still starts where its parameter's data does (offload/onload resize the
    parameters' storages in place, which the views follow; a parameter given new storage fails the check and the
    plan is cut again), so a stale view is never sent (the sync's checksums are taken from what is sent, and could
    not tell). Elsewhere (tp or pp > 1: gathers, collective) export_hf_weights runs each time with the walks' results
    kept."""

    def __init__(self, chunks: list[torch.nn.Module], arch: ModelArch, layout: ParallelLayout, spec: LoraSpec) -> None:
        from .weights import _params, topology

        self.chunks, self.arch, self.layout = chunks, arch, layout
        self.topo = topology(chunks, layout, value_head=False)
        self.entries = [e for e in lora_plan(arch, Topology(tp=layout.tp, pp=layout.pp, vpp=layout.vpp), spec.rank,
                                             spec.targets) if e.export]
        self.params = _params(chunks)
        self.dtype = next(iter(self.params[0].values())).dtype
        self.local = layout.tp == 1 and layout.pp == 1
        self._plans: dict[int, _LocalPlan] = {}

    def buckets(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        from .weights import export_hf_weights

        if not self.local:
            return export_hf_weights(self.chunks, self.arch, self.layout, bucket_bytes, entries=self.entries,
                                     params=self.params, topo=self.topo, dtype=self.dtype)
        plan = self._plans.get(bucket_bytes)
        if plan is None or not plan.current():
            plan = self._plans[bucket_bytes] = self._plan(bucket_bytes)
        return (list(bucket) for bucket in plan.buckets)

    def _plan(self, bucket_bytes: int) -> "_LocalPlan":
        from .weights import _buckets, _param

        buckets, params, views = [], [], []
        for group in _buckets(self.entries, None, self.dtype.itemsize, bucket_bytes):
            bucket = []
            for entry in group:
                param = _param(self.params, entry)
                tensors = shards_to_hf(entry, [param.detach()], self.arch)
                for _, view in tensors:
                    if view.data_ptr() != param.data_ptr() or view.numel() != param.numel():
                        raise AssertionError(f"AdapterExport: {entry.hf} is not a view of its parameter {entry.mcore} "
                                             "at tp 1, pp 1")
                    params.append(param)
                    views.append(view)
                bucket += tensors
            buckets.append(bucket)
        return _LocalPlan(buckets, params, views)


@dataclass
class _LocalPlan:
    buckets: list[list[tuple[str, torch.Tensor]]]
    params: list[torch.Tensor]
    views: list[torch.Tensor]

    def current(self) -> bool:
        """Every view still starts at its parameter's data (two lists of addresses: no aten op per tensor)."""
        return [p.data_ptr() for p in self.params] == [v.data_ptr() for v in self.views]


def write_peft_adapter(chunks: list[torch.nn.Module], arch: ModelArch, layout: ParallelLayout, spec: LoraSpec,
                       out: str, base_model: Optional[str] = None) -> Optional[list[str]]:
    """Collective: gather every adapter under PEFT's names and, on global rank 0, write `out`/adapter_config.json
    and adapter_model.safetensors (float32). Returns the tensor names written on rank 0, None elsewhere."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for bucket in export_adapter(chunks, arch, layout, spec):
        tensors.update({n: t.detach().to("cpu", torch.float32).contiguous() for n, t in bucket})
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(out, CONFIG), "w") as f:
        json.dump(peft_config(spec, base_model), f, indent=2)
    return sorted(tensors)


def peft_config(spec: LoraSpec, base_model: Optional[str]) -> dict:
    """adapter_config.json as PEFT (and vLLM's LoRA loader) read it."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": spec.rank, "lora_alpha": spec.alpha, "target_modules": list(spec.targets), "lora_dropout": 0.0,
            "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
            "revision": None}


# ------------------------------------------------------------------------------------------ checkpoints
def _local_entries(chunks: list[torch.nn.Module], arch: ModelArch, layout: ParallelLayout,
                   spec: LoraSpec) -> list[Entry]:
    from megatron.core import parallel_state as ps

    pp_rank = ps.get_pipeline_model_parallel_rank()
    topo = Topology(tp=layout.tp, pp=layout.pp, vpp=layout.vpp)
    return [e for e in lora_plan(arch, topo, spec.rank, spec.targets) if e.pp_rank == pp_rank]


def sharded_state_dict(chunks: list[torch.nn.Module], arch: ModelArch, layout: ParallelLayout,
                       spec: LoraSpec) -> dict[str, Any]:
    """The adapters as megatron ShardedTensors keyed by PEFT name (checkpoint.py's "model" under LoRA): column
    B split on dim 0 and row A on dim 1 over tp, the rest replicated."""
    from megatron.core.utils import make_sharded_tensor_for_checkpoint, make_tp_sharded_tensor_for_checkpoint

    params = [dict(unwrap(c).named_parameters()) for c in chunks]
    out: dict[str, Any] = {f"chunk{i}": {} for i in range(len(chunks))}
    for e in _local_entries(chunks, arch, layout, spec):
        p, key = params[e.vp_stage][e.mcore], "lora." + e.hf[0]
        if e.kind == "replicated":
            sharded = make_sharded_tensor_for_checkpoint(p, key)
        else:
            sharded = make_tp_sharded_tensor_for_checkpoint(p, key, tp_axis=0 if e.kind == "column" else 1)
        out[f"chunk{e.vp_stage}"][e.mcore] = sharded
    return out


def load_state_dict(chunks: list[torch.nn.Module], state: dict[str, Any]) -> None:
    """Copy loaded adapter tensors (sharded_state_dict's structure) into the adapters; every adapter must be there."""
    for i, chunk in enumerate(chunks):
        params = dict(unwrap(chunk).named_parameters())
        mine = {n for _, linear, a in adapters([chunk]) for n, _ in a.named_parameters(prefix=f"{linear}.lora")}
        loaded = state.get(f"chunk{i}", {})
        if set(loaded) != mine:
            raise ValueError(f"checkpoint adapters do not match the model's (missing {sorted(mine - set(loaded))[:3]}, "
                             f"extra {sorted(set(loaded) - mine)[:3]}); resume with the same {MODEL_KEY}.lora_rank "
                             "and target_modules")
        with torch.no_grad():
            for name, tensor in loaded.items():
                params[name].copy_(tensor)
