"""vLLM 0.26 rollout engine, in-process and colocated with the Megatron actor (GPU only).

One `LLM` per process. Its tensor-parallel group is formed from the process group our worker already
initialized (`distributed_executor_backend="external_launcher"`): vLLM groups consecutive ranks into
replicas of tp_g, which is exactly the rollout layout of hybridrl.hybrid.plan (replica = rank // tp_g).
`VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the model in this process, so weights stream in through
`apply_model(lambda m: m.load_weights(...))` with no copy across processes.

The engine starts on dummy weights (the actor supplies the real ones at the first sync) with sleep
mode on: `sleep(level=2)` drops weights and KV cache (we reload weights every step anyway, so there is
nothing worth offloading to host memory), `wake_up(["weights"])` re-allocates before a sync and
`wake_up(["kv_cache"])` before generation. Captured CUDA graphs survive sleep: the sleep-mode allocator
unmaps the memory but keeps its virtual addresses, and wake-up maps new memory at the same addresses.

Start-up (what a user waits for, reported by `startup_times`): vLLM's import, dummy-weight load, memory profiling,
torch.compile (cached across runs under vLLM's cache root, which defaults to the model cache) and CUDA-graph
capture for the sizes `capture_sizes` fits to the largest batch this engine will see. What keeps the second start
of the same job on a machine short (vLLM 0.26, read from its source):
- the compile cache: vLLM keys it by its environment (every VLLM_* variable but a listed few), the config's hash
  (model path, dtype, max_model_len, parallel sizes, compilation config incl. the capture sizes; not the seed,
  gpu_memory_utilization or kv_cache_memory_bytes) and the traced source files, and keeps it under
  VLLM_CACHE_ROOT/torch_compile_cache (with torch >= 2.10 as an AOT artifact under torch_aot_compile/, inductor's
  cache beside it). Nothing here varies per run: the root is fixed (default_cache_root), the capture sizes follow
  the job's batch, and the worker's per-run TMPDIR is not where vLLM points inductor.
- the KV-cache size (rollout.kv_cache_sizing): vLLM's memory profiling (a forward of max_num_batched_tokens, then
  two CUDA graphs captured per mode for their memory) is skipped where kv_cache_memory_bytes is given; "remember"
  lets vLLM store what it measured (VLLM_ENABLE_STARTUP_PLAN, under the cache root, keyed like the compile cache
  plus the device) and give it back on later starts; "plan" gives the memory plan's size.
"""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

import torch

from hybridrl.protocol import DataProto

from .assemble import assemble_rollout
from .base import ROLLOUT_ENGINES, EngineMemory, PieceView, RolloutEngine, SamplingParams, TokenOutput, WeightPiece
from .vllm_weights import (
    CHECKPOINT_PROJ,
    PACKED,
    _expert_of,
    _local_sums,
    _num_experts,
    _piece_views,
    _vllm_name,
    _weight_views,
)

if TYPE_CHECKING:
    from hybridrl.adapters.base import WeightRegion

# Must be set before vllm is imported anywhere in this process.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# vLLM's default capture list: [1, 2, 4] + multiples of 8 below 256 + multiples of 16 up to
# min(2 * max_num_seqs, 512) (vllm.config.CompilationConfig.max_cudagraph_capture_size).
VLLM_CAPTURE_MAX = 512
CAPTURE_GRID = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, VLLM_CAPTURE_MAX + 1, 16))


def capture_sizes(max_rows: Optional[int], max_num_seqs: int) -> Optional[list[int]]:
    """vLLM's capture sizes cut at the largest decode batch this engine can run: a replica never holds more
    sequences at once than one generate call's rows (or max_num_seqs), so larger graphs are captured for
    nothing. The last size is the first grid size >= that batch. None (rows unknown): vLLM's own list."""
    if not max_rows or max_rows < 1:
        return None
    cap = min(max_rows, max_num_seqs, VLLM_CAPTURE_MAX)
    top = next(s for s in CAPTURE_GRID if s >= cap)
    return [s for s in CAPTURE_GRID if s <= top]


