"""The shape of a decoder-only model (what the memory plan needs), from a config.json or a built-in table.

No model hub: a shape comes from a local HuggingFace folder (its config.json), a config.json file, or the
built-in table below (the models the presets in configs/parallel/ were sized for). The table holds the
numbers of the published config.json files; `params` of each matches the published parameter count
(tests/unit/test_plan_memory.py checks it).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class ModelShape:
    """A Llama/Qwen-style decoder: RMSNorm, rotary attention with grouped KV heads, SwiGLU MLP."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    gated_mlp: bool = True  # SwiGLU: gate and up projections (3 matrices); plain MLP: 2
    source: str = "built-in table"
    # Mixture of experts (every layer an MoE layer): 0 experts is a dense model.
    num_experts: int = 0
    moe_topk: int = 0  # experts per token
    moe_ffn_hidden_size: int = 0  # one routed expert's intermediate size
    shared_expert_ffn_hidden_size: int = 0  # qwen2_moe's always-on expert
    qk_norm: bool = False  # qwen3: RMSNorm of q and k per head (2 * head_dim weights a layer)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    # ----------------------------------------------------------------------------------------- counts
    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def layer_sharded_params(self) -> int:
        """Weights of one layer that Megatron splits over tp: QKV (+ bias), output projection, the MLP (MoE: the
        shared expert only; routed experts are `layer_expert_params`)."""
        h, q, kv = self.hidden_size, self.q_width, self.kv_width
        f = self.shared_expert_ffn_hidden_size if self.is_moe else self.ffn_hidden_size
        attn = h * (q + 2 * kv) + q * h + (q + 2 * kv if self.qkv_bias else 0)
        mlp = (3 if self.gated_mlp else 2) * h * f
        return attn + mlp

    def layer_replicated_params(self) -> int:
        """A layer's weights kept whole on every tp rank: the two RMSNorms (+ q/k norms), an MoE layer's router
        [E, h] and its shared expert's gate [1, h]."""
        n = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        if self.is_moe:
            n += self.num_experts * self.hidden_size + (self.hidden_size if self.shared_expert_ffn_hidden_size else 0)
        return n

    def layer_expert_params(self, experts: Optional[int] = None) -> int:
        """Routed experts of one layer (all of them, or `experts` of them): split over ep x etp ranks."""
        n = self.num_experts if experts is None else experts
        return n * 3 * self.hidden_size * self.moe_ffn_hidden_size

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        """Total parameters as HuggingFace counts them (a tied LM head counted once)."""
        per_layer = self.layer_sharded_params() + self.layer_replicated_params() + self.layer_expert_params()
        head = 0 if self.tie_word_embeddings else self.embedding_params()
        return self.num_layers * per_layer + self.embedding_params() + head + self.hidden_size

    @property
    def expert_params(self) -> int:
        """Routed experts of all layers (0 for a dense model)."""
        return self.num_layers * self.layer_expert_params()

    @property
    def active_params(self) -> int:
        """Parameters one token runs through: all but the routed experts it is not sent to."""
        return self.params - self.num_layers * self.layer_expert_params(max(self.num_experts - self.moe_topk, 0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "source": self.source, "num_layers": self.num_layers, "hidden_size": self.hidden_size,
            "ffn_hidden_size": self.ffn_hidden_size, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim, "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings, "params": self.params,
            "num_experts": self.num_experts, "moe_topk": self.moe_topk, "moe_ffn_hidden_size": self.moe_ffn_hidden_size,
            "shared_expert_ffn_hidden_size": self.shared_expert_ffn_hidden_size, "expert_params": self.expert_params,
            "active_params": self.active_params,
        }


class ModelShapeError(ValueError):
    """The model's shape could not be found or read; the message says what to pass instead."""


# ------------------------------------------------------------------------------------------------ table
def _qwen2(layers: int, hidden: int, ffn: int, heads: int, kv: int, vocab: int, tied: bool) -> dict[str, Any]:
    return dict(model_type="qwen2", num_hidden_layers=layers, hidden_size=hidden, intermediate_size=ffn,
                num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tied)


def _qwen3_moe(layers: int, hidden: int, ffn: int, expert_ffn: int, experts: int, topk: int, heads: int, kv: int,
               vocab: int) -> dict[str, Any]:
    return dict(model_type="qwen3_moe", num_hidden_layers=layers, hidden_size=hidden, intermediate_size=ffn,
                moe_intermediate_size=expert_ffn, num_experts=experts, num_experts_per_tok=topk, head_dim=128,
                num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=False)


def _llama(layers: int, hidden: int, ffn: int, heads: int, kv: int, vocab: int) -> dict[str, Any]:
    return dict(model_type="llama", num_hidden_layers=layers, hidden_size=hidden, intermediate_size=ffn,
                num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=False)


# Published config.json values (layers, hidden, intermediate, heads, kv heads, vocab[, tied]).
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen2.5-0.5B": _qwen2(24, 896, 4864, 14, 2, 151936, True),
    "Qwen2.5-1.5B": _qwen2(28, 1536, 8960, 12, 2, 151936, True),
    "Qwen2.5-3B": _qwen2(36, 2048, 11008, 16, 2, 151936, True),
    "Qwen2.5-7B": _qwen2(28, 3584, 18944, 28, 4, 152064, False),
    "Qwen2.5-14B": _qwen2(48, 5120, 13824, 40, 8, 152064, False),
    "Qwen2.5-32B": _qwen2(64, 5120, 27648, 40, 8, 152064, False),
    "Qwen2.5-72B": _qwen2(80, 8192, 29568, 64, 8, 152064, False),
    "Llama-3-8B": _llama(32, 4096, 14336, 32, 8, 128256),
    "Llama-3-70B": _llama(80, 8192, 28672, 64, 8, 128256),
    "deepseek-llm-7b": _llama(30, 4096, 11008, 32, 32, 102400),  # verl's default model path
    # (layers, hidden, intermediate (unused: every layer is MoE), expert intermediate, experts, top-k, heads,
    # kv heads, vocab)
    "Qwen3-30B-A3B": _qwen3_moe(48, 2048, 6144, 768, 128, 8, 32, 4, 151936),
    "Qwen3-235B-A22B": _qwen3_moe(94, 4096, 12288, 1536, 128, 8, 64, 4, 151936),
}
# Other spellings of the same shapes (Llama 3.1/3.3 keep the Llama 3 shape; Qwen2 shares Qwen2.5's).
_ALIASES = {
    "llama-3.1-8b": "Llama-3-8B", "llama-3.1-70b": "Llama-3-70B", "llama-3.3-70b": "Llama-3-70B",
    "qwen2-7b": "Qwen2.5-7B", "qwen2-72b": "Qwen2.5-72B", "qwen2-1.5b": "Qwen2.5-1.5B", "qwen2-0.5b": "Qwen2.5-0.5B",
}
_SUFFIXES = re.compile(r"(-(instruct|chat|base|hf|it))+$")


