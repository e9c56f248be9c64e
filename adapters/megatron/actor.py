"""MegatronActor: the policy (and, without optimizer, the frozen reference) on megatron-core.

Exact gradient accumulation: the objective of one optimizer step is the loss aggregated over the
WHOLE mini-batch (all micro-batches on all dp ranks), as if it were one batch. The objective
(hybridrl.algos.ActorObjective) aggregates each micro-batch with the mini-batch's global token and row
counts (agg_loss's verl 0.9 global-batch meaning: the one home of that rule), which makes it the
micro-batch's share times dp_size; the engine sums (never averages) over micro-batches and dp, so the
share is divided by dp_size here (engine.py's contract). Changing the micro-batch size, dynamic batching
or dp therefore does not change the update (tested).
"""
from __future__ import annotations

from typing import Optional

import torch

from hybridrl.adapters.base import ActorModel
from hybridrl.algos import ActorObjective, GlobalBatch
from hybridrl.config.layout import BatchPlan, ParallelLayout
from hybridrl.config.schema.actor import ActorConfig, ModelConfig, RefConfig
from hybridrl.protocol import DataProto

from .forward import MicroBatch, response_log_probs
from .lora import LoraSpec, disabled
from .role import MegatronRole
from .routing import Routing


class MegatronActor(MegatronRole, ActorModel):
    role = "actor"

    def __init__(self, model: ModelConfig, actor: Optional[ActorConfig], layout: ParallelLayout,
                 batch: Optional[BatchPlan], *, total_training_steps: Optional[int] = None,
                 ref: Optional[RefConfig] = None, ref_micro_batch: Optional[int] = None) -> None:
        """The policy from (model, actor, layout, batch), or the reference with `actor=None, ref=RefConfig`."""
        if actor is None and ref is None:
            raise ValueError("MegatronActor needs an ActorConfig (policy) or a RefConfig (reference)")
        self.cfg = actor
        self.batch = batch
        self.is_reference = actor is None
        megatron = ref.megatron if actor is None else actor.megatron
        replay = actor is not None and actor.router_replay.mode == "R3"
        super().__init__(model.path, megatron, layout, optim=None if actor is None else actor.optim,
                         override_config=model.override_config, recompute=model.enable_gradient_checkpointing,
                         load_weight=(ref or actor).load_weight, total_training_steps=total_training_steps,
                         transformer_overrides={"moe_enable_routing_replay": True} if replay else None,
                         remove_padding=model.use_remove_padding,
                         lora=LoraSpec.from_model(model) if actor is not None else None)
        self.objective = None if actor is None else ActorObjective.from_config(actor)
        self.routing = Routing(self.engine.chunks, replay) if self.arch.is_moe and actor is not None else None
        if actor is None:
            self._fwd_rows = ref_micro_batch or ref.log_prob_micro_batch_size_per_gpu
            self._fwd_tokens = ref.log_prob_max_token_len_per_gpu if ref.log_prob_use_dynamic_bsz else None
        else:
            self._fwd_rows = batch.forward_micro_batch_per_gpu if batch else None
            self._fwd_tokens = batch.forward_max_token_len_per_gpu if batch and batch.use_dynamic_bsz else None

    @classmethod
    def reference(cls, model: ModelConfig, ref: RefConfig, layout: ParallelLayout,
                  micro_batch: Optional[int] = None) -> "MegatronActor":
        """The frozen reference policy: the actor's builder and weights, no optimizer."""
        return cls(model, None, layout, None, ref=ref, ref_micro_batch=micro_batch)

    def adapters_off(self, ref: RefConfig, micro_batch: Optional[int] = None) -> "AdaptersOff":
        """The reference policy of a LoRA actor: this actor with its adapters off (no second model)."""
        if self.lora is None:
            raise RuntimeError("adapters_off: the actor has no LoRA adapters (actor_rollout_ref.model.lora_rank=0)")
        rows = micro_batch or ref.log_prob_micro_batch_size_per_gpu or self._fwd_rows
        return AdaptersOff(self, rows, ref.log_prob_max_token_len_per_gpu if ref.log_prob_use_dynamic_bsz else None)

    # ---------------------------------------------------------------------------------- log-probs
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False) -> DataProto:
        """log_probs [B, R] (+ entropys; + sum_pi_squared when meta_info calculate_sum_pi_squared is set)."""
        temperature = float(data.meta_info.get("temperature", 1.0))
        sum_pi_squared = bool(data.meta_info.get("calculate_sum_pi_squared", False))
        mbs = self._micro_batches(data, [], self._fwd_rows, self._fwd_tokens)
        vocab = self.arch.vocab_size

        def loss_fn(out: torch.Tensor, mb: MicroBatch):
            stats = response_log_probs(out, mb, vocab, temperature, with_entropy=calculate_entropy,
                                       with_sum_pi_squared=sum_pi_squared)
            metrics = {"log_probs": stats.log_probs, "entropys": stats.entropy, "sum_pi_squared": stats.sum_pi_squared}
            return stats.log_probs.new_zeros(()), {k: v for k, v in metrics.items() if v is not None}

        with self._routing(data, measure=True) as prepare:
            results = self.engine.run(mbs, loss_fn, forward_only=True, prepare=prepare)
            agreement = self._routing_session.result() if prepare is not None else None
        shape = tuple(data.batch["responses"].shape)
        keys = ["log_probs"] + (["entropys"] if calculate_entropy else []) + (["sum_pi_squared"] if sum_pi_squared else [])
        out = {k: self._gather_rows(results, mbs, k, shape) for k in keys}
        if agreement is not None:  # MoE with the rollout's routing: per response token, -1 where unknown
            out["routing_agreement"] = agreement
        return DataProto.from_dict(out, meta_info={"temperature": temperature})

    # ---------------------------------------------------------------------------------- update
    def update_policy(self, data: DataProto) -> dict[str, float]:
        if self.is_reference:
            raise RuntimeError("update_policy called on the reference model (built without an optimizer)")
        temperature = float(data.meta_info.get("temperature", 1.0))
        keys = self._input_keys(data)
        names = self.objective.total_names() + self.objective.mean_names()
        return self._update(data, keys, lambda mini: self._loss_fn(mini, temperature), names)

    def _input_keys(self, data: DataProto) -> list[str]:
        """Per-row tensors a micro-batch carries into the loss."""
        return self.objective.input_keys() + (["rollout_is_weights"] if "rollout_is_weights" in data.batch else [])

    def _loss_fn(self, mini: DataProto, temperature: float):
        objective, cfg = self.objective, self.cfg
        batch = global_batch(mini, cfg.loss_scale_factor)
        vocab = self.arch.vocab_size
        mask = mini.batch["response_mask"]  # the host's copy: a micro-batch's token count without a device sync

        def loss_fn(out: torch.Tensor, mb: MicroBatch):
            stats = response_log_probs(out, mb, vocab, temperature, with_entropy=True,
                                       entropy_grad=cfg.entropy_coeff != 0)
            result = objective(stats.log_probs, stats.entropy, mb.extras, batch)
            w_tok = float(mask[mb.rows].sum()) / max(batch.batch_num_tokens, 1.0)
            metrics = {k: v / batch.dp_size for k, v in result.totals.items()}
            # float64 on the device: the same numbers as float(v) * w_tok on the host, without a sync per micro-batch
            # (the role brings all metrics over at once: role.host_sums)
            metrics.update({k: _scaled(v, w_tok) for k, v in result.means.items()})
            return result.loss / batch.dp_size, metrics

        return loss_fn


