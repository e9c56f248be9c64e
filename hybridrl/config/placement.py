"""Where the rollout runs: colocated with the actor (the hybrid engine) or on its own GPUs (split), and the
one-step-off-policy pipeline that a split placement makes possible (trainer.one_step_off_policy)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

from .async_checks import AsyncPlan, check_async
from .problems import Problems
from .schema import PPOConfig

ARA = "actor_rollout_ref"
SPLIT_HINT = (f"set {ARA}.hybrid_engine=false and {ARA}.rollout.n_gpus_per_node=K (the rollout's own GPUs; "
              "worker processes on CPU)")


@dataclass(frozen=True)
class Placement:
    split: bool = False  # the rollout has its own processes (hybrid_engine=false)
    rollout_nnodes: int = 0
    rollout_gpus_per_node: int = 0
    one_step_off: bool = False  # generation of step k+1 overlaps the update of step k
    fully_async: Optional[AsyncPlan] = None  # async_training.enable: the rollout generates continuously

    @property
    def rollout_world(self) -> int:
        return self.rollout_nnodes * self.rollout_gpus_per_node if self.split else 0

    def describe(self) -> str:
        if not self.split:
            return "placement: colocated (hybrid engine: rollout and training share every GPU)"
        mode = "one-step-off-policy (generation of step k+1 overlaps the update of step k)" if self.one_step_off \
            else self.fully_async.describe() if self.fully_async else "synchronous"
        return (f"placement: split, rollout on its own {self.rollout_nnodes} x {self.rollout_gpus_per_node} "
                f"GPU(s)/process(es), weights broadcast {'at each sync' if self.fully_async else 'after every update'}; "
                f"{mode}")


def check_placement(cfg: PPOConfig, device: str, p: Problems,
                    gpu_count: Optional[Callable[[], int]] = None) -> Placement:
    r, t = cfg.actor_rollout_ref.rollout, cfg.trainer
    split = not cfg.actor_rollout_ref.hybrid_engine
    if not split:
        if r.n_gpus_per_node or r.nnodes:
            p.notes.append(f"{ARA}.rollout.nnodes/n_gpus_per_node have no effect with {ARA}.hybrid_engine=true "
                           "(the rollout shares the actor's GPUs)")
        p.check(not t.one_step_off_policy,
                f"trainer.one_step_off_policy=true needs a split placement (the rollout on its own GPUs, generating "
                f"while the actor trains); {SPLIT_HINT}")
        p.check(not cfg.async_training.enable, f"async_training.enable=true needs a split placement; {SPLIT_HINT}")
        return Placement()
    nodes = max(r.nnodes, 1)
    p.check(r.n_gpus_per_node >= 1, f"{ARA}.hybrid_engine=false runs the rollout on its own GPUs: set "
                                    f"{ARA}.rollout.n_gpus_per_node >= 1 (got {r.n_gpus_per_node})")
    p.check(r.nnodes >= 0, f"{ARA}.rollout.nnodes={r.nnodes} must be >= 0")
    p.check(t.backend == "ray", f"{ARA}.hybrid_engine=false needs trainer.backend=ray (torchrun's ranks all train); "
                                "set trainer.backend=ray")
    m = cfg.actor_rollout_ref.actor.megatron
    offloads = [k for k in ("param_offload", "grad_offload", "optimizer_offload") if getattr(m, k)]
    if offloads:
        p.notes.append(f"{ARA}.actor.megatron.{{{','.join(offloads)}}}=true have no effect with {ARA}.hybrid_engine=false: "
                       "the actor offloads to make room for a colocated engine, and its GPUs hold none")
    if t.one_step_off_policy:
        p.check(not cfg.algorithm.filter_groups.enable,
                "trainer.one_step_off_policy=true with algorithm.filter_groups.enable=true is not supported (dynamic "
                "sampling decides how many batches to generate only after scoring them); turn one of them off")
        p.check(cfg.algorithm.adv_estimator != "remax",
                "trainer.one_step_off_policy=true with algorithm.adv_estimator=remax is not supported (the greedy "
                "baselines would come from a stale policy); use grpo/rloo or trainer.one_step_off_policy=false")
    if device == "cuda" and t.nnodes == 1 and nodes == 1:
        have = gpu_count() if gpu_count is not None else _cuda_device_count()
        need = t.n_gpus_per_node + r.n_gpus_per_node
        # have == 0: checked on a machine without GPUs (a login node, `--cfg job`, `hybridrl plan`): not this one's job
        p.check(have == 0 or have >= need,
                f"{ARA}.hybrid_engine=false on one node needs trainer.n_gpus_per_node + {ARA}.rollout.n_gpus_per_node "
                f"= {t.n_gpus_per_node} + {r.n_gpus_per_node} = {need} GPUs; this machine has {have}. "
                + ("One GPU cannot hold a split placement: keep the colocated hybrid engine "
                   f"({ARA}.hybrid_engine=true, trainer.one_step_off_policy=false)" if have == 1 else
                   "Lower one of them"))
    return Placement(split=True, rollout_nnodes=nodes, rollout_gpus_per_node=max(r.n_gpus_per_node, 1),
                     one_step_off=t.one_step_off_policy, fully_async=check_async(cfg, p))


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def joins_cluster(address: Optional[str]) -> bool:
    """Whether Ray is joined at a running cluster (an address, or RAY_ADDRESS) instead of started here; the trainer's
    memory check and controller.runtime_env.init_ray both ask."""
    return address not in (None, "local") or (address is None and bool(os.environ.get("RAY_ADDRESS")))
