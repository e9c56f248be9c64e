"""MegatronCritic: the actor's network with a scalar value head (builder.ValueHead) and PPO's clipped
value loss. Values are read at the same positions as the actor's log-probs (the output at the token
before each response token), as verl does; the loss is weighted for exact accumulation (actor.py).
A critic from a HF *ForTokenClassification folder (verl's critic class) keeps its head's `score.bias`, so its
values are that model's logits; from a *ForSequenceClassification or causal LM folder the head has no bias."""
from __future__ import annotations

from typing import Optional

import torch

from hybridrl.adapters.base import CriticModel
from hybridrl.algos import masked_sum, value_loss
from hybridrl.config.layout import BatchPlan, ParallelLayout
from hybridrl.config.schema.critic import CriticConfig
from hybridrl.protocol import DataProto

from .actor import global_batch
from .forward import MicroBatch, gather_response, sum_over_cp
from .hf_config import load_hf_config, score_head_has_bias
from .role import MegatronRole

METRICS = ["critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean"]


def response_values(out: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """Value-head output [b, L, 1] -> values [b, R] (0 outside the attention mask)."""
    values = gather_response(out, mb).squeeze(-1).float()
    return sum_over_cp(torch.where(mb.resp_valid, values, torch.zeros_like(values)), mb)


class MegatronCritic(MegatronRole, CriticModel):
    role = "critic"

    def __init__(self, critic: CriticConfig, layout: ParallelLayout, batch: BatchPlan, *,
                 total_training_steps: Optional[int] = None) -> None:
        self.cfg = critic
        self.batch = batch
        super().__init__(critic.model.path, critic.megatron, layout, optim=critic.optim, value_head=True,
                         override_config=critic.model.override_config,
                         recompute=critic.model.enable_gradient_checkpointing, load_weight=critic.load_weight,
                         total_training_steps=total_training_steps, remove_padding=critic.model.use_remove_padding,
                         head_bias=score_head_has_bias(load_hf_config(critic.model.path)))

    def compute_values(self, data: DataProto) -> DataProto:
        plan = self.batch
        mbs = self._micro_batches(data, [], plan.forward_micro_batch_per_gpu,
                                  plan.forward_max_token_len_per_gpu if plan.use_dynamic_bsz else None)

        def loss_fn(out: torch.Tensor, mb: MicroBatch):
            values = response_values(out, mb)
            return values.new_zeros(()), {"values": values}

        results = self.engine.run(mbs, loss_fn, forward_only=True)
        values = self._gather_rows(results, mbs, "values", tuple(data.batch["responses"].shape))
        if "response_mask" in data.batch:
            values = values * data.batch["response_mask"].to(values.dtype)
        return DataProto.from_dict({"values": values})

    def update_critic(self, data: DataProto) -> dict[str, float]:
        return self._update(data, ["response_mask", "values", "returns"], self._loss_fn, METRICS)

    def _loss_fn(self, mini: DataProto):
        agg = self.cfg.loss_agg_mode
        batch = global_batch(mini, self.cfg.loss_scale_factor)
        tokens, dp = max(batch.batch_num_tokens, 1.0), batch.dp_size
        clip = self.cfg.cliprange_value
        host_mask = mini.batch["response_mask"]  # a micro-batch's token count without a device sync

        def loss_fn(out: torch.Tensor, mb: MicroBatch):
            x = mb.extras
            mask = x["response_mask"]
            vpreds = response_values(out, mb)
            vf = value_loss(vpreds, x["returns"], x["values"], mask, clip, agg, **batch)
            # vf_loss is the micro-batch's share of the mini-batch loss times dp (agg_loss); the engine sums over dp
            metrics = {"critic/vf_loss": vf.vf_loss.detach() / dp,
                       "critic/vf_clipfrac": vf.vf_clipfrac * float(host_mask[mb.rows].sum()) / tokens,
                       "critic/vpred_mean": masked_sum(vpreds.detach(), mask) / tokens}
            return vf.vf_loss / dp, metrics

        return loss_fn