def llm_extra_kwargs(engine_kwargs: Optional[dict[str, Any]], *, record_routing: bool, moe: bool,
                     cudagraph_capture_sizes: Optional[Sequence[int]], expert_parallel: bool = False,
                     kv_cache_bytes: Optional[int] = None) -> dict[str, Any]:
    """vllm.LLM's keyword arguments beyond the ones every engine passes: the user's engine_kwargs.vllm, with our
    defaults under them wherever the user set nothing (a user's own value always wins). kv_cache_bytes: the KV
    cache's size, given instead of measured (vLLM then skips its memory profiling)."""
    kwargs = dict(engine_kwargs or {})
    if kv_cache_bytes:
        kwargs.setdefault("kv_cache_memory_bytes", int(kv_cache_bytes))
    # NCCL for the replica's all-reduces: vLLM's custom all-reduce maps tp ranks to CUDA_VISIBLE_DEVICES
    # positions, which fails wherever a process does not see its peers' GPUs (a Ray actor restricted to its own
    # GPU, seen on 2 x H200).
    kwargs.setdefault("disable_custom_all_reduce", True)
    if record_routing:  # MoE: every token's experts come back with each completion (vLLM >= 0.26)
        kwargs["enable_return_routed_experts"] = True
    if moe:
        # Triton keeps w13 as loaded ([gate; up] per expert); FlashInfer's kernels re-lay it out after the
        # first load, and a later sync's load_weights or direct copy would then write the old layout.
        kwargs.setdefault("moe_backend", "triton")
    if expert_parallel:  # rollout.expert_parallel_size = tp_g: rank r of a replica holds experts [r E/tp_g, (r+1) E/tp_g)
        kwargs["enable_expert_parallel"] = True
    compilation = dict(kwargs.pop("compilation_config", None) or {})
    if cudagraph_capture_sizes and "max_cudagraph_capture_size" not in compilation:
        compilation.setdefault("cudagraph_capture_sizes", sorted(set(cudagraph_capture_sizes)))
    # vLLM's compile pass that fuses the tp all-reduce with the next RMSNorm (FlashInfer's one-shot all-reduce,
    # on by default for tp > 1 on Hopper) crashed every tp_g 2 and 4 engine of the colocated trainer while
    # warming up (illegal memory access, or CUBLAS_STATUS_INTERNAL_ERROR on the next cuBLAS call; 4 x H200,
    # 2026-11-27, vLLM 0.26.0); with the pass off, the same runs trained (four_gpu.md).
    passes = dict(compilation.get("pass_config") or {})
    passes.setdefault("fuse_allreduce_rms", False)
    compilation["pass_config"] = passes
    kwargs["compilation_config"] = compilation
    return kwargs


def startup_env(kv_cache_sizing: str) -> dict[str, str]:
    """Environment variables the engine sets (where the user has not) before vLLM reads its environment: "remember"
    turns on vLLM's persisted start-up plan (the measured KV-cache size, reused on later starts)."""
    return {"VLLM_ENABLE_STARTUP_PLAN": "1"} if kv_cache_sizing == "remember" else {}


def default_cache_root() -> str:
    """vLLM's cache root (torch.compile artifacts) beside hybridrl's model cache, unless VLLM_CACHE_ROOT is set:
    vLLM keys each compiled graph by config, code and model path, so a second run of the same job on this
    machine loads it instead of compiling."""
    from hybridrl.utils.hf_model import model_cache_root

    return os.environ.get("VLLM_CACHE_ROOT") or os.path.join(model_cache_root(), "vllm")


