"""megatron-core backend of the ActorModel / CriticModel interface (see ../base.py).

Modules (one concern each):
    compat       the ONLY place with CPU shims (gloo + fp32 without CUDA) and run-time fixes of megatron-core
    parallel     init_megatron / dispatch_info / destroy_megatron on an initialised torch.distributed
    hf_config    HF config -> ModelArch (llama, qwen2, mistral, qwen3); errors name the config field
    builder      ModelArch + layout -> GPTModel chunks (local or transformer-engine spec), ValueHead, DDP
    attention    torch SDPA as the local spec's core attention (attention_backend), fallbacks to megatron's
    mapping      THE HF <-> Megatron weight mapping (fused QKV per group, fused gate/up, vocab padding, pp/vpp)
    weights      load_hf_weights (import) and export_hf_weights (collective, bucketed export)
    forward      verl batch -> re-aligned (padded or packed THD, cp-split) micro-batches; vocab-parallel log-probs
    batching     mini-/micro-batch splitting (fixed size or token-packed)
    engine       schedules (1F1B under PP), optimizer, LR schedule, exact loss scaling contract
    phases       where one update's time goes, phase by phase, and the caching allocator's driver calls meanwhile
    role/actor/critic   MegatronActor (policy, or reference without optimizer), MegatronCritic
    reward_model MegatronRewardModel: a HF *ForSequenceClassification / *ForTokenClassification scoring last tokens
    offload      params/grads/optimizer to pinned host memory and back (GPU), one host arena per kind
    overlap      offload's copies in flight: the optimizer state back beside the forward/backward, out beside what follows
    copier       where those copies run: a side CUDA stream ordered against the compute stream by events
    pinned       page-locked host buffers of exact size (huge pages + cudaHostRegister), allocated ahead on a thread
    checkpoint   dist_checkpointing save/load across layouts, meta.json, RNG

Imports are lazy so `import hybridrl.adapters.megatron` does not pull in megatron-core.
"""
from __future__ import annotations

from typing import Any

__all__ = ["MegatronActor", "MegatronCritic"]


def __getattr__(name: str) -> Any:
    if name == "MegatronActor":
        from .actor import MegatronActor

        return MegatronActor
    if name == "MegatronCritic":
        from .critic import MegatronCritic

        return MegatronCritic
    raise AttributeError(name)
