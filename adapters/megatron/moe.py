"""Mixture-of-experts pieces of the megatron backend: the router settings that reproduce the HF models,
the router losses under our loss-scaling contract, and their metrics.

Router semantics (checked against transformers' modeling files and megatron-core 0.16.1's
topk_routing_with_score_function):
  qwen2_moe / qwen3_moe, norm_topk_prob=false: p = softmax(logits) over all experts, the top-k p weight
      the experts as they are            -> megatron moe_router_pre_softmax=True
  qwen*, norm_topk_prob=true, and mixtral: top-k of softmax(logits), renormalised to sum 1, which is the
      softmax of the top-k logits        -> moe_router_pre_softmax=False (megatron's top-k then softmax)
  qwen2_moe's shared expert: a dense MLP whose output is scaled by sigmoid(x . w_gate) -> megatron's
      SharedExpertMLP with moe_shared_expert_gate=True (the same sigmoid gate, weight [1, h]).

Router losses (moe_aux_loss_coeff: load balancing, moe_z_loss_coeff: z-loss) follow our loss contract
(engine.py): micro-batch mb of an optimizer step whose micro-batches hold N valid (non-padding) tokens in
all, on all dp ranks, adds  (n_mb / N) * coeff * loss_mb,  the token weighting of the policy loss, so the
update is the same in every layout for the same micro-batches (the router losses are products of batch
means: they change when other tokens share a micro-batch). megatron computes, per rank, the load-balancing
loss as this rank's share of the micro-batch's (sequence-parallel ranks sum to it) and the z-loss as
coeff / tp * mean over this rank's n_r tokens. So the routers attach them unscaled
(calculate_per_token_loss=False on each router: its token scaling assumes a division we never do) and
`RouterLossWeights` sets the coefficients before each micro-batch's forward: c * n_mb / N for load
balancing, c * tp * n_r / N for the z-loss.
"""
from __future__ import annotations

from typing import Any

import torch

from hybridrl.config.layout import ParallelLayout

from .hf_config import ModelArch

METRICS = {"load_balancing_loss": "moe_load_balancing_loss", "z_loss": "moe_z_loss"}


def transformer_kwargs(arch: ModelArch, layout: ParallelLayout, te: bool = False) -> dict[str, Any]:
    """TransformerConfig fields of an MoE model ({} for a dense one); override_transformer_config wins. `te`: the
    transformer-engine spec, whose experts run as one grouped GEMM a layer (TE's GroupedLinear) by default; the local
    spec runs them one after another (SequentialMLP)."""
    if not arch.is_moe:
        return {}
    shared = arch.shared_expert_ffn_hidden_size
    return dict(
        num_moe_experts=arch.num_experts,
        moe_router_topk=arch.moe_topk,
        moe_ffn_hidden_size=arch.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=shared,
        moe_shared_expert_gate=bool(shared),
        moe_router_pre_softmax=bool(arch.moe_router_pre_softmax),
        moe_router_score_function="softmax",
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=float(arch.router_aux_loss_coef or 0.0),
        # alltoall: the dispatcher that takes a different number of tokens on each rank (micro-batches are
        # trimmed to their own longest row); megatron rejects allgather with variable sequence lengths.
        moe_token_dispatcher_type="alltoall",
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.expert_tp,
        moe_grouped_gemm=te,
    )


def is_moe(config: Any) -> bool:
    return getattr(config, "num_moe_experts", None) is not None


def prepare(model: torch.nn.Module) -> None:
    """After build: routers attach their losses unscaled (RouterLossWeights weighs them, module docstring),
    and routed experts are expert-parallel parameters at every ep, ep=1 included. megatron marks them only
    for ep > 1, and its optimizer then keeps their state in a second (chained) optimizer: the same
    checkpoint would not load into another ep. Marked at ep=1 too, their gradients are reduced over the
    expert data-parallel group, which is then the data-parallel group: the same sum."""
    from megatron.core.transformer.moe.router import Router

    for module in model.modules():
        if isinstance(module, Router):
            module.calculate_per_token_loss = False
    for name, param in model.named_parameters():
        if ".mlp.experts." in name:
            param.allreduce = False


class RouterLossWeights:
    """The router-loss coefficients of each micro-batch of one optimizer step (module docstring).

    `tokens`: valid tokens of the step's micro-batches on all dp ranks. Use as a context manager around
    the step; `weigh(mb)` before each micro-batch's forward; the configured coefficients come back after.
    """

    def __init__(self, config: Any, tokens: float) -> None:
        from megatron.core import parallel_state as ps

        self.config = config
        self.base = config.moe_aux_loss_coeff, config.moe_z_loss_coeff
        self.tokens = max(float(tokens), 1.0)
        self.tp = ps.get_tensor_model_parallel_world_size()
        self.shard = ps.get_tensor_model_parallel_rank() if config.sequence_parallel else None

    def weigh(self, mb: Any) -> None:
        valid = ~mb.padding_mask  # [b, L]
        aux, z = self.base
        self.config.moe_aux_loss_coeff = _scaled(aux, float(valid.sum()) / self.tokens)
        if z is not None:
            if self.shard is not None:  # sequence parallel: this rank routes positions [r L/tp, (r+1) L/tp)
                size = valid.shape[1] // self.tp
                valid = valid[:, self.shard * size:(self.shard + 1) * size]
            self.config.moe_z_loss_coeff = z * self.tp * float(valid.sum()) / self.tokens

    def __enter__(self) -> "RouterLossWeights":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.config.moe_aux_loss_coeff, self.config.moe_z_loss_coeff = self.base


def _scaled(coeff: Any, scale: float) -> Any:
    return [c * scale for c in coeff] if isinstance(coeff, list) else coeff * scale


def clear_router_losses() -> None:
    from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker

    clear_aux_losses_tracker()


def router_loss_values(config: Any, num_micro_batches: int) -> dict[str, float]:
    """Mean router losses of the last optimizer step over MoE layers, micro-batches and dp ranks (coefficient
    not applied), from megatron's tracker; the same on every rank. Clears the tracker."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    tracker = get_moe_layer_wise_logging_tracker()
    out = {}
    for name, key in METRICS.items():
        if name not in tracker:
            continue
        values = tracker[name]["values"].detach().clone()
        # Each stage holds its own layers. The load-balancing loss of a tp rank is its share (megatron counts
        # the tokens over the tp group, its reduce_group); the z-loss is a per-rank mean: averaged over tp.
        torch.distributed.all_reduce(values, group=ps.get_pipeline_model_parallel_group())
        group = tracker[name].get("reduce_group")
        ranks = 1
        if group is None:
            group, ranks = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_world_size()
        torch.distributed.all_reduce(values, group=group)
        torch.distributed.all_reduce(values, group=ps.get_data_parallel_group())
        ranks *= ps.get_data_parallel_world_size()
        out[key] = float(values.sum()) / (config.num_layers * max(num_micro_batches, 1) * ranks)
        tracker[name]["values"].zero_()
    return out
