"""Build the rollout engine a worker colocates with its actor, by `RolloutLayout.engine`."""
from __future__ import annotations

from typing import Any, Optional

import torch

from .base import RolloutEngine, eos_token_ids
from .lora import RolloutLora


def build_engine(engine: str, model_dir: str, rollout_cfg: Any, *, tp_g: int, tokenizer: Any, hf_config: Any,
                 device: torch.device, max_model_len: int, trust_remote_code: bool = False,
                 load_format: str = "dummy", max_batch_rows: Optional[int] = None,
                 lora: Optional[RolloutLora] = None, lora_base_resident: bool = False,
                 kv_cache_bytes: Optional[int] = None) -> RolloutEngine:
    """"torch": the built-in engine (CPU default; on GPU too for debugging); "vllm": vllm.LLM in this process.

    load_format "dummy": the engine starts on placeholder weights the actor replaces at every sync (the
    hybrid engine); "auto": vLLM reads model_dir's weights itself (standalone generation). The torch engine
    is always filled through load_weights. max_batch_rows: the most sequences one generate call holds on this
    replica (vLLM captures CUDA graphs up to that batch only). lora: the engine takes these LoRA adapters apart from
    the base each step (hybridrl.rollout.lora; vLLM: hybridrl.rollout.vllm_lora); None: full weights only.
    lora_base_resident: vLLM with adapters keeps its base on the GPU while asleep (vllm_lora; the torch engine always
    does). kv_cache_bytes: vLLM's KV cache size, given (rollout.kv_cache_sizing=plan) instead of measured."""
    if engine == "torch":
        from .torch_engine import TorchRolloutEngine

        if tp_g != 1 and device.type == "cuda":
            raise ValueError("actor_rollout_ref.rollout.name=torch does not shard: set "
                             "actor_rollout_ref.rollout.tensor_model_parallel_size=1 or use vllm")
        return TorchRolloutEngine.from_rollout_config(hf_config, rollout_cfg, tokenizer=tokenizer, device=device,
                                                      lora=lora)
    if engine == "vllm":
        from .vllm_engine import VLLMRolloutEngine
        from .vllm_lora import VLLMLoraEngine

        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        kwargs = dict(tp_g=tp_g, pad_token_id=pad, eos_token_ids=eos_token_ids(tokenizer, hf_config),
                      max_model_len=max_model_len, trust_remote_code=trust_remote_code, load_format=load_format,
                      max_batch_rows=max_batch_rows, kv_cache_bytes=kv_cache_bytes)
        if lora is not None:
            return VLLMLoraEngine.from_config(model_dir, rollout_cfg, lora=lora, base_resident=lora_base_resident,
                                              **kwargs)
        return VLLMRolloutEngine.from_config(model_dir, rollout_cfg, **kwargs)
    raise ValueError(f"actor_rollout_ref.rollout.name={engine!r}: unknown engine; use torch or vllm")