class AdaptersOff:
    """The reference policy as the LoRA actor with its adapters off: the ref's micro-batch sizes, the actor's
    weights. Its weights are the actor's, so offload/onload leave them alone (the actor's phases move them)."""

    def __init__(self, actor: MegatronActor, rows: Optional[int], tokens: Optional[int]) -> None:
        self.actor, self.rows, self.tokens = actor, rows, tokens

    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False) -> DataProto:
        actor = self.actor
        saved = actor._fwd_rows, actor._fwd_tokens
        actor._fwd_rows, actor._fwd_tokens = self.rows, self.tokens
        try:
            with disabled(actor.engine.chunks):
                return actor.compute_log_prob(data, calculate_entropy)
        finally:
            actor._fwd_rows, actor._fwd_tokens = saved

    def offload(self, params: bool, grads: bool, optimizer: bool) -> None:
        return None

    def onload(self, params: bool, grads: bool, optimizer: bool) -> None:
        return None


def _scaled(v, w: float):
    """v * w in float64, v a float or a (device) tensor: exactly float(v) * w, which a tensor gets without a sync."""
    return v.detach().to(torch.float64) * w if isinstance(v, torch.Tensor) else float(v) * w


def global_batch(mini: DataProto, loss_scale_factor: Optional[float] = None) -> GlobalBatch:
    """This mini-batch's global sizes (response tokens and rows summed over all data-parallel ranks)."""
    from megatron.core import parallel_state as ps

    from .engine import sum_over_dp

    tokens, rows = sum_over_dp([float(mini.batch["response_mask"].sum()), float(len(mini))])
    return GlobalBatch(ps.get_data_parallel_world_size(), tokens, rows, loss_scale_factor)
