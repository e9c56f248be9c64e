"""The shapes a validated job is made of: each role's Megatron layout, its batch plan, the derived sizes, and the
frozen RunConfig that workers receive. Built by the one validation pass (validate.py); every layer below the entry
points reads them from here."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .algorithm_checks import AlgorithmPlan
from .placement import Placement
from .reward_checks import RewardPlan
from .rollout_checks import RolloutLayout
from .schema import PPOConfig


@dataclass(frozen=True)
class ParallelLayout:
    """Megatron layout of one role (ranks = tp * pp * cp * dp).

    Experts (mixture-of-experts models) are laid out separately over the same ranks: each pipeline stage's
    tp * cp * dp ranks are split into ep groups of etp ranks; ep ranks hold different experts, etp ranks
    split each expert's ffn, and the remaining (tp * cp * dp) / (ep * etp) are the experts' data parallel.
    """

    world_size: int
    tp: int
    pp: int
    cp: int
    vpp: Optional[int]
    dp: int
    sequence_parallel: bool
    dtype: str
    ep: int = 1
    etp: Optional[int] = None  # None: the same as tp (megatron's default)

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        return self.tp * self.cp * self.dp // (self.ep * self.expert_tp)

    def describe(self) -> str:
        """The dense layout as the run summaries print it."""
        return (f"tp={self.tp} pp={self.pp} cp={self.cp} dp={self.dp} vpp={self.vpp} sp={self.sequence_parallel} "
                f"dtype={self.dtype}")


@dataclass(frozen=True)
class BatchPlan:
    """How one training step's samples become optimizer steps and micro-batches for a role."""

    samples_per_step: int
    mini_batch_samples: int  # global samples per optimizer step
    mini_batches_per_epoch: int
    ppo_epochs: int
    mini_batch_per_dp: int  # samples per optimizer step on one dp rank
    micro_batch_per_gpu: Optional[int]  # None with dynamic batch size
    grad_accum: Optional[int]
    use_dynamic_bsz: bool
    max_token_len_per_gpu: int
    forward_micro_batch_per_gpu: Optional[int]  # log-prob / value forward passes
    forward_max_token_len_per_gpu: int

    @property
    def optimizer_steps_per_step(self) -> int:
        return self.mini_batches_per_epoch * self.ppo_epochs

    def describe_micro_batches(self) -> str:
        """How a dp rank cuts its mini-batch, as the run summaries print it."""
        if self.use_dynamic_bsz:
            return f"dynamic micro-batches <= {self.max_token_len_per_gpu} tokens"
        return f"micro-batch {self.micro_batch_per_gpu} -> grad accumulation {self.grad_accum}"


def describe_machine(device: str, world_size: int, trainer: Any) -> str:
    """The summaries' first line: device, ranks and how trainer.nnodes x trainer.n_gpus_per_node make them."""
    return f"device={device} world={world_size} ({trainer.nnodes} node(s) x {trainer.n_gpus_per_node})"


@dataclass(frozen=True)
class Derived:
    device: str  # cuda | cpu
    world_size: int
    actor: ParallelLayout
    rollout: RolloutLayout
    actor_batch: BatchPlan
    ref_forward_micro_batch_per_gpu: Optional[int]
    use_reference: bool
    use_critic: bool
    critic: Optional[ParallelLayout]
    critic_batch: Optional[BatchPlan]
    algorithm: Optional[AlgorithmPlan] = None  # None only in Derived objects built by hand (tests)
    placement: Placement = field(default_factory=Placement)
    notes: tuple[str, ...] = field(default_factory=tuple)
    reward: RewardPlan = field(default_factory=RewardPlan)  # reward model / judge / how rewards combine


@dataclass(frozen=True)
class RunConfig:
    """A validated job: the frozen user config plus the derived sizes."""

    cfg: PPOConfig
    derived: Derived

    def summary(self) -> str:
        d, c = self.derived, self.cfg
        a, b = d.actor, d.actor_batch
        lines = [
            describe_machine(d.device, d.world_size, c.trainer),
            f"actor layout: {a.describe()}"
            + (f" ep={a.ep} etp={a.expert_tp} expert_dp={a.expert_dp}" if a.ep > 1 or a.etp else ""),
            f"rollout: {d.rollout.engine} tp_g={d.rollout.tp} dp_g={d.rollout.dp} n={d.rollout.n}"
            + (f" ep_g={d.rollout.ep} (whole experts per rank)" if d.rollout.ep > 1 else ""),
            *([d.placement.describe()] if d.placement.split else []),
            f"batch: {c.data.train_batch_size} prompts x n={d.rollout.n} = {b.samples_per_step} samples/step; "
            f"{b.mini_batches_per_epoch} mini-batch(es) of {b.mini_batch_samples} samples x {b.ppo_epochs} epoch(s) "
            f"= {b.optimizer_steps_per_step} optimizer step(s)/step",
            f"per dp rank: {b.mini_batch_per_dp} samples/mini-batch, {b.describe_micro_batches()}",
            f"roles: actor{'' if d.placement.split else '+rollout'}{'+ref' if d.use_reference else ''}"
            f"{'+critic' if d.use_critic else ''} colocated" + (" (rollout apart)" if d.placement.split else ""),
        ]
        if d.algorithm is not None:
            lines.append(f"algorithm: {d.algorithm.describe()}")
        if d.reward.enabled:
            lines.append(f"reward: {d.reward.describe()}")
        lines += [f"note: {n}" for n in d.notes]
        return "\n".join(lines)
