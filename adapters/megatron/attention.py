"""Core attention for the local (no transformer-engine) layer spec: torch's scaled_dot_product_attention.

Why not megatron's own DotProductAttention, which the local spec uses: it materialises the [b, heads, s, s]
scores with a bf16 baddbmm, so every score is rounded to bf16 before the softmax, and the scores and
probabilities take O(s^2) memory per layer. torch's SDPA runs a flash / memory-efficient kernel on the GPU
(fp32 accumulation of q.k and of the softmax, O(s) memory) and a fused kernel on the CPU. Measured on one
H200 (benchmarks/results/train_bench.md, gap_bench.md): log-prob forward 1.84x, PPO update 1.10x, peak memory
0.76x, and the actor-vs-vLLM log-prob gap slightly lower (0.0226 -> 0.0222; it is bf16 rounding either way).

`transformer_config.attention_backend` picks the kernel, as megatron's own option does for the TE spec:
auto / flash / fused -> SDPA (this module), unfused / local -> megatron's DotProductAttention.
Anything SDPA cannot express exactly (an explicit mask, a sliding window, attention dropout, query-key
layer scaling, a softmax offset) goes to DotProductAttention as well.

Packed sequences (THD, use_remove_padding): megatron's DotProductAttention refuses them, so this class
is the local spec's core attention for every backend and runs each packed sequence on its own, through
the same kernel as a padded row (SDPA or DotProductAttention, per the rules above). That is the exact
reference of TE's varlen attention: a token attends causally within its own sequence, never across.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from hybridrl.config.attention_backends import SDPA_BACKENDS, backend_name


def uses_sdpa(config: Any) -> bool:
    return backend_name(getattr(config, "attention_backend", None)) in SDPA_BACKENDS


def sdpa_attention_class() -> type:
    """SdpaAttention, defined on first use (megatron-core is imported lazily everywhere in the adapter)."""
    global _SDPA
    if _SDPA is None:
        _SDPA = _define()
    return _SDPA


_SDPA: Optional[type] = None


def _define() -> type:
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    class SdpaAttention(DotProductAttention):
        """DotProductAttention's interface and parameters; the causal case runs on torch's SDPA, packed
        sequences one by one."""

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            if packed_seq_params is not None:
                return self._per_sequence(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                          packed_seq_params)
            mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
            exact = (uses_sdpa(self.config) and attention_mask is None and attention_bias is None
                     and mask_type == AttnMaskType.causal and query.shape[0] == key.shape[0]
                     and self.softmax_offset is None and not self.config.apply_query_key_layer_scaling
                     and self.scale_mask_softmax.window_size is None
                     and not (self.training and self.attention_dropout.p > 0))
            if not exact:
                return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                       attention_bias=attention_bias, packed_seq_params=packed_seq_params)
            # [s, b, heads, d] -> [b, heads, s, d]; kv groups repeated to the query heads (GQA) so every
            # SDPA kernel applies (the fused kernels differ in which support grouped kv heads).
            groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
            if groups > 1:
                key = key.repeat_interleave(groups, dim=2)
                value = value.repeat_interleave(groups, dim=2)
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
            s, b = query.shape[0], query.shape[1]
            return out.permute(2, 0, 1, 3).reshape(s, b, self.hidden_size_per_partition)

        def _per_sequence(self, query, key, value, attention_mask, attn_mask_type, attention_bias, params):
            """THD: query [T, heads, d] (key/value [T, groups, d]) holds sequences back to back; sequence i
            has cu_seqlens_q[i+1] - cu_seqlens_q[i] tokens starting at cu_seqlens_q_padded[i] (or
            cu_seqlens_q[i]). Each runs as a batch of one; positions outside every sequence output 0."""
            if params.qkv_format != "thd" or attention_mask is not None or attention_bias is not None:
                raise NotImplementedError("packed sequences on the local layer spec: only qkv_format='thd' "
                                          "without an explicit mask or bias")
            if self.config.context_parallel_size > 1:
                raise NotImplementedError("context parallelism needs transformer-engine attention "
                                          "(*.megatron.transformer_impl=transformer_engine)")
            bounds = params.cu_seqlens_q.tolist()
            starts = (params.cu_seqlens_q if params.cu_seqlens_q_padded is None else params.cu_seqlens_q_padded).tolist()
            pieces, at = [], 0
            for i in range(len(bounds) - 1):
                n, start = bounds[i + 1] - bounds[i], starts[i]
                if n == 0:
                    continue
                if start > at:
                    pieces.append(query.new_zeros(start - at, self.hidden_size_per_partition))
                one = [t[start:start + n].unsqueeze(1) for t in (query, key, value)]  # [n, 1, heads, d]
                pieces.append(self.forward(*one, None, attn_mask_type=attn_mask_type)[:, 0])
                at = start + n
            if query.shape[0] > at:
                pieces.append(query.new_zeros(query.shape[0] - at, self.hidden_size_per_partition))
            return torch.cat(pieces)

    return SdpaAttention


def to_megatron(value: Any) -> Any:
    """A config string ('flash', ...) as megatron's AttnBackend enum (TransformerConfig wants the enum)."""
    from megatron.core.transformer.enums import AttnBackend

    return value if isinstance(value, AttnBackend) else AttnBackend[backend_name(value)]

