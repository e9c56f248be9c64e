"""The actor's objective on one micro-batch: policy loss - entropy_coeff * entropy + kl_loss_coef * KL.

Backends compute the log-probs (and entropies) of the response tokens and call an ActorObjective with
the batch's inputs and the mini-batch's GlobalBatch; every term is aggregated with agg_loss's global
meaning, so the returned loss is this micro-batch's share of the mini-batch objective times dp_size
(verl's convention, agg.py). As verl 0.9's ppo_loss does, entropy and KL use the policy loss's
loss_agg_mode, and algorithm.rollout_correction.bypass_mode=true swaps the policy loss for `bypass_mode`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, NamedTuple, Optional

import torch

from .agg import GlobalBatch
from .kl import KL_PENALTIES, kl_penalty
from .policy_loss import POLICY_LOSSES, PolicyLossParams, aggregate, compute_policy_loss, loss_metric_names


class ObjectiveOutput(NamedTuple):
    loss: torch.Tensor  # [] carries the gradient
    totals: dict[str, torch.Tensor]  # detached shares of mini-batch aggregates (pg_loss, entropy, kl_loss)
    means: dict[str, Any]  # the policy loss's metrics: means over this micro-batch's tokens


@dataclass(frozen=True)
class ActorObjective:
    loss_mode: str
    params: PolicyLossParams
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_type: str = "low_var_kl"
    kl_loss_coef: float = 0.001

    def __post_init__(self) -> None:
        POLICY_LOSSES.get(self.loss_mode)  # unknown names fail here, before any forward pass
        if self.use_kl_loss:
            KL_PENALTIES.get(self.kl_loss_type)

    @classmethod
    def from_config(cls, actor: Any) -> "ActorObjective":
        """From actor_rollout_ref.actor (verl's keys)."""
        params = PolicyLossParams.from_config(actor)
        bypass = params.policy_loss.rollout_correction.bypass_mode
        return cls("bypass_mode" if bypass else actor.policy_loss.loss_mode, params, actor.entropy_coeff,
                   actor.use_kl_loss, actor.kl_loss_type, actor.kl_loss_coef)

    def input_keys(self) -> list[str]:
        """Batch tensors the objective reads ([B, R] each); rollout_is_weights is used when present."""
        return ["response_mask", "old_log_probs", "advantages"] + (["ref_log_prob"] if self.use_kl_loss else [])

    def total_names(self) -> list[str]:
        return ["actor/pg_loss", "actor/entropy"] + (["actor/kl_loss"] if self.use_kl_loss else [])

    def mean_names(self) -> list[str]:
        return loss_metric_names(self.loss_mode, self.params)

    def __call__(self, log_prob: torch.Tensor, entropy: Optional[torch.Tensor], inputs: Mapping[str, torch.Tensor],
                 batch: GlobalBatch = GlobalBatch()) -> ObjectiveOutput:
        """log_prob, entropy: [B, R] of the current policy (entropy may be None); inputs: input_keys()."""
        if batch.loss_scale_factor is None:
            batch = replace(batch, loss_scale_factor=self.params.loss_scale_factor)
        params = self.params.with_global_batch(batch)
        mask = inputs["response_mask"]
        pg = compute_policy_loss(self.loss_mode, inputs["old_log_probs"], log_prob, inputs["advantages"], mask,
                                 params, inputs.get("rollout_is_weights"))
        loss = pg.pg_loss
        totals = {"actor/pg_loss": pg.pg_loss.detach()}
        if entropy is not None:
            ent = aggregate(entropy, mask, params.loss_agg_mode, params)
            loss = loss - self.entropy_coeff * ent
            totals["actor/entropy"] = ent.detach()
        if self.use_kl_loss:
            kl = aggregate(kl_penalty(log_prob, inputs["ref_log_prob"], self.kl_loss_type), mask,
                           params.loss_agg_mode, params)
            loss = loss + self.kl_loss_coef * kl
            totals["actor/kl_loss"] = kl.detach()
        return ObjectiveOutput(loss, totals, dict(pg.metrics))
