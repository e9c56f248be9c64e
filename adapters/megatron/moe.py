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

Router losses: megatron attaches the load-balancing loss (moe_aux_loss_coeff) and the z-loss
(moe_z_loss_coeff) to the router's activations. With calculate_per_token_loss (engine.py) it multiplies each
micro-batch's loss by its token count and expects finalize_model_grads to divide every gradient by the
mini-batch's token count; our finalize does not divide (the policy loss is already weighted), so
`router_loss_scale` divides the two coefficients by that count for the duration of one optimizer step:
the router losses then weigh in as megatron's token-weighted mean over micro-batches and dp ranks.
Both losses depend on which tokens share a micro-batch (they are products of batch means), so they are
the same across layouts only for the same micro-batches. Padding tokens are excluded (padding_mask).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from hybridrl.config.validate import ParallelLayout

from .hf_config import ModelArch

METRICS = {"load_balancing_loss": "moe_load_balancing_loss", "z_loss": "moe_z_loss"}


def transformer_kwargs(arch: ModelArch, layout: ParallelLayout) -> dict[str, Any]:
    """TransformerConfig fields of an MoE model ({} for a dense one); override_transformer_config wins."""
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
    )


def is_moe(config: Any) -> bool:
    return getattr(config, "num_moe_experts", None) is not None


@contextlib.contextmanager
def router_loss_scale(config: Any, tokens: float) -> Iterator[None]:
    """Divide the router-loss coefficients by the optimizer step's token count (see the module docstring)."""
    if not is_moe(config):
        yield
        return
    saved = config.moe_aux_loss_coeff, config.moe_z_loss_coeff
    scale = 1.0 / max(tokens, 1.0)
    config.moe_aux_loss_coeff = _scaled(saved[0], scale)
    config.moe_z_loss_coeff = None if saved[1] is None else saved[1] * scale
    try:
        yield
    finally:
        config.moe_aux_loss_coeff, config.moe_z_loss_coeff = saved


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
