"""The rollout-engine interface: generation on weights streamed in from the actor.

Input batch (DataProto, B prompts):
    input_ids [B, P] left-padded with pad_token_id, attention_mask [B, P], position_ids [B, P];
    non-tensor keys (data_source, reward_model, ...) are carried along.
Output batch (B * n samples, each prompt's n samples adjacent, i.e. repeat(n, interleave=True)):
    prompts [B*n, P], responses [B*n, R] right-padded with pad_token_id (R = max_tokens),
    input_ids [B*n, P+R], attention_mask [B*n, P+R], position_ids [B*n, P+R],
    response_mask [B*n, R] (1 on generated tokens up to and including the stop token),
    rollout_log_probs [B*n, R] (log-prob of each sampled token under the distribution it was sampled
    from: softmax(logits / temperature) restricted to the top-k / top-p set and renormalized, which is
    vLLM's "processed_logprobs"; with top-k and top-p off it equals the actor's recomputed log-prob at
    the same temperature; 0 on padding).
    routed_experts [B*n, P+R, layers, k] int16 (only from an MoE engine built with record_routing): the
    experts each token was routed to in each layer, -1 where no forward pass routed it (see assemble.py).
Non-tensor keys are repeated alongside.

Per-request generation (the agent loop, hybridrl/agent/): `generate_tokens(prompt_ids, sampling)` is one
request of one sample (sampling.n must be 1), awaited on its own so that each sample runs its own turn loop;
the engine batches whatever requests are pending. It returns the generated ids and their log-probs under the
same convention as above (TokenOutput).

Engines hold their own copy of the weights, keyed by HuggingFace names; the hybrid engine fills it with
`load_weights` (buckets of (hf_name, full tensor)), or, for the pieces `weight_views` can place, by
copying the actor's shards straight in; an engine never reads a checkpoint itself.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Hashable, Iterable, Optional, Sequence

import torch

from hybridrl.protocol import DataProto
from hybridrl.utils.registry import Registry

if TYPE_CHECKING:
    from hybridrl.adapters.base import WeightRegion

ROLLOUT_ENGINES: Registry = Registry("rollout engine", key="actor_rollout_ref.rollout.name")


def eos_token_ids(tokenizer: Any, hf_config: Any) -> tuple[int, ...]:
    """Every engine stops on the same ids: the tokenizer's EOS plus the model config's (a list in some
    configs, e.g. an instruct model's end-of-turn and end-of-text), without duplicates."""
    ids: list[int] = []
    for v in (getattr(tokenizer, "eos_token_id", None), getattr(hf_config, "eos_token_id", None)):
        for i in (v if isinstance(v, (list, tuple)) else [v]):
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return tuple(ids)


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    max_tokens: int = 512
    do_sample: bool = True  # False (or temperature 0): greedy
    stop_token_ids: tuple[int, ...] = ()  # in addition to the tokenizer's EOS
    stop: tuple[str, ...] = ()  # stop strings (the matched text is kept in the response)
    ignore_eos: bool = False
    seed: Optional[int] = None  # same seed, same prompts, same weights -> same samples
    logprobs: bool = True

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0

    def with_(self, **changes) -> "SamplingParams":
        return replace(self, **changes)


@dataclass(frozen=True)
class TokenOutput:
    """One request's generated tokens (ending with the stop token when one was hit) and their log-probs."""

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: str  # "stop": a stop token ended it; "length": max_tokens did

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.log_probs):
            raise ValueError(f"TokenOutput: {len(self.token_ids)} tokens but {len(self.log_probs)} log-probs")


@dataclass
class EngineMemory:
    """Bytes held by an engine, for the memory-phase checks and benchmarks."""

    weights_bytes: int = 0
    kv_cache_bytes: int = 0
    extra: dict = field(default_factory=dict)


