"""ModelArch + layout -> megatron-core GPTModel chunks (this rank's pipeline stage(s)).

One builder for the four roles: the actor and the reference are language models; the critic and the
reward model are the same network with the vocab projection replaced by a scalar head (see ValueHead).
Layers come from the local spec (pure torch + megatron's tensor-parallel linears, torch SDPA as the
core attention: attention.py) or from the transformer-engine spec (fused norm+linear, TE attention,
FP8), as `*.megatron.transformer_impl` says; by default TE where transformer_engine imports on a GPU.
fp32 on CPU, bf16 (or the layout's dtype) on GPU through megatron's Float16Module.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
from typing import Any, Optional

import torch
import torch.nn.functional as F

from hybridrl.config.layout import ParallelLayout

from . import attention, compat, moe
from .hf_config import ModelArch, check_expert_layout, check_layout

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


IMPLS = ("transformer_engine", "local")


def use_transformer_engine() -> bool:
    """Whether TE layers can run here: a GPU and an importable transformer_engine (never required)."""
    return compat.cuda_in_use() and importlib.util.find_spec("transformer_engine") is not None


def resolve_impl(requested: Optional[str]) -> str:
    """`*.megatron.transformer_impl` -> the layer spec to build: null picks TE where it can run, else local."""
    if requested is None:
        return "transformer_engine" if use_transformer_engine() else "local"
    if requested not in IMPLS:
        raise ValueError(f"*.megatron.transformer_impl={requested!r} is not one of {', '.join(IMPLS)} (or null)")
    if requested == "transformer_engine" and not use_transformer_engine():
        where = "transformer_engine does not import" if compat.cuda_in_use() else "this process trains on the CPU"
        raise ValueError(f"*.megatron.transformer_impl=transformer_engine but {where}; install transformer-engine on "
                         "the GPU host or set *.megatron.transformer_impl=local")
    return requested


def model_dtype(layout: ParallelLayout) -> torch.dtype:
    return DTYPES[layout.dtype] if compat.cuda_in_use() else torch.float32


def transformer_config(arch: ModelArch, layout: ParallelLayout, *, recompute: bool = False,
                       overrides: Optional[dict[str, Any]] = None, impl: str = "local") -> Any:
    """megatron TransformerConfig equivalent to the HF model (dropout 0, no fused kernels needing apex).
    `impl` is a resolved transformer_impl; FP8 (override fp8 / fp8_recipe) and context parallelism need TE."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    check_layout(arch, layout.tp, layout.pp, layout.vpp)
    check_expert_layout(arch, layout.tp, layout.ep, layout.etp)
    dtype = model_dtype(layout)
    te = impl == "transformer_engine"
    if not te and (overrides or {}).get("fp8"):
        raise ValueError("override_transformer_config.fp8 needs transformer-engine layers: set "
                         "*.megatron.transformer_impl=transformer_engine on a GPU, or remove fp8")
    if not te and layout.cp > 1:
        raise ValueError(f"context_parallel_size={layout.cp} needs transformer-engine attention: set "
                         "*.megatron.transformer_impl=transformer_engine on a GPU, or context_parallel_size=1")
    # MoE layers train with tp > 1 only under sequence parallelism (megatron's rule); the local spec then
    # takes sequence-parallel torch norms (sequence_parallel_norm), which dense models do not use yet.
    sequence_parallel = layout.sequence_parallel and layout.tp > 1 and (te or arch.is_moe)
    if arch.is_moe and layout.tp > 1 and not layout.sequence_parallel:
        raise ValueError(f"{arch.source}: a mixture-of-experts model with tensor_model_parallel_size={layout.tp} needs "
                         "sequence parallelism (megatron-core's rule for MoE training); set "
                         "*.megatron.sequence_parallel=true")
    if layout.sequence_parallel and layout.tp > 1 and not sequence_parallel:
        log.warning("sequence_parallel=true needs transformer-engine norms; running without it (local layer spec)")
    kwargs: dict[str, Any] = dict(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        layernorm_epsilon=arch.norm_eps,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        window_size=(arch.sliding_window - 1, 0) if arch.sliding_window else None,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        context_parallel_size=layout.cp,
        sequence_parallel=sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=not compat.cuda_in_use(),
        variable_seq_lengths=True,  # micro-batches are trimmed to their longest sequence
        # Interleaved schedule: megatron's unbatched p2p pairs messages right with two stages (compat.py).
        batch_p2p_comm=not layout.vpp,
        moe_token_dispatcher_type="alltoall",  # no MoE; megatron rejects the default with variable lengths
        gradient_accumulation_fusion=False,  # needs apex/TE kernels
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        # TE's fused RoPE: megatron's unfused THD RoPE loops over the packed sequences in Python in every layer
        # (1.25x update tokens/s on 1.5B packed, megatron_speed.md)
        apply_rope_fusion=te,
        persist_layer_norm=False,
        attention_softmax_in_fp32=True,
        recompute_granularity="full" if recompute else None,
        recompute_method="uniform" if recompute else None,
        recompute_num_layers=1 if recompute else None,
    )
    kwargs.update(moe.transformer_kwargs(arch, layout, te))
    kwargs.update(overrides or {})
    if kwargs.get("moe_grouped_gemm") and not te:
        raise ValueError("override_transformer_config.moe_grouped_gemm=true needs transformer-engine layers (TE's "
                         "GroupedLinear; megatron's legacy GroupedMLP is not supported): set "
                         "*.megatron.transformer_impl=transformer_engine on a GPU, or remove moe_grouped_gemm")
    if "attention_backend" in kwargs:  # YAML gives a name; megatron wants its enum
        kwargs["attention_backend"] = attention.to_megatron(kwargs["attention_backend"])
    return TransformerConfig(**kwargs)


