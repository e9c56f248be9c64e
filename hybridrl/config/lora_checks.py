"""actor_rollout_ref.model.lora_*: which linear layers get LoRA adapters, and what LoRA cannot run with yet.

The names are HuggingFace's (what PEFT's target_modules say and what an exported adapter is keyed by);
megatron's fused layers name their groups (linear_qkv = q_proj, k_proj, v_proj; linear_fc1 = gate_proj,
up_proj), as verl's megatron LoRA config spells them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from .problems import Problems

if TYPE_CHECKING:
    from hybridrl.rollout.lora import RolloutLora

MODEL = "actor_rollout_ref.model"
RESIDENT = "actor_rollout_ref.rollout.lora_base_resident"
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# vLLM 0.26's LoRA ranks (vllm.config.lora.MaxLoRARanks): its max_lora_rank is the smallest one >= lora_rank
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
GROUPS = {"all-linear": LORA_MODULES, "linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
          "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",)}


def _names(value: Any, key: str) -> list[str]:
    """A list, a comma-separated string or one name -> HF module names; ValueError naming `key`."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in (str(i).strip() for i in items):
        if item in GROUPS:
            out += GROUPS[item]
        elif item in LORA_MODULES:
            out.append(item)
        elif item:
            raise ValueError(f"{key}: {item!r} is not one of all-linear, {', '.join(LORA_MODULES)} "
                             f"(or megatron's {', '.join(k for k in GROUPS if k != 'all-linear')})")
    return out


def lora_targets(target_modules: Any, exclude_modules: Any = None) -> tuple[str, ...]:
    """The HF module names that get adapters, in LORA_MODULES order; ValueError naming the key at fault."""
    wanted = set(_names(target_modules, f"{MODEL}.target_modules"))
    wanted -= set(_names(exclude_modules, f"{MODEL}.exclude_modules"))
    if not wanted:
        raise ValueError(f"{MODEL}.target_modules={target_modules!r} (minus exclude_modules={exclude_modules!r}) "
                         "leaves no layer for the adapters; name at least one, e.g. all-linear")
    return tuple(m for m in LORA_MODULES if m in wanted)


def rollout_lora(model: Any) -> Optional["RolloutLora"]:
    """The adapters the colocated rollout engine takes apart from the base (hybridrl/rollout/lora.py), from
    actor_rollout_ref.model: None without LoRA (lora_rank 0) or when lora.merge syncs them merged into full weights."""
    from hybridrl.rollout.lora import RolloutLora  # here: validating a config imports no torch

    if not model.lora_rank or model.lora.merge:
        return None
    return RolloutLora(int(model.lora_rank), float(model.lora_alpha),
                       lora_targets(model.target_modules, model.exclude_modules))


def base_resident_mode(value: Any) -> Optional[bool]:
    """actor_rollout_ref.rollout.lora_base_resident: None for auto (the memory plan decides), else true / false."""
    text = str(value).strip().lower()
    if text not in ("auto", "true", "false"):
        raise ValueError(f"{RESIDENT}={value!r}: use auto, true or false")
    return None if text == "auto" else text == "true"


def check_lora(cfg: Any, device: str, te_available: Callable[[], bool], p: Problems) -> None:
    """LoRA keys and the combinations that cannot run with adapters yet (each names the key to change)."""
    model = cfg.actor_rollout_ref.model
    try:
        resident = base_resident_mode(cfg.actor_rollout_ref.rollout.lora_base_resident)
    except ValueError as e:
        p.errors.append(str(e))
        resident = None
    if resident and (model.lora_rank <= 0 or model.lora.merge or not cfg.actor_rollout_ref.hybrid_engine):
        p.errors.append(f"{RESIDENT}=true keeps a LoRA base on the GPU beside the adapter-only sync "
                        f"({MODEL}.lora_rank > 0, {MODEL}.lora.merge=false, the colocated engine); this job syncs full "
                        "weights: drop it (auto)")
    if not p.check(model.lora_rank >= 0, f"{MODEL}.lora_rank={model.lora_rank} must be >= 0 (0: no LoRA)"):
        return
    if model.lora_rank == 0:
        if model.lora_adapter_path:
            p.errors.append(f"{MODEL}.lora_adapter_path is set but {MODEL}.lora_rank=0; set lora_rank to the "
                            "adapter's r")
        p.check(not model.lora.merge, f"{MODEL}.lora.merge=true but {MODEL}.lora_rank=0: there are no adapters to "
                                      "merge; set lora_rank > 0 or drop lora.merge")
        return
    p.check(model.lora_alpha > 0, f"{MODEL}.lora_alpha={model.lora_alpha} must be > 0")
    try:
        lora_targets(model.target_modules, model.exclude_modules)
    except ValueError as e:
        p.errors.append(str(e))
    impl = cfg.actor_rollout_ref.actor.megatron.transformer_impl
    te = impl == "transformer_engine" or (impl is None and device == "cuda" and te_available())
    # transformer-engine fuses the norm into linear_qkv / linear_fc1, so the layer's input is not what an
    # adapter must see; lora.py wraps the local spec's layers only.
    p.check(not te, f"{MODEL}.lora_rank={model.lora_rank}: LoRA runs on the local layer spec only for now; set "
                    "actor_rollout_ref.actor.megatron.transformer_impl=local (and the same for ref.megatron)")
    if not model.lora.merge:
        _check_adapter_sync(cfg, device, p)


def _check_adapter_sync(cfg: Any, device: str, p: Problems) -> None:
    """The adapter-only sync (lora.merge=false): the colocated engine takes PEFT adapters (hybridrl/rollout/lora.py)."""
    model, ara = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref
    p.check(ara.hybrid_engine, f"{MODEL}.lora_rank={model.lora_rank} with actor_rollout_ref.hybrid_engine=false: the "
                               "rollout workers take broadcast full weights, not adapters; set "
                               f"{MODEL}.lora.merge=true (the adapters merged into the base for the broadcast)")
    engine = ara.rollout.name if ara.rollout.name != "auto" else ("vllm" if device == "cuda" else "torch")
    if engine == "vllm":
        p.check(model.lora_rank <= max(VLLM_LORA_RANKS),
                f"{MODEL}.lora_rank={model.lora_rank}: vLLM's LoRA takes ranks up to {max(VLLM_LORA_RANKS)}; lower "
                f"it or set {MODEL}.lora.merge=true (full weights synced, no vLLM adapter)")
    elif engine != "torch":
        p.errors.append(f"{MODEL}.lora_rank={model.lora_rank}: the rollout engine {engine!r} cannot take LoRA "
                        f"adapters (vllm and torch can); set {MODEL}.lora.merge=true to sync merged full weights")
