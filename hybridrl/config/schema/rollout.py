"""actor_rollout_ref.rollout.*: generation engine and sampling."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .common import doc, link


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling used by validation (verl's rollout.val_kwargs)."""

    top_k: int = -1
    top_p: float = 1.0
    temperature: float = 0.0
    n: int = 1
    do_sample: bool = False


@dataclass(frozen=True)
class SyncCheckConfig:
    """Checks that the rollout engine holds the actor's weights after each sync."""

    enable: bool = doc("Checksum the rollout weights against the actor's after every sync.", True)
    sample_fraction: float = doc("Fraction of tensors checksummed per sync (1.0: all).", 1.0)


@dataclass(frozen=True)
class MultiTurnConfig:
    """Multi-turn rollouts with tools and user-side interactions (verl's rollout.multi_turn; hybridrl.agent)."""

    enable: bool = doc("Run each sample through the agent loop (turns, tool calls, interactions).", False)
    max_assistant_turns: Optional[int] = doc("Most assistant turns per sample (null: until the response budget).", None)
    max_user_turns: Optional[int] = doc("Most interaction (user) turns per sample (null: no limit).", None)
    max_parallel_calls: int = doc("Tool calls run per assistant turn (the rest are dropped).", 1)
    max_tool_response_length: int = doc("Characters of one tool observation kept.", 256)
    tool_response_truncate_side: str = doc("left | right | middle: where a long observation is cut.", "middle")
    tool_config_path: Optional[str] = doc("verl tool file: tools: [{class_name, config, tool_schema}].", None)
    interaction_config_path: Optional[str] = doc("verl interaction file: interaction: [{name, class_name, config}].",
                                                 None)
    format: str = doc("Tool-call format in the model's text: hermes (<tool_call>{json}</tool_call>).", "hermes")
    tool_timeout_s: float = doc("Seconds a tool call may take before it becomes an error observation.", 30.0)