def layer_spec(arch: ModelArch, config: Any, impl: str = "local") -> Any:
    """transformer-engine layers, or megatron's local layers with attention.py's core attention (torch SDPA
    unless config.attention_backend asks for megatron's unfused kernel; packed sequences either way)."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if impl == "transformer_engine":  # MoE: TE's grouped GEMM experts (weight0..N) unless moe_grouped_gemm=false
        return specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=arch.qk_norm, num_experts=arch.num_experts,
                                                                moe_grouped_gemm=bool(config.moe_grouped_gemm))
    spec = specs.get_gpt_layer_local_spec(qk_layernorm=arch.qk_norm, normalization="RMSNorm",
                                          num_experts=arch.num_experts)
    spec.submodules.self_attention.submodules.core_attention = attention.sdpa_attention_class()
    if config.sequence_parallel:
        sequence_parallel_norms(spec)
    return spec


class _TorchRMSNorm:
    """megatron's local RMSNorm (torch.nn.RMSNorm, as WrappedTorchNorm builds it) without its assertion that
    sequence parallelism is off. `sequence_parallel` marks the weight whose input is a sequence shard, so
    finalize_model_grads all-reduces its gradient over tp; q/k norms see whole sequences and are not marked."""

    sequence_parallel = True

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> torch.nn.Module:
        norm = torch.nn.RMSNorm(normalized_shape=hidden_size, eps=eps)
        norm.weight.sequence_parallel = cls.sequence_parallel and config.sequence_parallel
        return norm


class _TorchQKNorm(_TorchRMSNorm):
    sequence_parallel = False


def sequence_parallel_norms(spec: Any) -> None:
    """The local layer spec with norms that run under sequence parallelism (the final norm: build_model)."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    sub = spec.submodules
    sub.input_layernorm = sub.pre_mlp_layernorm = _TorchRMSNorm
    attn = sub.self_attention.submodules
    for name in ("q_layernorm", "k_layernorm"):
        if getattr(attn, name, None) is WrappedTorchNorm:
            setattr(attn, name, _TorchQKNorm)


class ValueHead(torch.nn.Module):
    """Critic head: hidden [s, b, h] -> values [s, b, 1].

    Why a plain replicated linear and not megatron's ColumnParallelLinear: one output cannot be split
    across tp ranks, and with sequence parallelism off every tp rank sees the same hidden states, so
    replicas get identical gradients without extra communication. It takes HF's `score` name on export:
    no bias like *ForSequenceClassification's, or with `bias` (zeros until loaded) like *ForTokenClassification's
    (hf_config.score_head_has_bias). Initialised from a fixed seed so every rank starts with the same weights
    when the HF folder has no `score.weight`.
    """

    def __init__(self, hidden_size: int, dtype: torch.dtype, init_std: float, seed: int,
                 sequence_parallel: bool = False, bias: bool = False) -> None:
        super().__init__()
        self.sequence_parallel = sequence_parallel
        gen = torch.Generator().manual_seed(seed)
        weight = torch.randn(1, hidden_size, generator=gen, dtype=torch.float32) * init_std
        self.weight = torch.nn.Parameter(weight.to(device=compat.device(), dtype=dtype))
        # a reward model from *ForTokenClassification has `score.bias` (its *ForSequenceClassification twin has none)
        self.bias = torch.nn.Parameter(torch.zeros(1, device=compat.device(), dtype=dtype)) if bias else None

    def forward(self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None):
        # Same call signature and (output, bias) return as the vocab projection it replaces.
        if self.sequence_parallel:  # hidden is this rank's sequence shard: values are needed everywhere
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden)
        return F.linear(hidden, self.weight, self.bias), None


