"""The interface between the trainer and a model backend.

Batches are DataProto with verl's keys (B samples, P prompt tokens left-padded, R response tokens
right-padded, T = P + R):
    input_ids [B, T], attention_mask [B, T] (1 on real tokens), position_ids [B, T],
    responses [B, R], response_mask [B, R] (1 on generated tokens up to and including EOS),
    old_log_probs [B, R], ref_log_prob [B, R], rollout_log_probs [B, R] (optional, for TIS),
    advantages [B, R], values [B, R], returns [B, R].
meta_info carries per-batch values such as `temperature` (applied to logits exactly as the rollout did).

Every method is collective over the role's ranks (SPMD): all tp/pp/dp ranks call it with their dp
slice; results are meaningful on collecting ranks (tp rank 0 on the last pipeline stage), which
`dispatch_info()` names for the controller's mesh-aware dispatch.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Collection, Iterator, Optional

import torch

from hybridrl.protocol import DataProto, DispatchInfo  # noqa: F401  (DispatchInfo: what dispatch_info() returns)

WeightBucket = list[tuple[str, torch.Tensor]]  # (HuggingFace name, full unsharded tensor)


@dataclass(frozen=True)
class WeightRegion:
    """A piece of one HF weight that this rank holds in its own training shard.

    `src` is a view of the live parameter whose elements, in C order, are
    HF[name].narrow(dim, start, stop - start); `extent` is the HF tensor's full size along `dim`.
    The rollout's direct copy writes these straight into the engine (hybridrl.hybrid.direct).
    """

    name: str
    dim: int
    start: int
    stop: int
    extent: int
    src: torch.Tensor

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop == self.extent


@dataclass(frozen=True)
class OffloadReport:
    params_bytes: int = 0
    grads_bytes: int = 0
    optimizer_bytes: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0  # of `seconds`: waiting for the device's queued work before moving anything
    host_alloc_seconds: float = 0.0  # of `seconds`: allocating and pinning host memory (first offload only)
    optimizer_seconds: float = 0.0  # the optimizer state's copies from start to end (device time; may predate the call)
    optimizer_exposed_seconds: float = 0.0  # of `seconds`: waiting for those copies (what no other work hid)

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


class ModelRole(ABC):
    """What every model role does besides its math: say where it sits, move its memory, checkpoint."""

    @abstractmethod
    def dispatch_info(self) -> DispatchInfo: ...

    @abstractmethod
    def offload(self, params: bool, grads: bool, optimizer: bool) -> OffloadReport: ...

    @abstractmethod
    def onload(self, params: bool, grads: bool, optimizer: bool) -> OffloadReport:
        """Bring offloaded state back. An optimizer state left offloaded comes back by itself before the
        role's next optimizer step and before a checkpoint: callers may leave it off until then."""

    def prepare_offload(self, params: bool, grads: bool, optimizer: bool, *,
                        onload_reserve: Optional[int] = None) -> None:
        """The caller will offload these kinds between steps: get ready (e.g. allocate host memory in the
        background). `onload_reserve`: the device bytes an update's forward/backward needs beyond what is resident
        when it starts (hybridrl.plan.estimate.actor_onload_reserve); with it an offloaded optimizer state may come
        back beside the forward/backward as far as free memory allows. Default: nothing; offload() allocates at
        first use and the state comes back before the step."""
        return None

    def begin_offload(self, params: bool, optimizer: bool) -> None:
        """Start moving these kinds to the host and return at once; the next offload() of them completes the move
        (and frees their device memory), an onload() in between cancels it. Default: nothing (offload() does all)."""
        return None

    def startup_times(self) -> dict[str, float]:
        """Seconds of named parts of this role's start-up (hybridrl.utils.startup); default: none."""
        return {}

    @abstractmethod
    def save_checkpoint(self, path: str) -> None: ...

    @abstractmethod
    def load_checkpoint(self, path: str) -> None: ...


class ActorModel(ModelRole):
    """The policy (or, built without an optimizer, the frozen reference)."""

    @abstractmethod
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False) -> DataProto:
        """Log-probs [B, R] of `responses` (key `log_probs`; `entropys` too if asked) at meta temperature."""

    @abstractmethod
    def update_policy(self, data: DataProto) -> dict[str, float]:
        """One PPO update over the batch's mini-batches; returns actor/* metrics."""

    @abstractmethod
    def export_weights(self, bucket_bytes: int, names: Optional[Collection[str]] = None) -> Iterator[WeightBucket]:
        """Stream the full model as HF-named tensors in buckets of about `bucket_bytes` (collective).

        `names`: only these HF weights (every rank passes the same set); None: all of them."""

    def export_adapter_weights(self, bucket_bytes: int) -> Iterator[WeightBucket]:
        """LoRA (actor_rollout_ref.model.lora.merge=false): the adapters only, as (PEFT name, full HF-shaped tensor)
        buckets on every rank (collective); export_weights then gives the frozen base, which the engine loads once."""
        raise NotImplementedError(f"{type(self).__name__} has no LoRA adapters to export; set "
                                  "actor_rollout_ref.model.lora.merge=true or lora_rank=0")

    def weight_regions(self) -> Optional[list[WeightRegion]]:
        """This rank's pieces of the HF weights as views of its live parameters (under pipeline or expert
        parallelism only what this rank holds), in a fixed order; None where they cannot serve as copy sources."""
        return None


class CriticModel(ModelRole):
    """The value model: same builder as the actor, with a scalar value head."""

    @abstractmethod
    def compute_values(self, data: DataProto) -> DataProto:
        """Values [B, R] (key `values`) at the response positions."""

    @abstractmethod
    def update_critic(self, data: DataProto) -> dict[str, float]:
        """One clipped value-loss update; returns critic/* metrics."""