@dataclass(frozen=True)
class RolloutConfig:
    name: str = doc("auto | vllm | torch (auto: vllm on GPU, the built-in torch engine on CPU).", "auto")
    mode: str = doc("sync (the colocated hybrid engine); async is accepted and runs synchronously.", "sync")
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    prompt_length: int = link("data.max_prompt_length")
    response_length: int = link("data.max_response_length")
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = doc("Fraction of GPU memory vLLM may take for weights + KV cache.", 0.5)
    ignore_eos: bool = False
    enforce_eager: bool = doc("vLLM without CUDA graphs or torch.compile (faster start, slower decode); false is "
                              "vLLM's default and what benchmarks measure.", False)
    cudagraph_capture_sizes: Optional[list[int]] = doc(
        "Batch sizes vLLM captures CUDA graphs for; null: vLLM's sizes up to the largest batch a replica generates "
        "(train_batch_size x n or a validation batch, per replica), not its default list up to 512.", None)
    free_cache_engine: bool = doc("Sleep the engine (free weights + KV cache) after each generation.", True)
    kv_cache_sizing: str = doc(
        "remember | profile | plan. How vLLM sizes its KV cache at start-up (gpu_memory_utilization's share of the "
        "GPU less weights and activations). profile: vLLM measures it every start (a profiling forward, then a "
        "capture of two CUDA graphs per mode for their memory). remember: vLLM measures it once per machine and "
        "engine config and later starts reuse that size (vLLM's VLLM_ENABLE_STARTUP_PLAN, kept beside its compile "
        "cache) while the GPU has at least as much free memory as then, else measure again. plan: the size "
        "`hybridrl plan` gives (its rollout_kv_cache), no measurement at all; an activation estimate below vLLM's "
        "real peak can run out of memory mid-rollout. engine_kwargs.vllm.kv_cache_memory_bytes overrides all three. "
        "profile stays the default until remember has run on a GPU (the startup_smol row measures it).",
        "profile")
    lora_base_resident: str = doc(
        "auto | true | false. LoRA with the adapter-only sync (model.lora_rank > 0, lora.merge=false) on vLLM: the "
        "frozen base stays on the GPU while the engine sleeps and only the KV cache is freed, so no sleep or wake "
        "copies it (false: vLLM's level-1 sleep, the base to host memory and back every step). auto: true when "
        "`hybridrl plan` finds every phase fits with the base counted in the training phases, else false.", "auto")
    tensor_model_parallel_size: int = doc("tp_g: GPUs per rollout replica.", 2)
    nnodes: int = doc("Nodes of the rollout's own GPUs when actor_rollout_ref.hybrid_engine=false (0: colocated).", 0)
    n_gpus_per_node: int = doc("The rollout's own GPUs per node (on CPU: processes) when "
                               "actor_rollout_ref.hybrid_engine=false; 0: colocated with the actor.", 0)
    data_parallel_size: int = 1
    expert_parallel_size: int = doc(
        "Mixture-of-experts models: 1 splits every routed expert's ffn over the replica's tp_g ranks (vLLM's "
        "tensor-parallel experts); tensor_model_parallel_size gives each rank whole experts, num_experts / tp_g of "
        "them (vLLM's enable_expert_parallel; an actor trained with the same expert_model_parallel_size then holds "
        "exactly the experts its rank's engine needs, so the weight sync copies them in place).", 1)
    pipeline_model_parallel_size: int = 1
    max_num_batched_tokens: int = 8192
    max_model_len: Optional[int] = None
    max_num_seqs: int = 1024
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    load_format: str = "dummy"
    log_prob_micro_batch_size: Optional[int] = None
    log_prob_micro_batch_size_per_gpu: Optional[int] = doc("Samples per old-log-prob forward on one rank.", None)
    log_prob_use_dynamic_bsz: bool = link("actor_rollout_ref.actor.use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int = link("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    disable_log_stats: bool = True
    do_sample: bool = True
    n: int = doc("Samples per prompt.", 1)
    seed: int = doc("Sampling seed (per step and rank offsets are added).", 0)
    per_request_seed: bool = doc(
        "vLLM: every sample draws from its own generator (seeded from seed, the step and its index), so it does not "
        "depend on which samples share its batch; vLLM then draws the samples one by one each decode step. false: "
        "one generator per engine, reseeded from the same seed at every generate call (reproducible for the same "
        "batch; fewer kernel launches a step). The built-in torch engine always seeds per sample.", True)
    engine_kwargs: dict[str, Any] = field(default_factory=lambda: {"vllm": {}})
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    calculate_log_probs: bool = doc("Keep the engine's own token log-probs (needed for TIS).", False)
    update_weights_bucket_megabytes: int = doc("Bucket size for streaming weights into the engine.", 512)
    direct_weight_copy: bool = doc("Copy the actor's shards straight into the engine's weights where the layouts "
                                   "match (proven against load_weights at the first sync); false: always stream.",
                                   True)
    cross_gpu_zero_copy: bool = doc(
        "Where the rollout layout needs pieces other GPUs train (e.g. tp2 -> tp_g1, pp2 -> tp_g2), send each piece "
        "from the actor's storage straight into the engine's weight when both are contiguous and of one dtype; "
        "false (the default): every such piece goes through staging buffers (bucket-sized rounds), which were "
        "faster on 4 x H200 (tp2 -> tp_g1 x dp_g4, 7B: 56.7 ms staged against 67.6 ms view to view, 2026-11-28, "
        "benchmarks/results/four_gpu.md).", False)
    cross_gpu_overlap_local: bool = doc(
        "Where a sync both copies this GPU's own shards into the engine and receives pieces from other GPUs (e.g. tp2 "
        "-> tp_g1), run the local copies on a second CUDA stream while the cross-GPU rounds are on the wire; false: "
        "the local copies first, then the rounds.", True)
    sync_check: SyncCheckConfig = field(default_factory=SyncCheckConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    enable_rollout_routing_replay: bool = doc(
        "Mixture-of-experts models: the engine returns the experts it routed every token to (vLLM's "
        "enable_return_routed_experts); the actor then reports rollout_vs_actor/routing_agreement and "
        "actor.router_replay.mode=R3 can replay them.", False)