def build_model(arch: ModelArch, layout: ParallelLayout, *, value_head: bool = False, seed: int = 42,
                init_std: float = 0.02, recompute: bool = False, overrides: Optional[dict[str, Any]] = None,
                transformer_impl: Optional[str] = None, head_bias: bool = False) -> list[torch.nn.Module]:
    """This rank's model chunks (one per virtual pipeline stage), on the training device and dtype.

    GPU bf16/fp16 chunks are wrapped in megatron's Float16Module (outputs come back in fp32).
    megatron's parallel state must be initialised (parallel.init_megatron) with the same layout.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.module import Float16Module

    impl = resolve_impl(transformer_impl)
    config = transformer_config(arch, layout, recompute=recompute, overrides=overrides, impl=impl)
    spec = layer_spec(arch, config, impl)
    chunks = []
    for vp_stage in range(layout.vpp or 1):
        stage = vp_stage if layout.vpp else None
        pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage)
        post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage)
        model = GPTModel(
            config=config,
            transformer_layer_spec=_block_spec(spec, config, stage, impl),
            vocab_size=arch.padded_vocab(layout.tp),
            max_sequence_length=arch.max_position_embeddings,
            pre_process=pre,
            post_process=post,
            share_embeddings_and_output_weights=arch.tie_embeddings and not value_head,
            position_embedding_type="rope",
            rotary_percent=1.0,
            rotary_base=int(arch.rope.theta) if float(arch.rope.theta).is_integer() else arch.rope.theta,
            seq_len_interpolation_factor=arch.rope.factor if arch.rope.kind == "linear" else None,
            vp_stage=stage,
        )
        _apply_llama3_rope(model, arch)
        moe.prepare(model)
        if value_head and post:
            model.output_layer = ValueHead(arch.hidden_size, config.params_dtype, init_std, seed,
                                           config.sequence_parallel, bias=head_bias)
        model.to(compat.device())
        if config.bf16 or config.fp16:
            model = Float16Module(config, model)
        chunks.append(model)
    return chunks


def _block_spec(spec: Any, config: Any, vp_stage: Optional[int], impl: str) -> Any:
    """The layer spec, or under sequence parallelism with local norms a block spec whose final norm is one too."""
    if not (config.sequence_parallel and impl == "local"):
        return spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config, vp_stage=vp_stage),
                                      layer_norm=_TorchRMSNorm)


def _apply_llama3_rope(model: Any, arch: ModelArch) -> None:
    """llama3 frequency scaling with the HF config's own factors (megatron hard-codes 1/4/8192)."""
    rope = arch.rope
    if rope.kind != "llama3":
        return
    emb = model.rotary_pos_emb
    emb.inv_freq = emb._apply_scaling(emb.inv_freq, factor=rope.factor, low_freq_factor=rope.low_freq_factor,
                                      high_freq_factor=rope.high_freq_factor,
                                      original_max_position_embeddings=rope.original_max_position_embeddings)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(module, "module") and not hasattr(module, "decoder"):
        module = module.module
    return module


def wrap_ddp(chunks: list[torch.nn.Module], use_distributed_optimizer: bool,
             overrides: Optional[dict[str, Any]] = None) -> list[torch.nn.Module]:
    """megatron DDP around each chunk (grad buffers in fp32 unless overrides say grad_reduce_in_fp32=False;
    bucketing only for the first chunk, as megatron does)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    # override_ddp_config may set any of these (grad_reduce_in_fp32=false halves the grad buffer; the plan
    # counts it that way), so they are defaults, not keywords an override would collide with
    overrides = dict(overrides or {})
    if overrides.pop("use_distributed_optimizer", use_distributed_optimizer) != use_distributed_optimizer:
        raise ValueError("override_ddp_config.use_distributed_optimizer differs from the optimizer's: set "
                         "megatron.use_distributed_optimizer instead")
    kwargs = {"grad_reduce_in_fp32": True, "overlap_grad_reduce": False, **overrides,
              "use_distributed_optimizer": use_distributed_optimizer}
    ddp_config = DistributedDataParallelConfig(**kwargs)
    config = unwrap(chunks[0]).config
    return [DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk,
                                    disable_bucketing=i > 0) for i, chunk in enumerate(chunks)]


def describe(arch: ModelArch, layout: ParallelLayout) -> str:
    fields = {f.name: getattr(arch, f.name) for f in dataclasses.fields(arch) if f.name != "source"}
    return f"{arch.source}: {fields} on tp={layout.tp} pp={layout.pp} vpp={layout.vpp} dp={layout.dp}"
