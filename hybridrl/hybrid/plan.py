"""The reshard plan: how ranks of the Megatron training layout map onto rollout replicas.

Training layout (tp, pp, cp, dp) uses megatron-core's default rank order "tp-cp-ep-dp-pp":
    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
Rollout layout (tp_g, dp_g = world / tp_g): consecutive ranks form a replica, which is also how
vLLM's external launcher groups them:
    replica = rank // tp_g,  tp_g rank = rank % tp_g
Each replica generates one dp_g chunk of the step's prompts; every rank of a replica gets the same
chunk and the replica's output is collected from its tp_g rank 0.

The export that fills the engines (adapters/megatron export_hf_weights, driven by
hybridrl.hybrid.weight_sync) runs two collectives per pipeline stage and bucket:
  1. TP all-gather inside each tp group: the stage's tensor-parallel shards -> full tensors;
  2. PP broadcast along each pp group from the stage that owns the layer, so every rank of every
     stage ends with the full HF tensor.
A mixture of experts' routed experts are laid out apart (megatron's expert order "tp-ep-dp-pp" over the same ranks,
with etp in tp's place): each rank holds 1/ep of them, split over etp; the export gathers them over etp, then
all-gathers each bucket's experts over the ep group.
Data-parallel replicas hold equal copies and talk to nobody. Every rank then hands the full tensors
to its engine, which keeps its tp_g shard (vLLM) or all of it (the torch engine does not shard).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Placement:
    """Where one global rank sits in both layouts."""

    rank: int
    tp_rank: int
    cp_rank: int
    dp_rank: int
    pp_rank: int
    replica: int
    tp_g_rank: int


@dataclass(frozen=True)
class CollectiveStep:
    kind: str  # tp_all_gather | pp_broadcast
    groups: tuple[tuple[int, ...], ...]
    what: str


@dataclass(frozen=True)
class ReshardPlan:
    world_size: int
    tp: int
    pp: int
    dp: int
    tp_g: int
    cp: int = 1
    ep: int = 1  # routed experts over ep ranks of each stage (MoE), each split over etp
    etp: Optional[int] = None  # None: tp

    def __post_init__(self) -> None:
        for key, value in (("tp", self.tp), ("pp", self.pp), ("dp", self.dp), ("cp", self.cp), ("tp_g", self.tp_g)):
            if value < 1:
                raise ValueError(f"ReshardPlan: {key}={value} must be >= 1")
        if self.tp * self.pp * self.cp * self.dp != self.world_size:
            raise ValueError(f"ReshardPlan: tp*pp*cp*dp = {self.tp}*{self.pp}*{self.cp}*{self.dp} != world size "
                             f"{self.world_size}; fix actor_rollout_ref.actor.megatron.*_parallel_size")
        if self.world_size % self.tp_g:
            raise ValueError(f"ReshardPlan: rollout tp_g={self.tp_g} must divide the {self.world_size} ranks; "
                             f"set actor_rollout_ref.rollout.tensor_model_parallel_size to a divisor")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_layouts(cls, train: Any, rollout: Any, hf_config: Optional[Any] = None) -> "ReshardPlan":
        """From hybridrl.config.validate's ParallelLayout (actor) and RolloutLayout."""
        plan = cls(train.world_size, train.tp, train.pp, train.dp, rollout.tp, getattr(train, "cp", 1),
                   getattr(train, "ep", 1), getattr(train, "etp", None))
        if hf_config is not None:
            plan.check_model(hf_config)
        return plan

    def check_model(self, hf_config: Any) -> None:
        """A sharding engine splits attention heads over tp_g: they must divide (kv heads may replicate)."""
        heads = getattr(hf_config, "num_attention_heads", None)
        if heads is not None and heads % self.tp_g:
            raise ValueError(f"ReshardPlan: the model's {heads} attention heads do not split over rollout tp_g={self.tp_g}; "
                             f"choose actor_rollout_ref.rollout.tensor_model_parallel_size dividing {heads}")
        kv = getattr(hf_config, "num_key_value_heads", None) or heads
        if kv is not None and kv % self.tp_g and self.tp_g % kv:
            raise ValueError(f"ReshardPlan: {kv} key/value heads neither split over nor replicate onto tp_g={self.tp_g}")

    # ------------------------------------------------------------------ rank maps
    @property
    def dp_g(self) -> int:
        return self.world_size // self.tp_g

    def placement(self, rank: int) -> Placement:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"ReshardPlan: rank {rank} outside world of {self.world_size}")
        tp_rank, rest = rank % self.tp, rank // self.tp
        cp_rank, rest = rest % self.cp, rest // self.cp
        dp_rank, pp_rank = rest % self.dp, rest // self.dp
        return Placement(rank, tp_rank, cp_rank, dp_rank, pp_rank, rank // self.tp_g, rank % self.tp_g)

    def train_rank(self, tp_rank: int, cp_rank: int, dp_rank: int, pp_rank: int) -> int:
        return tp_rank + self.tp * (cp_rank + self.cp * (dp_rank + self.dp * pp_rank))

    def replica_ranks(self, replica: int) -> tuple[int, ...]:
        if not 0 <= replica < self.dp_g:
            raise ValueError(f"ReshardPlan: replica {replica} outside the {self.dp_g} rollout replicas")
        return tuple(range(replica * self.tp_g, (replica + 1) * self.tp_g))

    def collect_ranks(self) -> tuple[int, ...]:
        """The rank whose output counts for each replica (its tp_g rank 0)."""
        return tuple(r * self.tp_g for r in range(self.dp_g))

    def prompt_slice(self, num_prompts: int, replica: int) -> slice:
        """The prompts replica `replica` generates: its dp_g chunk (pad the batch to a multiple first)."""
        if num_prompts % self.dp_g:
            raise ValueError(f"ReshardPlan: {num_prompts} prompts do not split over {self.dp_g} rollout replicas; "
                             f"pad with hybridrl.protocol.pad_to_multiple(batch, {self.dp_g}) first")
        self.replica_ranks(replica)
        size = num_prompts // self.dp_g
        return slice(replica * size, (replica + 1) * size)

    # ------------------------------------------------------------------ the export's collectives
    def tp_groups(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(self.train_rank(t, c, d, p) for t in range(self.tp))
                     for p in range(self.pp) for d in range(self.dp) for c in range(self.cp))

    def pp_groups(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(self.train_rank(t, c, d, p) for p in range(self.pp))
                     for d in range(self.dp) for c in range(self.cp) for t in range(self.tp))

    def ep_groups(self) -> tuple[tuple[int, ...], ...]:
        """The expert-parallel groups: rank = etp_rank + etp * (ep_rank + ep * (expert_dp_rank + expert_dp * pp_rank))."""
        etp = self.etp or self.tp
        edp = self.world_size // (self.pp * self.ep * etp)
        return tuple(tuple(t + etp * (e + self.ep * (d + edp * p)) for e in range(self.ep))
                     for p in range(self.pp) for d in range(edp) for t in range(etp))

    def collective_steps(self) -> list[CollectiveStep]:
        steps = []
        if self.ep > 1:
            steps.append(CollectiveStep("ep_all_gather", self.ep_groups(),
                                        f"gather each bucket's routed experts from the {self.ep} expert-parallel ranks"))
        if self.tp > 1:
            steps.append(CollectiveStep("tp_all_gather", self.tp_groups(),
                                        f"gather {self.tp} tensor-parallel shards into full tensors, per stage"))
        if self.pp > 1:
            steps.append(CollectiveStep("pp_broadcast", self.pp_groups(),
                                        f"broadcast each stage's full tensors to the other {self.pp - 1} stage(s)"))
        return steps

    def bytes_per_sync(self, model_bytes: int) -> dict[str, int]:
        """Expected bytes of one sync. `streamed_per_rank` is exact (each engine receives the full model);
        `received_per_rank` is an upper bound assuming equal stages and every tensor tp-sharded."""
        own_stage = model_bytes // self.pp
        gathered = own_stage * (self.tp - 1) // self.tp
        broadcast = model_bytes - own_stage
        return {
            "streamed_per_rank": model_bytes,
            "received_per_rank": gathered + broadcast,
            "received_total": (gathered + broadcast) * self.world_size,
        }

    def describe(self, model_bytes: Optional[int] = None) -> str:
        lines = [f"reshard: train tp={self.tp} pp={self.pp} cp={self.cp} dp={self.dp} (world {self.world_size}) "
                 f"-> rollout tp_g={self.tp_g} dp_g={self.dp_g}"]
        for r in range(self.dp_g):
            lines.append(f"  replica {r}: ranks {list(self.replica_ranks(r))}, prompt chunk {r}/{self.dp_g}, "
                         f"collect from rank {r * self.tp_g}")
        for s in self.collective_steps():
            lines.append(f"  {s.kind}: {s.what}; groups {[list(g) for g in s.groups]}")
        if not self.collective_steps():
            lines.append("  no collectives: every rank holds the full model")
        if model_bytes is not None:
            b = self.bytes_per_sync(model_bytes)
            lines.append(f"  bytes/sync: {b['streamed_per_rank'] / 2**20:.1f} MiB into each engine, "
                         f"<= {b['received_per_rank'] / 2**20:.1f} MiB received per rank"
                         + (f", plus the routed experts of the other {self.ep - 1} ep rank(s)" if self.ep > 1 else ""))
        return "\n".join(lines)