class _StartupLog(logging.Handler):
    """vLLM reports the parts of its start-up only as log records (format strings with float arguments);
    this reads the numbers from the records of the one engine built in this process. vLLM logs them on each
    node's first rank only, and not at all below INFO: a missing part is left out, never guessed."""

    # message prefix -> (part, index of its seconds in the record's arguments); "torch.compile ..." comes in two
    # wordings (with or without the first profiling run folded in)
    MESSAGES = {"Model loading took": ("engine_load", 1), "torch.compile": ("engine_compile", 0),
                "Graph capturing finished": ("engine_capture", 0),
                "Initial profiling/warmup run took": ("engine_profile_run", 0),  # the AOT path's first forward
                "init engine (profile, create kv cache, warmup model) took": ("init_engine", 0)}
    # vLLM's word that it took the KV-cache size from its persisted plan (no memory profiling this start)
    PLAN_APPLIED = "Applying persisted startup plan"

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.seconds: dict[str, float] = {}
        self.plan_applied = False

    def emit(self, record: logging.LogRecord) -> None:
        if not isinstance(record.msg, str):
            return
        if record.msg.startswith(self.PLAN_APPLIED):
            self.plan_applied = True
        for prefix, (name, index) in self.MESSAGES.items():
            if record.msg.startswith(prefix) and len(record.args or ()) > index:
                self.seconds[name] = self.seconds.get(name, 0.0) + float(record.args[index])

    def parts(self) -> dict[str, float]:
        """The parts as startup_times reports them: vLLM's "init engine" (profiling, KV cache, compile, warm-up,
        capture) less the parts timed inside it is engine_warmup."""
        out = {k: v for k, v in self.seconds.items() if k != "init_engine"}
        if "init_engine" in self.seconds:
            inside = sum(out.get(k, 0.0) for k in ("engine_compile", "engine_profile_run", "engine_capture"))
            out["engine_warmup"] = max(0.0, self.seconds["init_engine"] - inside)
        return out


