"""vLLM 0.26 with LoRA adapters: the adapter-only weight sync's vLLM side (GPU only; hybridrl/rollout/lora.py says
what the sync does, hybridrl/hybrid/adapter_sync.py its order).

The engine is vllm.LLM built with enable_lora (max_loras = max_cpu_loras = 1, max_lora_rank the smallest rank vLLM
allows >= lora_rank, lora_target_modules the vLLM modules our HF targets live in: q/k/v -> qkv_proj, o_proj,
gate/up -> gate_up_proj, down_proj). vLLM wraps exactly those modules; their base weight becomes
`<module>.base_layer.weight`, so the base's load_weights, views and checksums see the parameters renamed back to HF's
layout (`_BaseNames`, `base_layer_name`).

One adapter, id ADAPTER_ID, lives in GPU slot buffers of the wrapped modules (lora_a_stacked [slots, 1, max_rank,
in_local], lora_b_stacked [slots, 1, out_local, max_rank] per packed member):
  first version   the PEFT-named tensors become an in-memory vLLM LoRAModel (LoRAModel.from_lora_tensors on the GPU,
                  vLLM's own packing, B pre-scaled by lora_alpha / r, its tp slicing in set_lora), registered and
                  activated through the model's LoRA manager; no adapter folder, no patch of vLLM
  then            the slot views each tensor landed in are proven: equal, bitwise, to what `_SlotPlace.write` would
                  write (the tensor's tp block, in the LoRA dtype, B times the scaling). If proven, every later
                  version is written straight into those views as its buckets arrive (in place: the base and the
                  registration stay as they are); otherwise each version is registered anew as the first was.
Requests carry LoRARequest(name "hybridrl-v<version>", ADAPTER_ID): the id is registered, so vLLM never reads the
placeholder path; the name changes with the version because vLLM's prefix cache keys blocks by it.

Sleep: the base is loaded once, so it must survive the engine's sleep (level 2 would discard it). With `base_resident`
(rollout.lora_base_resident, resolved by the memory plan: hybridrl.plan.estimate) the base and the adapter slots stay
mapped on the GPU and the sleep frees the KV cache alone (vllm_kv_sleep.py): no copy of the base at any sleep or
wake. Without it the engine sleeps at level 1, vLLM's own offload of the weights and slots to host memory and back
(0.42 s + 0.49 s a step for the 7B on an H100). free_cache_engine=false keeps everything on the GPU, KV cache too.

Invariant of the in-place path: nothing re-activates the registered LoRAModel (which keeps the first version's
tensors) between syncs: one adapter in one slot, no LRU eviction, and either sleep leaves the slots as they were.
The checks read the slots back (`adapter_checksums`), so a re-activation would show at the next sync's check.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch

from hybridrl.utils.checksum import checksums
from hybridrl.utils.device import synchronize

from .lora import AdapterLoadError, RolloutLora, peft_module, peft_name
from .vllm_engine import VLLMRolloutEngine
from .vllm_kv_sleep import allocator_ops, set_kv_mapped
from .vllm_weights import _vllm_name

log = logging.getLogger(__name__)
ADAPTER_ID = 1
ADAPTER_PATH = "hybridrl://in-memory"  # never read: the id is registered before any request names it
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks (0.26)
VLLM_MODULE = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "o_proj": "o_proj",
               "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"}
BASE_LAYER = ".base_layer"
B_WEIGHT = ".lora_B.weight"  # the end of a PEFT B tensor's name (rollout.lora.peft_name)


def vllm_lora_kwargs(lora: RolloutLora) -> dict[str, Any]:
    """vllm.LLM's LoRA arguments for these adapters."""
    rank = next((r for r in VLLM_LORA_RANKS if r >= lora.rank), None)
    if rank is None:
        raise ValueError(f"actor_rollout_ref.model.lora_rank={lora.rank}: vLLM takes LoRA ranks up to "
                         f"{VLLM_LORA_RANKS[-1]}; set actor_rollout_ref.model.lora.merge=true")
    return {"enable_lora": True, "max_loras": 1, "max_cpu_loras": 1, "max_lora_rank": rank,
            "lora_target_modules": sorted({VLLM_MODULE[m] for m in lora.targets})}


