"""Built-in rollout engine: a transformers causal LM with a KV cache and its own sampling loop.

The CPU default and the reference the vLLM engine is checked against. It holds its own full copy of
the weights (fp32 on CPU by default), filled only by `load_weights` from the hybrid engine's stream,
never from a checkpoint. For tp_g > 1 it does not shard: every rank of a replica holds the full model
and generates the same tokens (same seed), so the layout logic is exercised without a sharded kernel.

Weights are named as in HF checkpoints (what the actor exports and vLLM loads). transformers >= 5 keeps a
mixture-of-experts layer's experts as two 3-D parameters (gate_up_proj [E, 2f, h], down_proj [E, h, f]);
checkpoints keep one gate/up/down per expert (and Mixtral's block_sparse_moe prefix): the engine names
views of the 3-D parameters by their checkpoint names, so loading, checksums and the direct copy work
per expert and write straight into the fused parameters.

Generation: prompts are left-padded, so one batched prefill with the prompt's attention mask and
explicit position ids fills a DynamicCache; the cache is then repeated n times (no re-prefill per
sample) and each decode step feeds one token per active row. Finished rows are dropped from the
cache (`batch_select_indices`), so the step cost follows the rows still running.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

import torch

from hybridrl.protocol import DataProto
from hybridrl.utils.checksum import tensor_checksum

from .assemble import assemble_rollout
from .base import (
    ROLLOUT_ENGINES,
    EngineMemory,
    PieceView,
    RolloutEngine,
    SamplingParams,
    TokenOutput,
    WeightPiece,
    covering_pieces,
    covering_views,
    eos_token_ids,
    piece_view,
    shaped_view,
)
from .lora import RolloutLora, TorchAdapters
from .request_batcher import RequestBatcher
from .sampling import RowSampler, StopChecker, processed_log_probs

if TYPE_CHECKING:
    from hybridrl.adapters.base import WeightRegion


class WeightLoadError(ValueError):
    """load_weights got a name, shape or set of names that does not match the engine's model."""


