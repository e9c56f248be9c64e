"""What every role worker does first: join torch.distributed and size this process for its slot."""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch

from hybridrl.config import RunConfig

log = logging.getLogger(__name__)


def setup_process(worker: Any, run: RunConfig) -> torch.device:
    """Join the process group (NCCL on GPU, gloo on CPU) and pick the device; returns it.

    On CPU every rank shares the machine's cores: without a thread cap, N ranks x all cores threads
    oversubscribe and a 2-core machine slows to a crawl.
    """
    worker.init_distributed(timeout_s=run.cfg.trainer.dist_timeout_s)
    if run.derived.device == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        if run.cfg.trainer.numa_affinity:
            from hybridrl.utils.affinity import bind_to_device

            cores = bind_to_device(device.index)
            log.info("trainer.numa_affinity: %s", f"pinned to {len(cores)} cores near GPU {device.index}" if cores
                     else f"nothing to pin: no NUMA cores listed for GPU {device.index}")
        return device
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", run.cfg.trainer.n_gpus_per_node)))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    return torch.device("cpu")


def load_tokenizer_for(model_dir: str, run: RunConfig) -> Any:
    from hybridrl.data.tokenizer import load_tokenizer

    path = run.cfg.data.tokenizer or model_dir
    return load_tokenizer(path, trust_remote_code=run.cfg.actor_rollout_ref.model.trust_remote_code)


def sampling_for(run: RunConfig, prompts: Any, replica: int) -> Any:
    """The sampling of one generate call (meta_info: step, draw, validate; greedy for ReMax's baselines)."""
    from hybridrl.rollout.sampling import sampling_from_config

    meta = prompts.meta_info
    sampling = sampling_from_config(run.cfg.actor_rollout_ref.rollout, bool(meta.get("validate", False)),
                                    step=int(meta.get("step", 0)), replica=replica, draw=int(meta.get("draw", 0)))
    if meta.get("greedy"):  # ReMax baselines: one greedy sample per prompt
        sampling = sampling.with_(n=1, do_sample=False, temperature=0.0)
    return sampling


def build_agent(run: RunConfig, tokenizer: Any) -> Any:
    """hybridrl.agent.AgentRollout when actor_rollout_ref.rollout.multi_turn.enable, else None."""
    multi_turn = run.cfg.actor_rollout_ref.rollout.multi_turn
    if not multi_turn.enable:
        return None
    from hybridrl.agent import AgentRollout

    return AgentRollout.from_config(multi_turn, run.cfg.data.max_response_length, tokenizer,
                                    run.cfg.data.apply_chat_template_kwargs)


@contextmanager
def onloaded(role: Any, params: bool, grads: bool, optimizer: bool) -> Iterator[None]:
    """An idle role's offloaded state (megatron.{param,grad,optimizer}_offload) on the device for the block, and
    offloaded again after it, also when the block raised. On CPU both moves are no-ops."""
    if not (params or grads or optimizer):
        yield
        return
    role.onload(params=params, grads=grads, optimizer=optimizer)
    try:
        yield
    finally:
        role.offload(params=params, grads=grads, optimizer=optimizer)


def offload_flags(megatron_cfg: Any) -> dict[str, bool]:
    return {"params": bool(megatron_cfg.param_offload), "grads": bool(megatron_cfg.grad_offload),
            "optimizer": bool(megatron_cfg.optimizer_offload)}


def build_rollout_engine(run: RunConfig, model_dir: str, hf_config: Any, tokenizer: Any, device: torch.device,
                         max_batch_rows: Any, kv_cache_bytes: Optional[int] = None) -> Any:
    """The rollout engine of this process (colocated with the actor or on its own GPU), from the job's config. The
    colocated engine takes LoRA adapters apart from the base (lora_rank > 0, lora.merge false: RolloutLora); a split
    placement's engines take broadcast full weights (validation requires lora.merge there)."""
    from hybridrl.config.lora_checks import rollout_lora
    from hybridrl.rollout.factory import build_engine

    ara, d = run.cfg.actor_rollout_ref, run.derived
    lora = None if d.placement.split else rollout_lora(ara.model)
    return build_engine(d.rollout.engine, model_dir, ara.rollout, tp_g=d.rollout.tp, tokenizer=tokenizer,
                        hf_config=hf_config, device=device, trust_remote_code=ara.model.trust_remote_code,
                        max_model_len=run.cfg.data.max_prompt_length + run.cfg.data.max_response_length,
                        max_batch_rows=max_batch_rows, lora=lora,
                        lora_base_resident=lora is not None and lora_base_resident(run, hf_config, device),
                        kv_cache_bytes=kv_cache_bytes)


def planned_kv_cache_bytes(run: RunConfig, hf_config: Any, device: torch.device,
                           gpu_memory_bytes: Optional[int] = None) -> Optional[int]:
    """rollout.kv_cache_sizing=plan on a GPU with vLLM: the KV-cache bytes `hybridrl plan` gives a GPU of
    `gpu_memory_bytes` (default: this device's), which the engine passes as vLLM's kv_cache_memory_bytes so that vLLM
    skips its memory profiling; None otherwise, or where the plan cannot read the model or leaves no room."""
    r = run.cfg.actor_rollout_ref.rollout
    if device.type != "cuda" or run.derived.rollout.engine != "vllm" or r.kv_cache_sizing != "plan":
        return None
    from hybridrl.plan.estimate import estimate
    from hybridrl.plan.model_shape import from_hf_config

    config = hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config
    try:
        total = gpu_memory_bytes or torch.cuda.get_device_properties(device).total_memory
        plan = estimate(run, from_hf_config(config), total)
    except Exception as e:  # a shape the plan cannot read: vLLM measures, as with kv_cache_sizing=profile
        log.warning("rollout.kv_cache_sizing=plan: no memory plan for this model (%s); vLLM measures the KV cache", e)
        return None
    if plan.kv_cache is None or plan.kv_cache.bytes <= 0:
        log.warning("rollout.kv_cache_sizing=plan: the plan leaves no KV cache on this GPU; vLLM measures it")
        return None
    log.info("rollout.kv_cache_sizing=plan: a KV cache of %.2f GiB (%d tokens) from the memory plan, no profiling",
             plan.kv_cache.bytes / 2**30, plan.kv_cache.tokens)
    return int(plan.kv_cache.bytes)


def lora_base_resident(run: RunConfig, hf_config: Any, device: torch.device) -> bool:
    """rollout.lora_base_resident resolved as `hybridrl plan` resolves it on this GPU (auto: the base stays on the GPU
    where every phase fits with it; hybridrl.plan.estimate.estimate). A shape the plan cannot read: level-1 sleep."""
    from hybridrl.config.lora_checks import base_resident_mode
    from hybridrl.plan.estimate import estimate
    from hybridrl.plan.model_shape import from_hf_config

    mode = base_resident_mode(run.cfg.actor_rollout_ref.rollout.lora_base_resident)
    if device.type != "cuda" or mode is not None:
        return bool(mode)
    config = hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config
    try:
        plan = estimate(run, from_hf_config(config), torch.cuda.get_device_properties(device).total_memory)
    except Exception as e:  # a shape the plan cannot read: vLLM's level-1 sleep, as before the key existed
        log.warning("rollout.lora_base_resident=auto: no memory plan for this model (%s); the LoRA base goes to host "
                    "memory at every sleep", e)
        return False
    for note in plan.notes:
        if note.startswith("LoRA:"):
            log.info("%s", note)
    return plan.rollout_base_resident