class RolloutEngine(ABC):
    """One rollout replica's engine in this process (it may span tp_g ranks of the replica)."""

    # How the hybrid engine's sync checks read this engine (hybridrl.hybrid.checks):
    weight_dtype: Optional[torch.dtype] = None  # dtype the weights are held in; the sender rounds to it before summing
    checksum_rtol: float = 1e-6  # allowed |engine sum - sent sum| / sum|x|; 0 = bitwise

    @abstractmethod
    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto: ...

    async def generate_tokens(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> TokenOutput:
        """One sample for one prompt (token ids, no padding); sampling.n must be 1. Concurrent calls are
        batched by the engine. Engines without per-request generation raise."""
        raise NotImplementedError(f"{type(self).__name__} has no per-request generation (generate_tokens); "
                                  "actor_rollout_ref.rollout.multi_turn needs it")

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named full tensors into the engine's weights (it shards them itself for tp_g)."""

    def weight_views(self, regions: Sequence["WeightRegion"]) -> list[Optional[torch.Tensor]]:
        """For each region (a piece of an HF weight the actor holds on this rank), the view of this
        engine's own weight that holds exactly that piece, shaped like `region.src`; None where it is
        not held that way here. A weight gets views only if its regions cover every element of it this
        rank's engine holds: the direct copy (hybridrl.hybrid.direct) then replaces load_weights for it.
        Default: no views (every weight streams through load_weights)."""
        return [None] * len(regions)

    def piece_views(self, pieces: Sequence["WeightPiece"]) -> list[Optional["PieceView"]]:
        """For each piece of an HF weight that SOME rank's actor holds (every rank's, each distinct piece once,
        so a weight's pieces are disjoint), the part of it this engine holds here: PieceView(lo, hi, view) with
        `view` shaped like HF[name].narrow(dim, lo, hi - lo); lo == hi (no view) where it holds none of it. A
        weight gets PieceViews only if its pieces together cover every element of it this engine holds, else
        None for all of them. The cross-GPU copy (hybridrl.hybrid.remote) fills what other ranks hold through
        it. Default: None (every such weight streams through load_weights)."""
        return [None] * len(pieces)

    def weights_copied(self, names: Iterable[str]) -> None:
        """The named weights were written through weight_views in this sync (finish_weight_sync's bookkeeping)."""
        return None

    def finish_weight_sync(self) -> None:
        """Called once after the last bucket of a full sync: fail if a weight was not loaded, post-process."""
        return None

    @abstractmethod
    def weight_checksums(self, hf_names: Iterable[str]) -> dict[str, float]:
        """Checksum (see hybridrl.hybrid.checks) of each named weight as the engine holds it."""

    def checksum_terms(self, hf_name: str) -> list[tuple[str, float]]:
        """Sent tensors and coefficients whose checksums add up to this engine's checksum of `hf_name`
        (a fused qkv parameter: q, k and v); default: the tensor itself."""
        return [(hf_name, 1.0)]

    # LoRA adapters (hybridrl.rollout.lora): engines built with adapters take them apart from the base each step
    lora: Optional[Any] = None  # the RolloutLora this engine was built to take; None: full weights only

    def load_adapter(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy PEFT-named adapter tensors (full, HF-shaped) of the version being synced into the engine."""
        raise NotImplementedError(f"{type(self).__name__} was built without LoRA adapters; set "
                                  "actor_rollout_ref.model.lora.merge=true to sync merged weights instead")

    def finish_adapter_sync(self, version: int) -> None:
        """After the last adapter bucket: fail if a tensor was not sent; requests use this version from now on."""
        raise NotImplementedError(f"{type(self).__name__} was built without LoRA adapters")

    def adapter_checksums(self, names: Iterable[str]) -> dict[str, float]:
        """Checksum of each named adapter tensor as the engine holds it (see adapter_as_held)."""
        raise NotImplementedError(f"{type(self).__name__} was built without LoRA adapters")

    def adapter_as_held(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """What the engine holds for a sent adapter tensor (its dtype; vLLM: B pre-scaled), for the sender's sums."""
        return tensor if self.weight_dtype is None else tensor.to(self.weight_dtype)

    def adapters_as_held(self, bucket: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """adapter_as_held of a whole bucket (the same values); an engine may do it in a few kernels."""
        return [(name, self.adapter_as_held(name, tensor)) for name, tensor in bucket]

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Re-allocate what `sleep` freed: tags None = all, or ["weights"] / ["kv_cache"]."""

    def sleep(self, level: int = 1) -> None:
        """Free the engine's GPU memory between generations (level 1: drop KV cache, offload weights)."""

    def memory(self) -> EngineMemory:
        return EngineMemory()

    def startup_times(self) -> dict[str, float]:
        """Seconds of named parts of this engine's start-up (hybridrl.trainer.startup); default: none."""
        return {}


@dataclass(frozen=True)
class WeightPiece:
    """HF[name].narrow(dim, start, stop - start) of a full HF tensor of `shape`: what one rank's actor holds of a
    weight, as metadata (no tensor), so every rank can ask its engine where another rank's piece lands."""

    name: str
    dim: int
    start: int
    stop: int
    shape: tuple[int, ...]

    def narrowed(self, lo: int, hi: int) -> tuple[int, ...]:
        """The shape of HF[name].narrow(dim, lo, hi - lo)."""
        return self.shape[:self.dim] + (hi - lo,) + self.shape[self.dim + 1:]


@dataclass(frozen=True)
class PieceView:
    """The part [lo, hi) (along the piece's dim) of a WeightPiece that an engine holds, and where: `view` is
    shaped like HF[name].narrow(dim, lo, hi - lo); None when lo == hi (the engine holds none of the piece)."""

    lo: int
    hi: int
    view: Optional[torch.Tensor] = None

    @property
    def numel(self) -> int:
        return 0 if self.view is None else self.view.numel()


def piece_view(target: torch.Tensor, dim: int, lo: int, hi: int, want: tuple[int, ...], offset: int = 0
               ) -> Optional[PieceView]:
    """PieceView of rows [lo, hi) of `target` along `dim` (starting at `offset` in it), or None if the view's
    shape is not the piece's."""
    if hi <= lo:
        return PieceView(lo, lo)
    view = target.narrow(dim, offset, hi - lo)
    return PieceView(lo, hi, view) if tuple(view.shape) == want else None


def covering_pieces(placed: list[tuple[Hashable, Optional[PieceView]]], held: dict[Hashable, int]
                    ) -> list[Optional[PieceView]]:
    """`piece_views`' rule: a key's PieceViews stand only if none of its pieces failed (None) and together they
    cover the `held[key]` elements the engine holds for it here."""
    got: dict[Hashable, int] = {}
    failed: set[Hashable] = set()
    for key, piece in placed:
        if piece is None:
            failed.add(key)
        else:
            got[key] = got.get(key, 0) + piece.numel
    return [piece if key not in failed and got.get(key, 0) == held.get(key) else None for key, piece in placed]


def shaped_view(view: torch.Tensor, shape: torch.Size) -> Optional[torch.Tensor]:
    """`view` as `shape` without a copy (what `weight_views` returns), or None if that needs a copy."""
    if view.shape == shape:
        return view
    return view.view(shape) if view.is_contiguous() and view.numel() == shape.numel() else None


def covering_views(placed: list[tuple[Hashable, Optional[torch.Tensor]]], held: dict[Hashable, int]
                   ) -> list[Optional[torch.Tensor]]:
    """`weight_views`' rule, for (key, view) per region: a key's views stand only if every one of its
    regions got a view and together they cover the `held[key]` elements the engine holds for it here."""
    got: dict[Hashable, int] = {}
    missing: set[Hashable] = set()
    for key, view in placed:
        if view is None:
            missing.add(key)
        else:
            got[key] = got.get(key, 0) + view.numel()
    return [view if key not in missing and got.get(key) == held.get(key) else None for key, view in placed]