@ROLLOUT_ENGINES.register("torch")
class TorchRolloutEngine(RolloutEngine):
    checksum_rtol = 0.0  # same kernel, same dtype, same layout on both sides: bitwise

    def __init__(
        self,
        hf_config: Any,
        *,
        tokenizer: Optional[Any] = None,
        eos_token_ids: Optional[Sequence[int]] = None,
        pad_token_id: Optional[int] = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        attn_implementation: str = "sdpa",
        record_routing: bool = False,
        lora: Optional[RolloutLora] = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.hf_config = hf_config
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.weight_dtype = dtype
        self.eos_token_ids = _eos_ids(eos_token_ids, tokenizer, hf_config)
        self.pad_token_id = _pad_id(pad_token_id, tokenizer, hf_config, self.eos_token_ids)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation=attn_implementation)
        self.model = model.to(self.device).eval().requires_grad_(False)
        # remove_duplicate=False keeps tied aliases (lm_head.weight -> embed_tokens.weight) as names
        self._params = checkpoint_weights(self.model, getattr(hf_config, "model_type", ""))
        self._canonical = _canonical_names(self._params)
        self._required = set(self._canonical.values())
        self._pending: set[str] = set()  # canonical names loaded since the last finished sync
        self._complete = False  # every weight came from load_weights since init / the last level-2 sleep
        self._awake = {"weights": True, "kv_cache": True}
        self._cache: Optional[Any] = None  # the live KV cache, only during generate
        self._batcher: Optional[RequestBatcher] = None  # per-request generation (generate_tokens), made on first use
        self._routers = _routers(self.model) if record_routing else []
        if record_routing and not self._routers:
            raise ValueError(f"record_routing: {type(self.model).__name__} has no MoE router (a dense model?); set "
                             "actor_rollout_ref.rollout.enable_rollout_routing_replay=false")
        self._routed: Optional[list[torch.Tensor]] = None  # each router's top-k ids of the last forward
        for router in self._routers:
            router.register_forward_hook(self._record_route)
        # LoRA (adapter-only sync): the adapters ride on forward hooks; the base keeps its names (hybridrl.rollout.lora)
        self.lora = lora
        self.adapters = TorchAdapters(self.model, lora, dtype, self.device) if lora is not None else None

    @classmethod
    def from_rollout_config(cls, hf_config: Any, rollout_cfg: Any, *, tokenizer: Optional[Any] = None,
                            device: str | torch.device = "cpu", lora: Optional[RolloutLora] = None
                            ) -> "TorchRolloutEngine":
        """From actor_rollout_ref.rollout: fp32 on CPU (as the CPU actor trains), rollout.dtype on GPU."""
        device = torch.device(device)
        dtype = torch.float32 if device.type == "cpu" else getattr(torch, rollout_cfg.dtype)
        return cls(hf_config, tokenizer=tokenizer, dtype=dtype, device=device,
                   record_routing=bool(getattr(rollout_cfg, "enable_rollout_routing_replay", False)), lora=lora)

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._require_awake("weights", "load_weights")
        for name, tensor in weights:
            target = self._params.get(name)
            if target is None:
                raise WeightLoadError(f"TorchRolloutEngine.load_weights: {name!r} is not a weight of "
                                      f"{type(self.model).__name__}; expected HF names such as {_examples(self._params)}")
            if tuple(tensor.shape) != tuple(target.shape):
                raise WeightLoadError(f"TorchRolloutEngine.load_weights: {name!r} has shape {tuple(tensor.shape)}, "
                                      f"the model's is {tuple(target.shape)} (wrong model config or a sharded tensor?)")
            canonical = self._canonical[name]
            if name != canonical and canonical in self._pending and not torch.equal(target, tensor.to(target)):
                raise WeightLoadError(f"TorchRolloutEngine.load_weights: {name!r} is tied to {canonical!r} "
                                      f"but arrived with different values")
            target.copy_(tensor)
            self._pending.add(canonical)

    def weight_views(self, regions: Sequence[WeightRegion]) -> list[Optional[torch.Tensor]]:
        """Full tensors on every rank: a weight is placeable when this rank's regions cover all of it."""
        placed: list[tuple[str, Optional[torch.Tensor]]] = []
        for r in regions:
            target = self._params.get(r.name)
            view = None
            if target is not None and target.dim() > r.dim and target.shape[r.dim] == r.extent:
                view = shaped_view(target.narrow(r.dim, r.start, r.stop - r.start), r.src.shape)
            placed.append((r.name, view))
        return covering_views(placed, {name: p.numel() for name, p in self._params.items()})

    def piece_views(self, pieces: Sequence[WeightPiece]) -> list[Optional[PieceView]]:
        """Full tensors on every rank: every piece lands whole; a weight's pieces must cover all of it."""
        placed: list[tuple[str, Optional[PieceView]]] = []
        for p in pieces:
            target = self._params.get(p.name)
            view = None
            if target is not None and tuple(target.shape) == p.shape:
                view = piece_view(target, p.dim, p.start, p.stop, p.narrowed(p.start, p.stop), p.start)
            placed.append((p.name, view))
        return covering_pieces(placed, {name: t.numel() for name, t in self._params.items()})

    def weights_copied(self, names: Iterable[str]) -> None:
        self._require_awake("weights", "weights_copied")
        self._pending.update(self._canonical[n] for n in names)

    def finish_weight_sync(self) -> None:
        missing = sorted(self._required - self._pending)
        if missing:
            raise WeightLoadError(f"TorchRolloutEngine: the sync did not send {len(missing)} weight(s): "
                                  f"{missing[:8]}{' ...' if len(missing) > 8 else ''}")
        self._pending.clear()
        self._complete = True

    def weight_checksums(self, hf_names: Iterable[str]) -> dict[str, float]:
        out = {}
        for name in hf_names:
            if name not in self._params:
                raise KeyError(f"TorchRolloutEngine.weight_checksums: no weight {name!r}")
            out[name] = float(tensor_checksum(self._params[name]))
        return out

    # ------------------------------------------------------------------ LoRA adapters
    def load_adapter(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._require_awake("weights", "load_adapter")
        self._lora("load_adapter").load(tensors)

    def finish_adapter_sync(self, version: int) -> None:
        self._lora("finish_adapter_sync").finish(version)

    def adapter_checksums(self, names: Iterable[str]) -> dict[str, float]:
        return self._lora("adapter_checksums").checksums(names)

    def _lora(self, what: str) -> TorchAdapters:
        if self.adapters is None:
            raise RuntimeError(f"TorchRolloutEngine.{what}: the engine was built without LoRA adapters (lora=None)")
        return self.adapters

    def named_weights(self) -> dict[str, torch.Tensor]:
        """The engine's weights by HF name (tied aliases included), for tests and debugging."""
        return dict(self._params)

    # ------------------------------------------------------------------ memory phases
    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        for tag in tags or list(self._awake):
            if tag not in self._awake:
                raise ValueError(f"TorchRolloutEngine.wake_up: unknown tag {tag!r}; use 'weights' or 'kv_cache'")
            self._awake[tag] = True

    def sleep(self, level: int = 1) -> None:
        """Nothing to free on CPU; the state is kept so a wrong phase order fails here as it would on GPU.
        Level 2 discards the weights (as vLLM does): the next generate needs a full sync first."""
        self._cache = None
        self._awake = {"weights": False, "kv_cache": False}
        if level >= 2:
            self._complete = False
            self._pending.clear()

    def memory(self) -> EngineMemory:
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return EngineMemory(weights_bytes=weights, kv_cache_bytes=_cache_bytes(self._cache))

    # ------------------------------------------------------------------ generation
    @torch.inference_mode()
    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        self._require_ready()
        ids, mask, pos = (prompts.batch[k].to(self.device) for k in ("input_ids", "attention_mask", "position_ids"))
        self._check_prompts(mask, sampling)
        rows = ids.shape[0] * sampling.n
        responses: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        routed = None
        if self._routers:  # [rows, P + R, layers, k] expert ids, -1 where no forward pass routed the token
            k = int(self.hf_config.num_experts_per_tok)
            routed = torch.full((rows, ids.shape[1] + sampling.max_tokens, len(self._routers), k), -1,
                                dtype=torch.int16)
        if sampling.max_tokens > 0 and rows > 0:
            self._decode(ids, mask, pos, sampling, responses, logprobs, routed)
        return assemble_rollout(prompts, responses, logprobs if sampling.logprobs else None, n=sampling.n,
                                max_tokens=sampling.max_tokens, pad_token_id=self.pad_token_id, routed_experts=routed)

    @torch.inference_mode()
    def generate_rows(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, limits: Sequence[int],
                      seeds: Sequence[int]) -> list[TokenOutput]:
        """One sample per prompt (token ids, unpadded) in one batch: row i stops at limits[i] tokens and draws
        from its own seeds[i], so its tokens do not depend on which other requests share the batch."""
        self._require_ready()
        if not (len(prompts) == len(limits) == len(seeds)):
            raise ValueError(f"generate_rows: {len(prompts)} prompts, {len(limits)} limits, {len(seeds)} seeds")
        limit = getattr(self.hf_config, "max_position_embeddings", None)
        for p, m in zip(prompts, limits):
            if not p or m < 1:
                raise ValueError(f"generate_rows: a request needs >= 1 prompt token and max_tokens >= 1 (got {len(p)}, {m})")
            if limit is not None and len(p) + m > limit:
                raise ValueError(f"generate_rows: prompt {len(p)} + max_tokens {m} tokens exceed the model's "
                                 f"max_position_embeddings={limit}")
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        rows = sampling.with_(n=1, max_tokens=max(limits))
        responses: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        self._decode(ids.to(self.device), mask.to(self.device), pos.to(self.device), rows, responses, logprobs, None,
                     limits=list(limits), sampler=RowSampler(rows, len(prompts), seeds))
        stops = set(self.eos_token_ids if not sampling.ignore_eos else ()) | set(sampling.stop_token_ids)
        return [TokenOutput(tuple(r), tuple(lp), "stop" if r and r[-1] in stops else "length")
                for r, lp in zip(responses, logprobs)]

    async def generate_tokens(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> TokenOutput:
        if self._batcher is None:
            self._batcher = RequestBatcher(self.generate_rows)
        return await self._batcher.submit(prompt_ids, sampling)

    def _decode(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, sampling: SamplingParams,
                responses: list[list[int]], logprobs: list[list[float]], routed: Optional[torch.Tensor],
                limits: Optional[list[int]] = None, sampler: Optional[RowSampler] = None) -> None:
        """limits: per output row, the most tokens it may generate (default: sampling.max_tokens for all)."""
        from transformers import DynamicCache

        n = sampling.n
        prompt_len = ids.shape[1]
        self._cache = DynamicCache(config=self.hf_config)
        self._routed = [] if routed is not None else None
        logits = self._forward(ids, mask, pos)  # [B, V] at each prompt's last token
        if routed is not None:  # prefill: every prompt position of each prompt's n samples
            routed[:, :prompt_len] = self._take_routes(ids.shape).repeat_interleave(n, dim=0)
        if n > 1:
            self._cache.batch_repeat_interleave(n)
            logits, mask, pos = (t.repeat_interleave(n, dim=0) for t in (logits, mask, pos))
        active = torch.arange(ids.shape[0] * n, device=self.device)  # output row of each cache row
        last_pos = pos[:, -1]
        sampler = sampler or RowSampler(sampling, len(active))
        stops = StopChecker(sampling, self.eos_token_ids, self.tokenizer)
        row_limit = torch.as_tensor(limits, device=self.device) if limits is not None else None
        try:
            for step in range(sampling.max_tokens):
                lp = processed_log_probs(logits, sampling)
                tokens = sampler.draw(lp, active)
                token_lp = lp.gather(-1, tokens[:, None])[:, 0]
                for r, tok, tok_lp in zip(active.tolist(), tokens.tolist(), token_lp.tolist()):
                    responses[r].append(tok)
                    logprobs[r].append(tok_lp)
                keep = ~stops.finished(tokens, active, responses)
                if row_limit is not None:
                    keep &= row_limit[active] > step + 1
                if step == sampling.max_tokens - 1 or not keep.any():
                    break
                if not keep.all():
                    self._cache.batch_select_indices(keep.nonzero()[:, 0])
                    active, tokens, mask, last_pos = active[keep], tokens[keep], mask[keep], last_pos[keep]
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=-1)
                last_pos = last_pos + 1
                logits = self._forward(tokens[:, None], mask, last_pos[:, None])
                if routed is not None:  # the token sampled at this step, fed back in
                    routed[active.cpu(), prompt_len + step] = self._take_routes((len(active), 1))[:, 0]
        finally:
            self._cache = None  # the cache lives for one generate call only
            self._routed = None

    def _record_route(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if self._routed is not None:
            self._routed.append(output[2].detach())  # transformers' TopKRouter: (logits, weights, indices)

    def _take_routes(self, shape: tuple[int, int]) -> torch.Tensor:
        """The last forward's routing as [rows, positions, layers, k] (routers run once each, in layer order)."""
        routes, self._routed = self._routed or [], []
        if len(routes) != len(self._routers):
            raise RuntimeError(f"record_routing: {len(routes)} router calls in one forward, expected {len(self._routers)}")
        return torch.stack([r.reshape(*shape, -1) for r in routes], dim=2).to("cpu", torch.int16)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=self._cache,
                         use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].float()

    # ------------------------------------------------------------------ guards
    def _require_awake(self, tag: str, what: str) -> None:
        if not self._awake[tag]:
            raise RuntimeError(f"TorchRolloutEngine.{what}: the engine is asleep; call wake_up([{tag!r}]) first")

    def _require_ready(self) -> None:
        self._require_awake("weights", "generate")
        self._require_awake("kv_cache", "generate")
        if not self._complete:
            if self._pending == self._required:
                self.finish_weight_sync()  # loaded in full by hand, without the hybrid engine
            else:
                missing = sorted(self._required - self._pending)
                raise RuntimeError(f"TorchRolloutEngine.generate: weights not loaded ({len(missing)} missing, e.g. "
                                   f"{missing[:4]}); stream them in with load_weights first")
        if self.adapters is not None and self.adapters.version is None:
            raise RuntimeError("TorchRolloutEngine.generate: built with LoRA adapters but none was synced; "
                               "load_adapter + finish_adapter_sync first")

    def _check_prompts(self, mask: torch.Tensor, sampling: SamplingParams) -> None:
        if sampling.n < 1:
            raise ValueError(f"SamplingParams.n={sampling.n} must be >= 1")
        if mask.shape[0] and not bool(mask[:, -1].all()):
            raise ValueError("TorchRolloutEngine.generate: prompts must be left-padded (attention_mask[:, -1] == 1 on every row)")
        limit = getattr(self.hf_config, "max_position_embeddings", None)
        if limit is not None and mask.shape[-1] + sampling.max_tokens > limit:
            raise ValueError(f"prompt length {mask.shape[-1]} + max_tokens {sampling.max_tokens} exceeds the model's "
                             f"max_position_embeddings={limit}; lower data.max_prompt_length / max_response_length")


# Checkpoint names of one MoE layer's routed experts: (block, gate, up, down); the mapping's HF_EXPERT_NAMES.
EXPERT_CHECKPOINT_NAMES = {"mixtral": ("block_sparse_moe", "w1", "w3", "w2")}
EXPERT_DEFAULT = ("mlp", "gate_proj", "up_proj", "down_proj")


def checkpoint_weights(model: torch.nn.Module, model_type: str) -> dict[str, torch.Tensor]:
    """The model's weights by checkpoint name: parameters, and per-expert views of fused 3-D expert weights."""
    block, gate, up, down = EXPERT_CHECKPOINT_NAMES.get(model_type, EXPERT_DEFAULT)
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if block != "mlp":
            name = name.replace(".mlp.", f".{block}.")
        fused = name.endswith(".experts.gate_up_proj"), name.endswith(".experts.down_proj")
        if p.dim() != 3 or not any(fused):
            out[name] = p
            continue
        prefix = name.rsplit(".", 1)[0]
        for e in range(p.shape[0]):
            if fused[0]:  # [gate rows; up rows] per expert
                f = p.shape[1] // 2
                out[f"{prefix}.{e}.{gate}.weight"], out[f"{prefix}.{e}.{up}.weight"] = p[e, :f], p[e, f:]
            else:
                out[f"{prefix}.{e}.{down}.weight"] = p[e]
    return out


def _routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """transformers' MoE routers (…TopKRouter, returning (logits, weights, top-k indices)), in layer order."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


def _canonical_names(params: dict[str, torch.nn.Parameter]) -> dict[str, str]:
    """name -> the first name of the same tensor (tied weights share one)."""
    first: dict[int, str] = {}
    return {name: first.setdefault(id(p), name) for name, p in params.items()}


def _examples(params: dict[str, Any]) -> list[str]:
    return list(params)[:3]


def _eos_ids(eos: Optional[Sequence[int]], tokenizer: Any, hf_config: Any) -> tuple[int, ...]:
    if eos is not None:
        return tuple(int(e) for e in ([eos] if isinstance(eos, int) else eos))
    return eos_token_ids(tokenizer, hf_config)


def _pad_id(pad: Optional[int], tokenizer: Any, hf_config: Any, eos: tuple[int, ...]) -> int:
    for candidate in (pad, getattr(tokenizer, "pad_token_id", None), getattr(hf_config, "pad_token_id", None)):
        if candidate is not None:
            return int(candidate)
    if eos:
        return eos[0]  # verl's convention when a tokenizer has no pad token
    raise ValueError("TorchRolloutEngine: no pad token id: pass pad_token_id=... or a tokenizer with one")


def _cache_bytes(cache: Any) -> int:
    if cache is None:
        return 0
    total = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total
