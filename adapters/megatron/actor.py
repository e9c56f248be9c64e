"""MegatronActor: the policy (and, without optimizer, the frozen reference) on megatron-core.

Exact gradient accumulation: the objective of one optimizer step is the loss aggregated over the
WHOLE mini-batch (all micro-batches on all dp ranks), as if it were one batch. Each micro-batch's
aggregate is multiplied by its share of the global normaliser of the aggregation mode:
  token-mean            tokens in micro-batch / tokens in mini-batch (all dp ranks)
  seq-mean-token-*      rows in micro-batch / rows in mini-batch
  seq-mean-token-sum-norm (a sum over a constant horizon): 1
and the engine sums (never averages) these shares over micro-batches and dp. Changing the
micro-batch size, dynamic batching or dp therefore does not change the update (tested).
"""
from __future__ import annotations

from typing import Optional

import torch

from hybridrl.adapters.base import ActorModel
from hybridrl.algos import KL_PENALTIES, POLICY_LOSSES, PolicyLossParams, agg_loss, tis_weights
from hybridrl.algos.policy_loss.gspo import GSPO_AGG_MODE
from hybridrl.config.schema.actor import ActorConfig, ModelConfig, RefConfig
from hybridrl.config.validate import BatchPlan, ParallelLayout
from hybridrl.protocol import DataProto

from .forward import MicroBatch, response_log_probs
from .role import MegatronRole

# Policy losses that aggregate with a fixed mode whatever loss_agg_mode says (verl's behaviour).
FIXED_AGG = {"gspo": GSPO_AGG_MODE}
# Which global count each aggregation mode divides by; unknown (user) modes are treated as row means.
NORMALISER = {"token-mean": "tokens", "seq-mean-token-sum": "rows", "seq-mean-token-mean": "rows",
              "seq-mean-token-sum-norm": "none"}
METRICS = ["actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy",
           "actor/kl_loss"]


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
        super().__init__(model.path, megatron, layout, optim=None if actor is None else actor.optim,
                         override_config=model.override_config, recompute=model.enable_gradient_checkpointing,
                         load_weight=(ref or actor).load_weight, total_training_steps=total_training_steps,
                         remove_padding=model.use_remove_padding)
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

    # ---------------------------------------------------------------------------------- log-probs
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False) -> DataProto:
        temperature = float(data.meta_info.get("temperature", 1.0))
        mbs = self._micro_batches(data, [], self._fwd_rows, self._fwd_tokens)
        vocab = self.arch.vocab_size

        def loss_fn(out: torch.Tensor, mb: MicroBatch):
            logp, ent = response_log_probs(out, mb, vocab, temperature, with_entropy=calculate_entropy)
            metrics = {"log_probs": logp} if ent is None else {"log_probs": logp, "entropys": ent}
            return logp.new_zeros(()), metrics

        results = self.engine.run(mbs, loss_fn, forward_only=True)
        shape = tuple(data.batch["responses"].shape)
        out = {"log_probs": self._gather_rows(results, mbs, "log_probs", shape)}
        if calculate_entropy:
            out["entropys"] = self._gather_rows(results, mbs, "entropys", shape)
        return DataProto.from_dict(out, meta_info={"temperature": temperature})

    # ---------------------------------------------------------------------------------- update
    def update_policy(self, data: DataProto) -> dict[str, float]:
        if self.is_reference:
            raise RuntimeError("update_policy called on the reference model (built without an optimizer)")
        temperature = float(data.meta_info.get("temperature", 1.0))
        out = self._update(data, self._input_keys(data), lambda mini: self._loss_fn(mini, temperature), METRICS)
        if not self.cfg.use_kl_loss:
            out.pop("actor/kl_loss")
        return out

    def _loss_fn(self, mini: DataProto, temperature: float):
        cfg = self.cfg
        mode = cfg.policy_loss.loss_mode
        agg = FIXED_AGG.get(mode, cfg.loss_agg_mode)
        policy_loss = POLICY_LOSSES.get(mode)
        params = PolicyLossParams(clip_ratio=cfg.clip_ratio, clip_ratio_low=cfg.clip_ratio_low,
                                  clip_ratio_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c)
        if cfg.use_kl_loss:
            KL_PENALTIES.get(cfg.kl_loss_type)  # fail before the forward pass on a wrong name
        tokens, rows = global_counts(mini)
        normaliser = NORMALISER.get(agg, "rows")
        vocab = self.arch.vocab_size

        def loss_fn(out: torch.Tensor, mb: MicroBatch):
            x = mb.extras
            mask = x["response_mask"]
            logp, ent = response_log_probs(out, mb, vocab, temperature, with_entropy=True,
                                           entropy_grad=cfg.entropy_coeff != 0)
            w_tok, w = loss_weights(mask, tokens, rows, normaliser)
            is_w = (tis_weights(x["old_log_probs"], x["rollout_log_probs"], cfg.tis_imp_ratio_cap)
                    if "rollout_log_probs" in x else None)
            pg = policy_loss(x["old_log_probs"], logp, x["advantages"], mask, params, agg, is_w)
            entropy = agg_loss(ent, mask, agg)
            loss = pg.pg_loss - cfg.entropy_coeff * entropy
            metrics = {"actor/pg_loss": pg.pg_loss.detach() * w, "actor/pg_clipfrac": pg.pg_clipfrac * w_tok,
                       "actor/ppo_kl": pg.ppo_kl * w_tok, "actor/pg_clipfrac_lower": pg.pg_clipfrac_lower * w_tok,
                       "actor/entropy": entropy.detach() * w}
            if cfg.use_kl_loss:
                kl = agg_loss(KL_PENALTIES.get(cfg.kl_loss_type)(logp, x["ref_log_prob"]), mask, agg)
                loss = loss + cfg.kl_loss_coef * kl
                metrics["actor/kl_loss"] = kl.detach() * w
            return loss * w, metrics

        return loss_fn

    def _input_keys(self, data: DataProto) -> list[str]:
        keys = ["response_mask", "old_log_probs", "advantages"]
        if self.cfg.use_kl_loss:
            keys.append("ref_log_prob")
        if self.cfg.tis_imp_ratio_cap > 0:
            if "rollout_log_probs" not in data.batch:
                raise KeyError("actor.tis_imp_ratio_cap > 0 needs rollout_log_probs in the batch; set "
                               "actor_rollout_ref.rollout.calculate_log_probs=true")
            keys.append("rollout_log_probs")
        return keys


def loss_weights(mask: torch.Tensor, tokens: float, rows: float, normaliser: str) -> tuple[float, float]:
    """(this micro-batch's share of the mini-batch's tokens, its share under the loss normaliser)."""
    w_tok = float(mask.sum()) / max(tokens, 1.0)
    return w_tok, {"tokens": w_tok, "rows": mask.shape[0] / max(rows, 1.0), "none": 1.0}[normaliser]


def global_counts(mini: DataProto) -> tuple[float, float]:
    """(response tokens, rows) of this mini-batch summed over all data-parallel ranks."""
    from .engine import sum_over_dp

    tokens, rows = sum_over_dp([float(mini.batch["response_mask"].sum()), float(len(mini))])
    return tokens, rows