@ROLLOUT_ENGINES.register("vllm")
class VLLMRolloutEngine(RolloutEngine):
    def __init__(
        self,
        model_dir: str,
        *,
        tp_size: int,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        max_model_len: Optional[int] = None,
        max_num_seqs: int = 1024,
        max_num_batched_tokens: int = 8192,
        enforce_eager: bool = False,
        enable_chunked_prefill: bool = True,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        pad_token_id: int = 0,
        eos_token_ids: tuple[int, ...] = (),
        trust_remote_code: bool = False,
        load_format: str = "dummy",
        cudagraph_capture_sizes: Optional[Sequence[int]] = None,
        engine_kwargs: Optional[dict[str, Any]] = None,
        record_routing: bool = False,
        per_request_seed: bool = True,
        expert_parallel: bool = False,
        kv_cache_sizing: str = "profile",
        kv_cache_bytes: Optional[int] = None,
    ) -> None:
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            raise RuntimeError("VLLM_ENABLE_V1_MULTIPROCESSING must be 0 for the colocated engine (set before importing vllm)")
        began = time.perf_counter()
        from vllm import LLM

        self._import_seconds = time.perf_counter() - began

        self.tp_size = tp_size
        self.pad_token_id = pad_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        kwargs = llm_extra_kwargs(engine_kwargs, record_routing=record_routing,
                                  moe=bool(_num_experts(_read_config(model_dir))),
                                  cudagraph_capture_sizes=None if enforce_eager else cudagraph_capture_sizes,
                                  expert_parallel=expert_parallel, kv_cache_bytes=kv_cache_bytes)
        self.record_routing = record_routing
        self.per_request_seed = per_request_seed
        # vLLM reads its environment once, when its first engine starts: the cache root must be set before
        os.environ.setdefault("VLLM_CACHE_ROOT", default_cache_root())
        for name, value in startup_env(kv_cache_sizing).items():
            os.environ.setdefault(name, value)
        self._startup = _StartupLog()
        vllm_log = logging.getLogger("vllm")
        vllm_log.addHandler(self._startup)
        start = time.perf_counter()
        # Prompts arrive as token ids and responses leave as token ids: vLLM needs no tokenizer, and
        # without one it never detokenizes (EOS ids are passed as stop tokens explicitly instead).
        try:
            self.llm = LLM(
                model=model_dir,
                skip_tokenizer_init=True,
                trust_remote_code=trust_remote_code,
                tensor_parallel_size=tp_size,
                distributed_executor_backend="external_launcher",
                dtype=dtype,
                load_format=load_format,
                enable_sleep_mode=True,
                gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                enforce_eager=enforce_eager,
                enable_chunked_prefill=enable_chunked_prefill,
                enable_prefix_caching=enable_prefix_caching,
                seed=seed,
                logprobs_mode="processed_logprobs",
                disable_log_stats=True,
                **kwargs,
            )
        finally:
            vllm_log.removeHandler(self._startup)
        self._init_seconds = time.perf_counter() - start
        self._asleep = False
        self._kv_awake = True  # the KV cache (and the prefix cache in it) survived since the last weight change
        self.weight_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.checksum_rtol = 1e-6  # vLLM sums fused and sharded tensors in another order than the sender
        hf = self.llm.llm_engine.model_config.hf_config
        kv = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        self._kv_replicas = float(max(1, tp_size // kv))
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        # HF rows of each member of a fused parameter, in vLLM's stacking order
        self._fused_rows = {"qkv_proj": (hf.num_attention_heads * head_dim, kv * head_dim, kv * head_dim),
                            "gate_up_proj": (hf.intermediate_size, hf.intermediate_size)}
        self._num_experts = _num_experts(hf)
        self._requests: Optional[Any] = None  # per-request driver (generate_tokens), made on first use

    @classmethod
    def from_config(cls, model_dir: str, rollout_cfg: Any, *, tp_g: int, pad_token_id: int,
                    eos_token_ids: tuple[int, ...], max_model_len: int,
                    trust_remote_code: bool = False, load_format: str = "dummy",
                    max_batch_rows: Optional[int] = None, kv_cache_bytes: Optional[int] = None,
                    **extra: Any) -> "VLLMRolloutEngine":
        """From actor_rollout_ref.rollout (its engine_kwargs.vllm pass through to vllm.LLM). max_batch_rows: the
        most sequences one generate call can hold (fits the CUDA-graph capture sizes; None: vLLM's list). `extra`:
        a subclass's own arguments (vllm_lora.VLLMLoraEngine: lora)."""
        r = rollout_cfg
        return cls(
            model_dir, tp_size=tp_g, dtype=r.dtype, gpu_memory_utilization=r.gpu_memory_utilization,
            max_model_len=r.max_model_len or max_model_len, max_num_seqs=r.max_num_seqs,
            max_num_batched_tokens=r.max_num_batched_tokens, enforce_eager=r.enforce_eager,
            enable_chunked_prefill=r.enable_chunked_prefill, enable_prefix_caching=r.enable_prefix_caching,
            seed=r.seed, pad_token_id=pad_token_id, eos_token_ids=eos_token_ids, trust_remote_code=trust_remote_code,
            load_format=load_format,
            cudagraph_capture_sizes=r.cudagraph_capture_sizes or capture_sizes(max_batch_rows, r.max_num_seqs),
            engine_kwargs=dict((r.engine_kwargs or {}).get("vllm", {}) or {}),
            record_routing=bool(getattr(r, "enable_rollout_routing_replay", False)),
            per_request_seed=r.per_request_seed, expert_parallel=r.expert_parallel_size > 1,
            kv_cache_sizing=getattr(r, "kv_cache_sizing", "profile"), kv_cache_bytes=kv_cache_bytes, **extra,
        )

    def startup_times(self) -> dict[str, float]:
        """Seconds of this engine's start-up: engine_init (vllm's import and the whole vllm.LLM construction) and
        its parts engine_import, engine_load (dummy weights), engine_compile (torch.compile: loading it on a cache
        hit), engine_profile_run, engine_capture (CUDA graphs) and engine_warmup (memory profiling, KV-cache
        allocation, warm-up runs) where vLLM reported them, and engine_other, the rest (config, model
        construction). engine_kv_from_plan: 1 where vLLM took the KV-cache size from its persisted plan (no
        profiling this start), else 0."""
        out = {"engine_import": self._import_seconds, **self._startup.parts()}
        total = self._import_seconds + self._init_seconds
        out["engine_other"] = max(0.0, total - sum(out.values()))
        out["engine_init"] = total
        out["engine_kv_from_plan"] = float(self._startup.plan_applied)
        return out

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        token_lists = [row[m.bool()].tolist() for row, m in zip(ids.cpu(), mask.cpu())]
        params = [self._vllm_params(sampling, seed) for seed in self._request_seeds(sampling, len(token_lists))]
        outputs = self.llm.generate([{"prompt_token_ids": t} for t in token_lists], params, use_tqdm=False,
                                    **self._request_kwargs())
        responses: list[list[int]] = []
        logprobs: list[list[float]] = []
        routes: list[Any] = []
        for out in outputs:
            if len(out.outputs) != sampling.n:
                raise RuntimeError(f"vLLM returned {len(out.outputs)} samples for a prompt, expected n={sampling.n}")
            for comp in out.outputs:
                toks = list(comp.token_ids)
                responses.append(toks)
                routes.append(getattr(comp, "routed_experts", None))
                if sampling.logprobs and comp.logprobs is not None:
                    logprobs.append([step[t].logprob for step, t in zip(comp.logprobs, toks)])
                else:
                    logprobs.append([0.0] * len(toks))
        routed = None
        if self.record_routing:
            lengths = [len(t) for t in token_lists for _ in range(sampling.n)]
            routed = routing_tensor(routes, lengths, ids.shape[1], sampling.max_tokens)
        return assemble_rollout(
            prompts, responses, logprobs, n=sampling.n, max_tokens=sampling.max_tokens,
            pad_token_id=self.pad_token_id, routed_experts=routed,
        )

    def _request_seeds(self, sampling: SamplingParams, prompts: int) -> list[Optional[int]]:
        """Per-prompt seeds (vLLM gives a prompt's n children seed + index), so prompts share no random draws; or,
        without per_request_seed, none: the engine's one generator, reseeded here, draws for every sample in one
        launch a step (vLLM's sampler loops over seeded requests one by one). Every tp_g rank of a replica reseeds
        with the same seed, so they still generate identical tokens."""
        if sampling.seed is None or sampling.greedy:
            return [None] * prompts
        if not self.per_request_seed:
            torch.cuda.manual_seed(sampling.seed & 0xFFFF_FFFF_FFFF)
            return [None] * prompts
        return [sampling.seed + i * sampling.n for i in range(prompts)]

    def _vllm_params(self, sampling: SamplingParams, seed: Optional[int]) -> Any:
        from vllm import SamplingParams as VSampling

        if sampling.stop:
            raise ValueError("the vLLM engine runs without a tokenizer: stop strings are not supported; "
                             "use stop_token_ids")
        stop_ids = list(sampling.stop_token_ids) + ([] if sampling.ignore_eos else list(self.eos_token_ids))
        return VSampling(
            n=sampling.n,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=1.0 if sampling.greedy else sampling.top_p,
            top_k=0 if (sampling.greedy or sampling.top_k <= 0) else sampling.top_k,
            max_tokens=sampling.max_tokens,
            stop_token_ids=stop_ids or None,
            ignore_eos=sampling.ignore_eos,
            detokenize=False,
            seed=seed,
            logprobs=0 if sampling.logprobs else None,
            skip_special_tokens=False,
        )

    async def generate_tokens(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> TokenOutput:
        """One agent-loop request (hybridrl.rollout.vllm_requests: why the synchronous engine, driven per request)."""
        if self._requests is None:
            from .vllm_requests import VLLMRequestDriver

            self._requests = VLLMRequestDriver(self.llm.llm_engine, lambda s: self._vllm_params(s, s.seed),
                                               self._request_kwargs)
        return await self._requests.submit(prompt_ids, sampling)

    # ------------------------------------------------------------------ weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        batch = list(weights)  # a bucket: already bounded in size by the sender
        self.llm.apply_model(lambda model: model.load_weights(batch))

    def weight_views(self, regions: Sequence[WeightRegion]) -> list[Optional[torch.Tensor]]:
        """Views into vLLM's (tp_g-sharded, fused) parameters; see `_weight_views`."""
        from vllm.distributed import get_tensor_model_parallel_rank

        wanted = list(regions)
        rank = get_tensor_model_parallel_rank()
        experts = self._num_experts
        return self.llm.apply_model(
            lambda model: _weight_views(self._model(model), wanted, self.tp_size, rank, self._fused_rows, experts))[0]

    def piece_views(self, pieces: Sequence[WeightPiece]) -> list[Optional[PieceView]]:
        """Where each piece (held by any rank's actor) lands in vLLM's parameters here; see `_piece_views`.
        Not run on a GPU yet: the same layout rules as weight_views, checked on CPU against vLLM's layout built by
        hand (tests/unit/test_vllm_piece_views.py), and proven against load_weights at the first sync as every copy is."""
        from vllm.distributed import get_tensor_model_parallel_rank

        wanted = list(pieces)
        rank = get_tensor_model_parallel_rank()
        experts = self._num_experts
        return self.llm.apply_model(
            lambda model: _piece_views(self._model(model), wanted, self.tp_size, rank, self._fused_rows, experts,
                                       replicated_kv=self._kv_replicas > 1))[0]

    def weight_checksums(self, hf_names: Iterable[str]) -> dict[str, float]:
        """Float64 sums of the named HF weights as vLLM holds them, reduced over the replica's tp group.

        A fused parameter (qkv_proj, gate_up_proj) reports its own sum under each member's name;
        `checksum_terms` tells the checker which sent tensors add up to it. Replicated parameters
        (norms) count once.
        """
        wanted = list(hf_names)
        return self.llm.apply_model(lambda model: _local_sums(self._model(model), wanted, self.tp_size))[0]

    def checksum_terms(self, hf_name: str) -> list[tuple[str, float]]:
        expert = _expert_of(hf_name)
        if expert is not None:  # a fused w13 / w2 holds this member of every expert of the layer
            prefix, _, member, kind = expert
            names = CHECKPOINT_PROJ[kind][1:] if member is not None else CHECKPOINT_PROJ[kind][:1]
            return [(f"{prefix}.{e}.{n}.weight", 1.0) for e in range(self._num_experts) for n in names]
        _, _, size = _vllm_name(hf_name)
        if size == 1:
            return [(hf_name, 1.0)]
        for fused, members in PACKED.items():
            for m in members:
                if f".{m}." in hf_name:
                    names = [hf_name.replace(f".{m}.", f".{x}.") for x in members]
                    # key/value heads are replicated when there are fewer of them than tp_g ranks
                    coef = [1.0, self._kv_replicas, self._kv_replicas] if fused == "qkv_proj" else [1.0, 1.0]
                    return list(zip(names, coef))
        return [(hf_name, 1.0)]

    # hooks for vllm_lora.VLLMLoraEngine: the parameters as HF-shaped names see them, extra generate arguments
    def _model(self, model: Any) -> Any:
        return model

    def _request_kwargs(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ memory phases
    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        self.llm.wake_up(tags)
        self._asleep = False
        self._kv_awake = self._kv_awake or tags is None or "kv_cache" in tags

    def sleep(self, level: int = 2) -> None:
        self.llm.sleep(level=level)  # drops the prefix cache too
        self._asleep = True
        self._kv_awake = False

    def finish_weight_sync(self) -> None:
        """New weights: a KV cache that stayed awake through the sync (rollout.free_cache_engine=false) still holds
        prefix blocks computed with the old ones, keyed by token ids alone, which a repeated prompt would reuse."""
        if self._kv_awake:
            self.llm.reset_prefix_cache()

    def memory(self) -> EngineMemory:
        free, total = torch.cuda.mem_get_info()
        return EngineMemory(extra={"device_free_bytes": free, "device_total_bytes": total})


def routing_tensor(routes: Sequence[Any], prompt_lengths: Sequence[int], prompt_width: int,
                   max_tokens: int) -> torch.Tensor:
    """vLLM's per-completion routed experts ([prompt + generated - 1 tokens, layers, k] arrays: the last sampled
    token is never run) -> [rows, P + R, layers, k] int16 in the rollout layout (left-padded prompts), -1 where
    unknown."""
    shaped = [r for r in routes if r is not None]
    if not shaped:
        raise RuntimeError("vLLM returned no routed experts: is the model a mixture of experts? (set "
                           "actor_rollout_ref.rollout.enable_rollout_routing_replay=false for dense models)")
    layers, k = shaped[0].shape[1:]
    out = torch.full((len(routes), prompt_width + max_tokens, layers, k), -1, dtype=torch.int16)
    for row, (r, p) in enumerate(zip(routes, prompt_lengths)):
        if r is None:
            continue
        r = torch.as_tensor(r, dtype=torch.int16)[: p + max_tokens]
        out[row, prompt_width - p: prompt_width - p + r.shape[0]] = r
    return out


def _read_config(model_dir: str) -> Any:
    import json
    from types import SimpleNamespace

    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            return SimpleNamespace(**json.load(f))
    except (OSError, ValueError):
        return SimpleNamespace()