def base_layer_name(hf_name: str, wrapped: set[str]) -> str:
    """The name vLLM's load_weights takes for HF weight `hf_name` when its module carries LoRA (`wrapped`: the vLLM
    module paths whose base moved to .base_layer): model.layers.0.self_attn.q_proj.weight ->
    model.layers.0.self_attn.q_proj.base_layer.weight (vLLM's mapper then stacks q_proj into qkv_proj)."""
    vname, _, _ = _vllm_name(hf_name)
    module, leaf = hf_name.rsplit(".", 1)
    if vname.rsplit(".", 1)[0] not in wrapped:
        return hf_name
    return f"{module}{BASE_LAYER}.{leaf}"


class _BaseNames:
    """A vLLM model whose named_parameters() call the LoRA-wrapped modules' base weights by their own names, so the
    engine's views and checksums of the base (vllm_weights.py) find them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def named_parameters(self, *args: Any, **kwargs: Any):
        for name, p in self.model.named_parameters(*args, **kwargs):
            yield name.replace(BASE_LAYER + ".", "."), p


def wrapped_modules(model: torch.nn.Module) -> set[str]:
    return {name.split(BASE_LAYER + ".")[0] for name, _ in model.named_parameters() if BASE_LAYER + "." in name}


# ------------------------------------------------------------------------------------------ slots
@dataclass(frozen=True)
class _SlotPlace:
    """Where one PEFT adapter tensor sits in this tp rank's slot: `dst` (a view of the slot buffer) holds
    full.narrow(dim, start, length) (dim None: all of it) in the LoRA dtype, times `scale` (B: lora_alpha / r)."""

    dst: torch.Tensor
    dim: Optional[int]
    start: int
    length: int
    scale: float
    full_numel: int
    tp: int

    def source(self, full: torch.Tensor) -> torch.Tensor:
        return full if self.dim is None else full.narrow(self.dim, self.start, self.length)

    @torch.no_grad()
    def expected(self, full: torch.Tensor) -> torch.Tensor:
        """What vLLM holds for `full`: LoRAModel.from_lora_tensors casts, LoRALayerWeights.optimize scales B in place
        (skipped at scale 1), set_lora copies the tp block."""
        held = self.source(full).to(self.dst.dtype)
        return held * self.scale if self.scale != 1 else held

    @torch.no_grad()
    def write(self, full: torch.Tensor) -> None:
        self.dst.copy_(self.source(full))
        if self.scale != 1:
            self.dst.mul_(self.scale)

    def total_factor(self) -> float:
        """Sum over tp ranks of the local sums, times this, is the sum of the whole tensor as held: pieces split over
        ranks count once each, replicated ones (A of column-parallel layers, replicated KV heads) once per copy."""
        return self.full_numel / (self.dst.numel() * self.tp)


@torch.no_grad()
def write_places(pairs: list[tuple[_SlotPlace, torch.Tensor]]) -> None:
    """The in-place update of one bucket: the same values as _SlotPlace.write, in a few kernels (one _foreach_copy_
    per source dtype, one _foreach_mul_ per scale) instead of a copy and a multiply per tensor."""
    by_dtype: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    by_scale: dict[float, list[torch.Tensor]] = {}
    for place, full in pairs:
        dsts, srcs = by_dtype.setdefault(full.dtype, ([], []))
        dsts.append(place.dst)
        srcs.append(full if place.dim is None else full.narrow(place.dim, place.start, place.length))  # place.source
        if place.scale != 1:
            by_scale.setdefault(place.scale, []).append(place.dst)
    for dsts, srcs in by_dtype.values():
        torch._foreach_copy_(dsts, srcs)
    for scale, dsts in by_scale.items():
        torch._foreach_mul_(dsts, scale)


def _block(local: int, full: int, tp: int, tp_rank: int) -> Optional[tuple[int, int]]:
    """(start, length) of this rank's block along a dim vLLM splits `full` into pieces of `local`; None: not a split
    this code knows (vLLM replicates KV heads when there are fewer than tp ranks: a block then serves tp // blocks
    consecutive ranks, as vLLM's kv_shard_id = tp_rank // num_kv_head_replicas)."""
    if local == full:
        return 0, full
    if local <= 0 or full % local or tp % (full // local):
        return None
    replicas = tp // (full // local)
    return (tp_rank // replicas) * local, local


def slot_places(manager: Any, shapes: dict[str, tuple[int, ...]], lora_id: int, scaling: float, tp: int,
                tp_rank: int) -> dict[str, Optional[_SlotPlace]]:
    """Each PEFT tensor's place in the slot vLLM's LoRA manager gave `lora_id` on this tp rank (None where its layout
    is not the plain one above). `manager`: vLLM's LoRAModelManager (modules: vLLM module path -> LoRA layer with
    lora_a_stacked / lora_b_stacked per slice; packed_modules: packed path -> member paths; lora_index_to_id)."""
    index = manager.lora_index_to_id.index(lora_id)
    member = {m: (packed, i) for packed, members in manager.packed_modules.items() for i, m in enumerate(members)}
    out: dict[str, Optional[_SlotPlace]] = {}
    for name, shape in shapes.items():
        path, which = peft_module(name)
        module, piece = member.get(path, (path, 0))
        layer = manager.modules.get(module)
        if layer is None:
            raise AdapterLoadError(f"vLLM has no LoRA layer for {name!r} (looked for {module}); its LoRA modules: "
                                   f"{sorted(manager.modules)[:4]} ...")
        if which == "A":  # [max_rank, in_local] -> the first r rows
            slot = layer.lora_a_stacked[piece][index, 0]
            dst, dim, local = slot[: shape[0]], 1, slot.shape[1]
        else:  # [out_local, max_rank] -> the first r columns
            slot = layer.lora_b_stacked[piece][index, 0]
            dst, dim, local = slot[:, : shape[1]], 0, slot.shape[0]
        block = _block(local, shape[dim], tp, tp_rank)
        if block is None or dst.shape[1 - dim] != shape[1 - dim]:
            out[name] = None
            continue
        start, length = block
        out[name] = _SlotPlace(dst, None if length == shape[dim] else dim, start, length,
                               scaling if which == "B" else 1.0, shape[0] * shape[1], tp)
    return out


def adapter_names(manager: Any, targets: tuple[str, ...]) -> frozenset[str]:
    """Every PEFT tensor the adapters of `targets` have in vLLM's wrapped modules (packed ones by their members)."""
    modules: list[str] = []
    for path in manager.modules:
        modules += manager.packed_modules.get(path, [path])
    return frozenset(peft_name(m, w) for m in modules if m.rsplit(".", 1)[-1] in targets for w in ("A", "B"))


def register(manager: Any, tensors: dict[str, torch.Tensor], lora: RolloutLora, lora_id: int) -> None:
    """Put `tensors` (PEFT names, full) in as adapter `lora_id` through vLLM's own loader, replacing what was there:
    an in-memory LoRAModel on the manager's device (no folder, no host copy), registered and activated into a slot."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    helper = PEFTHelper.from_dict(lora.peft_config())
    helper.validate_legal(manager.lora_config)
    model = manager.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is not None:  # vLLM's worker does the same: member names (q_proj) must survive for the packing
        mapper = mapper.get_unstacked_mapper()
    adapter = LoRAModel.from_lora_tensors(lora_model_id=lora_id, tensors=tensors, peft_helper=helper,
                                          device=str(manager.device), dtype=manager.lora_config.lora_dtype,
                                          weights_mapper=mapper, skip_prefixes=getattr(model, "lora_skip_prefixes", None))
    manager.remove_adapter(lora_id)
    manager.add_adapter(adapter)
    manager.activate_adapter(lora_id)


def _after_kv_wake(worker: Any) -> None:
    """What vLLM's worker does after mapping its KV cache back (gpu_worker.wake_up): a quantized KV cache is zeroed
    and its scales reset."""
    worker.model_runner.post_kv_cache_wake_up()


# ------------------------------------------------------------------------------------------ the engine
class VLLMLoraEngine(VLLMRolloutEngine):
    """The colocated vLLM engine with one LoRA adapter updated in place each step (module docstring)."""

    def __init__(self, model_dir: str, *, lora: RolloutLora, engine_kwargs: Optional[dict[str, Any]] = None,
                 base_resident: bool = False, **kwargs: Any) -> None:
        """base_resident: the base stays on the GPU while the engine sleeps, only the KV cache is freed (module
        docstring); false: vLLM's level-1 sleep."""
        user = dict(engine_kwargs or {})
        if user.get("fully_sharded_loras"):
            raise ValueError("actor_rollout_ref.rollout.engine_kwargs.vllm.fully_sharded_loras: the adapter sync "
                             "writes vLLM's default (partly sharded) LoRA layout only; drop it")
        super().__init__(model_dir, engine_kwargs={**user, **vllm_lora_kwargs(lora)}, **kwargs)
        self.lora = lora
        self.base_resident = base_resident
        self._kv_ops = allocator_ops() if base_resident else None  # a vLLM whose allocator differs fails here
        self.sleeps = {"kv_only": 0, "level1": 0}  # how this engine slept so far (the GPU test reads it)
        self._wrapped: set[str] = self.llm.apply_model(wrapped_modules)[0]
        self._names: frozenset[str] = self.llm.apply_model(
            lambda model: adapter_names(model.lora_manager, lora.targets))[0]
        self._dtype: torch.dtype = self.llm.apply_model(lambda model: model.lora_manager.lora_config.lora_dtype)[0]
        self._shapes: dict[str, tuple[int, ...]] = {}  # of the first version: every later one must match
        self._pending: dict[str, torch.Tensor] = {}  # the version being synced, while it goes through vLLM's loader
        self._written: set[str] = set()  # the version being synced, written in place
        self._places: Optional[dict[str, Optional[_SlotPlace]]] = None  # after the first version
        self._in_place = False  # proven: later versions go straight into the slots
        self._version: Optional[int] = None

    # ------------------------------------------------------------------ the base
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights([(base_layer_name(n, self._wrapped), t) for n, t in weights])

    def _model(self, model: Any) -> Any:
        return _BaseNames(model)

    def sleep(self, level: int = 1) -> None:
        """The base (and the adapter slots) must come back as they were, not be reloaded: resident, only the KV cache
        is freed; else level 1 always."""
        if not self.base_resident:
            super().sleep(level=1)
            self.sleeps["level1"] += 1
            return
        if self._asleep:
            return
        if not self.llm.reset_prefix_cache():  # the KV is discarded: no block may be found by its hash again
            raise RuntimeError("VLLMLoraEngine.sleep: vLLM refused to reset its prefix cache (requests still running)")
        synchronize()  # nothing may still read the KV cache when its memory goes
        allocator, unmap, create = self._kv_ops
        set_kv_mapped(allocator, False, unmap, create)
        torch.cuda.empty_cache()  # as vLLM's sleep: the generation's cached blocks go back too
        self._asleep, self._kv_awake = True, False
        self.sleeps["kv_only"] += 1

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Resident base: "weights" are awake already; "kv_cache" maps the KV cache back at its addresses."""
        if not self.base_resident:
            super().wake_up(tags)
            return
        if tags is None or "kv_cache" in tags:
            allocator, unmap, create = self._kv_ops
            if set_kv_mapped(allocator, True, unmap, create):
                self.llm.collective_rpc(_after_kv_wake)
            self._kv_awake = True
        self._asleep = False

    # ------------------------------------------------------------------ the adapters
    def load_adapter(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        bucket = list(tensors)
        names = [name for name, _ in bucket]
        if not self._names.issuperset(names):
            name = next(n for n in names if n not in self._names)
            raise AdapterLoadError(f"load_adapter: {name!r} is no adapter of vLLM's LoRA modules (targets "
                                   f"{list(self.lora.targets)}); e.g. {min(self._names)!r}")
        if self._in_place:
            shapes = self._shapes
            for name, t in bucket:
                if t.shape != shapes[name]:  # torch.Size against the first version's tuple
                    raise AdapterLoadError(f"load_adapter: {name!r} has shape {tuple(t.shape)}, the first version's "
                                           f"was {shapes[name]}")
            places = self._places
            write_places([(places[n], t) for n, t in bucket])
            self._written.update(names)
        else:  # the export may alias the actor's parameters: vLLM's loader scales B in place
            self._pending.update((n, t.detach().clone()) for n, t in bucket)

    def finish_adapter_sync(self, version: int) -> None:
        got = self._written if self._in_place else set(self._pending)
        missing = sorted(self._names - got)
        if missing:
            self._pending.clear()
            self._written.clear()
            raise AdapterLoadError(f"the adapter sync of version {version} did not send {len(missing)} tensor(s): "
                                   f"{missing[:4]}{' ...' if len(missing) > 4 else ''}")
        if not self._in_place:
            self._load_through_vllm()
        self._written.clear()
        self._version = version

    def _load_through_vllm(self) -> None:
        """vLLM's loader for this version; after the first one, the slot views proven for the in-place writes."""
        pending, self._pending = self._pending, {}
        first = self._places is None
        if first:
            self._shapes = {n: tuple(t.shape) for n, t in pending.items()}
        expected = dict(pending) if first else None
        clones = {n: t.clone() for n, t in pending.items()} if first else pending
        self.llm.apply_model(lambda model: register(model.lora_manager, clones, self.lora, ADAPTER_ID))
        if first:
            self._places = self._find_places()
            self._in_place = self._prove(expected)

    def _find_places(self) -> dict[str, Optional[_SlotPlace]]:
        rank, shapes, lora = self._tp_rank(), self._shapes, self.lora
        return self.llm.apply_model(lambda model: slot_places(model.lora_manager, shapes, ADAPTER_ID, lora.scaling,
                                                              self.tp_size, rank))[0]

    def _tp_rank(self) -> int:
        from vllm.distributed import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()

    @torch.no_grad()
    def _prove(self, full: dict[str, torch.Tensor]) -> bool:
        """Every slot view equals what the in-place write would put there (bitwise); else vLLM's loader every version."""
        failed = [n for n, place in self._places.items()
                  if place is None or not torch.equal(place.dst, place.expected(full[n]))]
        if failed:
            log.warning("vLLM LoRA: %d of %d adapter tensors are not where the in-place update would write them (e.g. "
                        "%s); every version goes through vLLM's loader instead", len(failed), len(self._places),
                        failed[0])
        else:
            log.info("vLLM LoRA: %d adapter tensors proven in their slots; later versions are written in place",
                     len(self._places))
        return not failed

    def adapter_as_held(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        held = tensor.to(self._dtype)
        return held * self.lora.scaling if peft_module(name)[1] == "B" and self.lora.scaling != 1 else held

    @torch.no_grad()
    def adapters_as_held(self, bucket: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """adapter_as_held's values for a bucket: nothing to do where the actor sends the LoRA dtype and the scaling is
        1 (the 7B row), else a cast where the dtypes differ and one _foreach_mul for the B tensors (bitwise what
        `held * scaling` gives: both multiply in float32 and round once)."""
        dtype, scaling = self._dtype, self.lora.scaling
        held = [(n, t if t.dtype == dtype else t.to(dtype)) for n, t in bucket]
        if scaling == 1:
            return held
        at = [i for i, (n, _) in enumerate(held) if n.endswith(B_WEIGHT)]
        for i, t in zip(at, torch._foreach_mul([held[i][1] for i in at], scaling)):
            held[i] = (held[i][0], t)
        return held

    @torch.no_grad()
    def adapter_checksums(self, names: Iterable[str]) -> dict[str, float]:
        """Float64 sums of the slots' contents as vLLM holds them, over the replica's tp ranks."""
        wanted = list(names)
        if not wanted:
            return {}
        known = self._places or {}
        places = [known.get(n) for n in wanted]
        if any(p is None for p in places):
            raise KeyError(f"adapter_checksums: no slot view for {[n for n, p in zip(wanted, places) if p is None][:3]}")
        local = checksums([p.dst for p in places])[0]  # a few kernels for the hundreds of slots, not two a slot
        if self.tp_size > 1:
            from .vllm_weights import _tp_group

            every = torch.empty(self.tp_size, len(places), dtype=local.dtype, device=local.device)
            torch.distributed.all_gather_into_tensor(every, local[None], group=_tp_group())
            local = every.sum(0)
        factors = [p.total_factor() for p in places]
        if any(f != 1 for f in factors):  # a slot holds part of its tensor, or a copy of it (tp > 1)
            local = local * torch.tensor(factors, dtype=local.dtype, device=local.device)
        return dict(zip(wanted, local.cpu().tolist()))

    def _request_kwargs(self) -> dict[str, Any]:
        from vllm.lora.request import LoRARequest

        if self._version is None:
            raise RuntimeError("VLLMLoraEngine: no adapter was synced yet (load_adapter + finish_adapter_sync first)")
        return {"lora_request": LoRARequest(lora_name=f"hybridrl-v{self._version}", lora_int_id=ADAPTER_ID,
                                            lora_path=ADAPTER_PATH)}
