"""LoRA adapters in a rollout engine: the adapter-only weight sync's engine side, and the torch engine's adapters.

With actor_rollout_ref.model.lora_rank > 0 and lora.merge false, the engine holds the frozen base once (the first
sync streams it) and takes only the adapters each step, keyed by PEFT's names as the actor exports them
(adapters/megatron/lora_io.export_adapter): base_model.model.<module path>.lora_A.weight [r, in] and .lora_B.weight
[out, r]. An adapted linear computes base(x) + (lora_alpha / r) * B(A(x)), as PEFT does.

The sync of one version (hybridrl.hybrid.adapter_sync): `load_adapter(bucket)` for every bucket, then
`finish_adapter_sync(version)`, which fails if an adapter tensor was not sent and makes the version the one requests
use; `adapter_checksums(names)` reads back what the engine holds. `adapter_as_held(name, t)` is what the engine
holds for a sent tensor `t` (the vLLM engine stores B pre-scaled, hybridrl/rollout/vllm_lora.py), so the sender's
checksums sum the same values; `adapters_as_held(bucket)` is the same for a whole bucket (the sync's call: the vLLM
engine does it in a few kernels, or none).

TorchAdapters puts the adapters on a transformers model with forward hooks: the base weights keep their names, so the
torch engine's load_weights, checksums and direct copy of the base are unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import torch
import torch.nn.functional as F

from hybridrl.utils.checksum import tensor_checksum

PEFT_PREFIX = "base_model.model."  # PEFT keys an adapter by the wrapped model's module path
MODEL_KEY = "actor_rollout_ref.model"


@dataclass(frozen=True)
class RolloutLora:
    """The adapters a rollout engine is built to take: rank, alpha and the HF modules that carry them."""

    rank: int
    alpha: float
    targets: tuple[str, ...]  # HF module names (q_proj, ..., down_proj), hybridrl.config.lora_checks order

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def peft_config(self) -> dict:
        """adapter_config.json's fields that vLLM's PEFTHelper reads (plain LoRA)."""
        return {"peft_type": "LORA", "r": self.rank, "lora_alpha": self.alpha, "target_modules": list(self.targets),
                "bias": "none", "use_rslora": False, "use_dora": False, "modules_to_save": None}


def peft_module(name: str) -> tuple[str, str]:
    """(module path without PEFT's prefix, "A" | "B") of a PEFT adapter tensor name; ValueError otherwise."""
    for which in ("A", "B"):
        suffix = f".lora_{which}.weight"
        if name.startswith(PEFT_PREFIX) and name.endswith(suffix):
            return name[len(PEFT_PREFIX):-len(suffix)], which
    raise ValueError(f"{name!r} is not a PEFT adapter tensor ({PEFT_PREFIX}<module>.lora_A.weight / .lora_B.weight)")


def peft_name(module: str, which: str) -> str:
    return f"{PEFT_PREFIX}{module}.lora_{which}.weight"


class AdapterLoadError(ValueError):
    """load_adapter got a name or shape the engine has no adapter for, or a sync left one out."""


class TorchAdapters:
    """LoRA adapters on a transformers causal LM's targeted nn.Linear layers, added by forward hooks.

    Every targeted linear gets A [r, in] and B [out, r] (zeros until loaded) in the model's dtype and device. A
    version is complete when every tensor arrived since the last finish (`finish`)."""

    def __init__(self, model: torch.nn.Module, spec: RolloutLora, dtype: torch.dtype, device: torch.device) -> None:
        self.spec = spec
        self.tensors: dict[str, torch.Tensor] = {}
        self._pending: set[str] = set()
        self.version: Optional[int] = None
        for path, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and path.rsplit(".", 1)[-1] in spec.targets:
                a = torch.zeros(spec.rank, module.in_features, dtype=dtype, device=device)
                b = torch.zeros(module.out_features, spec.rank, dtype=dtype, device=device)
                self.tensors[peft_name(path, "A")], self.tensors[peft_name(path, "B")] = a, b
                module.register_forward_hook(_hook(a, b, spec.scaling))
        if not self.tensors:
            raise ValueError(f"{MODEL_KEY}.target_modules={list(spec.targets)}: the rollout model "
                             f"({type(model).__name__}) has no such linear layer")

    @torch.no_grad()
    def load(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, t in tensors:
            target = self.tensors.get(name)
            if target is None:
                raise AdapterLoadError(f"load_adapter: {name!r} is no adapter of the rollout model; expected PEFT names "
                                       f"such as {next(iter(self.tensors))!r}")
            if tuple(t.shape) != tuple(target.shape):
                raise AdapterLoadError(f"load_adapter: {name!r} has shape {tuple(t.shape)}, the engine's is "
                                       f"{tuple(target.shape)} (another lora_rank, or a tensor-parallel shard?)")
            target.copy_(t)
            self._pending.add(name)

    def finish(self, version: int) -> None:
        missing = sorted(set(self.tensors) - self._pending)
        if missing:
            raise AdapterLoadError(f"the adapter sync of version {version} did not send {len(missing)} tensor(s): "
                                   f"{missing[:4]}{' ...' if len(missing) > 4 else ''}")
        self._pending.clear()
        self.version = version

    def checksums(self, names: Iterable[str]) -> dict[str, float]:
        out = {}
        for name in names:
            if name not in self.tensors:
                raise KeyError(f"adapter_checksums: no adapter tensor {name!r}")
            out[name] = float(tensor_checksum(self.tensors[name]))
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def _hook(a: torch.Tensor, b: torch.Tensor, scaling: float):
    def add_adapter(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output + scaling * F.linear(F.linear(args[0], a), b)
    return add_adapter