def canonical_name(name_or_path: str) -> Optional[str]:
    """The table entry a model name or path refers to (`Qwen/Qwen2.5-7B-Instruct` -> `Qwen2.5-7B`), or None."""
    base = os.path.basename(os.path.normpath(os.path.expanduser(str(name_or_path)))).lower()
    base = _SUFFIXES.sub("", base)
    base = base[len("meta-"):] if base.startswith("meta-") else base
    lowered = {k.lower(): k for k in KNOWN_CONFIGS}
    return lowered.get(base) or _ALIASES.get(base)


# ------------------------------------------------------------------------------------------------ loading
def from_hf_config(config: Mapping[str, Any], name: str = "model", source: str = "config.json") -> ModelShape:
    """A shape from the fields of a HuggingFace config.json (Llama, Qwen2/3, Mistral and kin)."""
    c = dict(config.get("text_config") or config)  # multimodal configs nest the language model's
    try:
        hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
        layers, ffn, vocab = int(c["num_hidden_layers"]), int(c["intermediate_size"]), int(c["vocab_size"])
    except KeyError as e:
        raise ModelShapeError(f"{source}: no {e.args[0]} (not a decoder-only model config?)") from None
    model_type = str(c.get("model_type", ""))
    qkv_bias = bool(c.get("attention_bias", model_type == "qwen2")) or bool(c.get("qkv_bias", model_type == "qwen2_moe"))
    act = str(c.get("hidden_act", "silu"))
    experts = int(c.get("num_experts") or c.get("num_local_experts") or c.get("n_routed_experts") or 0)
    return ModelShape(
        name=name, num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
        num_key_value_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or hidden // heads), vocab_size=vocab,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)), qkv_bias=qkv_bias,
        gated_mlp=act in ("silu", "swish", "gelu_pytorch_tanh") or "glu" in act, source=source,
        num_experts=experts, moe_topk=int(c.get("num_experts_per_tok") or 0) if experts else 0,
        moe_ffn_hidden_size=int(c.get("moe_intermediate_size") or ffn) if experts else 0,
        shared_expert_ffn_hidden_size=int(c.get("shared_expert_intermediate_size") or 0) if experts else 0,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
    )


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelShapeError(f"cannot read {path}: {e}") from None


def resolve(name_or_path: str, override_config: Optional[Mapping[str, Any]] = None) -> ModelShape:
    """A shape from a local model folder, a config.json path, or a built-in name (in that order).

    `override_config` (actor_rollout_ref.model.override_config) is applied on top, as the model builder does.
    """
    path = os.path.expanduser(str(name_or_path))
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        config, source = _read_json(os.path.join(path, "config.json")), os.path.join(path, "config.json")
    elif os.path.isfile(path):
        config, source = _read_json(path), path
    elif canonical_name(path):
        key = canonical_name(path)
        config, source = KNOWN_CONFIGS[key], "built-in table"
        name_or_path = key
    else:
        known = ", ".join(KNOWN_CONFIGS)
        raise ModelShapeError(
            f"no model shape for {name_or_path!r}: not a local folder with config.json and not a built-in name; "
            f"pass --model-config PATH (a model folder or its config.json) or one of: {known}")
    config = {**config, **dict(override_config or {})}
    name = os.path.basename(os.path.normpath(str(name_or_path)))
    return from_hf_config(config, name=name, source=source)


def with_overrides(shape: ModelShape, **changes: Any) -> ModelShape:
    """A modified copy (tests, what-if plans)."""
    return replace(shape, **changes)
