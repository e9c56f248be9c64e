"""HuggingFace config -> ModelArch: the architecture facts the builder and the weight mapping share.

Supported families: llama, qwen2, mistral, qwen3 (decoder-only, RMSNorm, SwiGLU, RoPE, GQA) and the
mixture-of-experts families qwen3_moe, qwen2_moe (a shared expert behind a sigmoid gate) and mixtral.
Every rejection names the HF config field (config.json key) and what would make it work, so a user
with an unsupported checkpoint knows immediately why instead of getting wrong log-probs.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

SUPPORTED = ("llama", "qwen2", "mistral", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral")
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral")
# Padding the vocab to a multiple of 64 keeps the padded size the same for every power-of-two tp up to
# 64, so a checkpoint saved at tp=2 loads at tp=4 (embedding shapes are layout-independent). 64 is also
# vLLM's padding (DEFAULT_VOCAB_PADDING_SIZE), so each tp rank holds the same vocab rows in both engines
# and the weight sync copies the embedding and LM head shard to shard (hybridrl.hybrid.direct).
VOCAB_PAD_MULTIPLE = 64


class UnsupportedModelError(ValueError):
    """The HF checkpoint uses an architecture or option this backend does not implement."""


@dataclass(frozen=True)
class RopeSpec:
    theta: float
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelArch:
    model_type: str
    vocab_size: int
    hidden_size: int
    ffn_hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float
    rope: RopeSpec
    max_position_embeddings: int
    tie_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    sliding_window: Optional[int] = None
    hf_dtype: str = "float32"  # dtype of the HF weights on disk (exports are written back in it)
    source: str = field(default="<config>", compare=False)
    # Mixture of experts (None on dense models, so checkpoints saved before these fields still load).
    num_experts: Optional[int] = None
    moe_topk: Optional[int] = None  # experts per token
    moe_ffn_hidden_size: Optional[int] = None  # one routed expert's intermediate size
    shared_expert_ffn_hidden_size: Optional[int] = None  # qwen2_moe's always-on expert (None: none)
    # Router: True = softmax over all experts, then the top-k probabilities as they are (qwen with
    # norm_topk_prob=false); False = top-k logits, then softmax over those k, which equals renormalised
    # top-k probabilities (qwen with norm_topk_prob=true, mixtral).
    moe_router_pre_softmax: Optional[bool] = None
    router_aux_loss_coef: Optional[float] = None  # the HF config's load-balancing coefficient

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    def padded_vocab(self, tp: int) -> int:
        multiple = math.lcm(VOCAB_PAD_MULTIPLE, tp)
        return -(-self.vocab_size // multiple) * multiple


def load_hf_config(path_or_config: Any) -> Any:
    """A transformers PretrainedConfig from a folder (offline) or as given."""
    if not isinstance(path_or_config, (str, os.PathLike)):
        return path_or_config
    path = os.path.expanduser(str(path_or_config))
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"{path}: no config.json; expected a HuggingFace model folder")
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, local_files_only=True)


def score_head_has_bias(hf_config: Any) -> bool:
    """Whether the checkpoint's value/score head `score` has a bias: transformers' *ForTokenClassification builds
    it as nn.Linear(hidden, num_labels) (bias on), *ForSequenceClassification with bias=False; a causal LM has no
    `score` (a fresh value head without bias)."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    return any(a.endswith("ForTokenClassification") for a in archs)


def arch_from_hf(path_or_config: Any) -> ModelArch:
    """Translate (and check) a HF config; raises UnsupportedModelError naming the field."""
    cfg = load_hf_config(path_or_config)
    src = str(path_or_config) if isinstance(path_or_config, (str, os.PathLike)) else "<config>"
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED:
        raise UnsupportedModelError(f"{src}: model_type={model_type!r} is not supported; supported: "
                                    f"{', '.join(SUPPORTED)} (config.json field model_type)")
    _check(cfg, src, "hidden_act", "silu", "only SwiGLU MLPs (hidden_act=silu) are implemented")
    _check(cfg, src, "mlp_bias", False, "MLP biases are not implemented")
    if model_type in ("llama", "mistral", "qwen3", "qwen3_moe", "mixtral"):
        _check(cfg, src, "attention_bias", False, "attention projection biases are not implemented for this family")
    if getattr(cfg, "use_sliding_window", False):
        raise UnsupportedModelError(f"{src}: use_sliding_window=true ({model_type} per-layer sliding windows) is "
                                    "not supported; set it to false in config.json if your sequences fit the window")
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    if heads % kv:
        raise UnsupportedModelError(f"{src}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    window = getattr(cfg, "sliding_window", None) if model_type in ("mistral", "mixtral") else None
    return ModelArch(
        model_type=model_type,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        norm_eps=float(cfg.rms_norm_eps),
        rope=_rope(cfg, src),
        max_position_embeddings=cfg.max_position_embeddings,
        tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or (model_type == "qwen2_moe" and bool(getattr(cfg, "qkv_bias", True))),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        sliding_window=window,
        hf_dtype=_dtype_name(cfg),
        source=src,
        **(_moe_fields(cfg, src) if model_type in MOE_FAMILIES else {}),
    )


def _moe_fields(cfg: Any, src: str) -> dict[str, Any]:
    """The ModelArch fields of a mixture-of-experts config (qwen3_moe, qwen2_moe, mixtral)."""
    model_type = cfg.model_type
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    topk = cfg.num_experts_per_tok
    if getattr(cfg, "mlp_only_layers", None) or getattr(cfg, "decoder_sparse_step", 1) != 1:
        raise UnsupportedModelError(f"{src}: mlp_only_layers={getattr(cfg, 'mlp_only_layers', None)} / "
                                    f"decoder_sparse_step={getattr(cfg, 'decoder_sparse_step', 1)}: models that mix "
                                    "dense and expert layers are not supported; every layer must be an MoE layer "
                                    "(mlp_only_layers=[], decoder_sparse_step=1)")
    if getattr(cfg, "router_jitter_noise", 0.0):
        raise UnsupportedModelError(f"{src}: router_jitter_noise={cfg.router_jitter_noise} is not supported (HF scales "
                                    "the hidden states themselves, megatron only the router input); set it to 0")
    normalised = model_type == "mixtral" or bool(getattr(cfg, "norm_topk_prob", False))
    if topk == 1 and normalised:  # megatron needs pre-softmax at top-1, where renormalising gives weight 1
        raise UnsupportedModelError(f"{src}: num_experts_per_tok=1 with normalised top-k weights is not supported")
    shared = getattr(cfg, "shared_expert_intermediate_size", None) if model_type == "qwen2_moe" else None
    return dict(
        num_experts=int(experts),
        moe_topk=int(topk),
        moe_ffn_hidden_size=int(cfg.intermediate_size if model_type == "mixtral" else cfg.moe_intermediate_size),
        shared_expert_ffn_hidden_size=int(shared) if shared else None,
        moe_router_pre_softmax=not normalised,
        router_aux_loss_coef=float(getattr(cfg, "router_aux_loss_coef", 0.0) or 0.0),
    )


LAYOUT_NAMES = ("*.megatron.tensor_model_parallel_size", "*.megatron.pipeline_model_parallel_size",
                "*.megatron.virtual_pipeline_model_parallel_size")


def check_layout(arch: ModelArch, tp: int, pp: int, vpp: Optional[int], names: tuple[str, str, str] = LAYOUT_NAMES) -> None:
    """Divisibility of heads/layers by the parallel sizes; the message names the knob to turn."""
    tp_name, pp_name, vpp_name = names
    problems = []
    if arch.num_heads % tp:
        problems.append(f"num_attention_heads={arch.num_heads} is not divisible by {tp_name}={tp}")
    if arch.num_kv_heads % tp:
        problems.append(f"num_key_value_heads={arch.num_kv_heads} is not divisible by {tp_name}={tp} "
                        "(each tp rank needs whole query groups)")
    stages = pp * (vpp or 1)
    if arch.num_layers % stages:
        problems.append(f"num_hidden_layers={arch.num_layers} is not divisible by {pp_name}*{vpp_name} = "
                        f"{pp}*{vpp or 1}; choose sizes whose product divides {arch.num_layers}")
    if problems:
        raise ValueError(f"{arch.source}: the layout does not fit the model: " + "; ".join(problems))


EXPERT_LAYOUT_NAMES = ("*.megatron.expert_model_parallel_size", "*.megatron.expert_tensor_parallel_size")


def check_expert_layout(arch: ModelArch, tp: int, ep: int, etp: Optional[int],
                        names: tuple[str, str] = EXPERT_LAYOUT_NAMES) -> None:
    """Experts split evenly over ep ranks, each expert's (and the shared expert's) ffn over etp (tp) ranks."""
    ep_name, etp_name = names
    etp = etp or tp
    if not arch.is_moe:
        if ep > 1 or etp != tp:
            raise ValueError(f"{arch.source}: {ep_name}={ep} / {etp_name}={etp}: {arch.model_type} is a dense model "
                             "without experts; leave both unset (1 and null)")
        return
    problems = []
    if arch.num_experts % ep:
        problems.append(f"num_experts={arch.num_experts} is not divisible by {ep_name}={ep}")
    if arch.moe_ffn_hidden_size % etp:
        problems.append(f"the experts' intermediate size {arch.moe_ffn_hidden_size} is not divisible by {etp_name}={etp}")
    shared = arch.shared_expert_ffn_hidden_size
    if shared and shared % tp:
        problems.append(f"shared_expert_intermediate_size={shared} is not divisible by the tensor parallel size {tp}")
    if problems:
        raise ValueError(f"{arch.source}: the expert layout does not fit the model: " + "; ".join(problems))


# ------------------------------------------------------------------------------------------ helpers
def _check(cfg: Any, src: str, name: str, want: Any, why: str) -> None:
    value = getattr(cfg, name, want)
    if value != want:
        raise UnsupportedModelError(f"{src}: {name}={value!r} is not supported ({why}); expected {want!r}")


def _rope(cfg: Any, src: str) -> RopeSpec:
    # transformers 5 keeps theta and scaling in rope_parameters; 4.x configs in rope_theta / rope_scaling.
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    legacy = getattr(cfg, "rope_scaling", None)
    if not params and legacy:
        params = dict(legacy)
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind == "default":
        return RopeSpec(theta=float(theta))
    if kind == "linear":
        return RopeSpec(theta=float(theta), kind="linear", factor=float(params["factor"]))
    if kind == "llama3":
        return RopeSpec(theta=float(theta), kind="llama3", factor=float(params["factor"]),
                        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
                        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
                        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)))
    raise UnsupportedModelError(f"{src}: rope_scaling / rope_parameters rope_type={kind!r} is not supported "
                                "(supported: default, linear, llama3)")


def _dtype_name(cfg: Any) -> str:
    dtype = getattr(cfg, "dtype", None)
    # transformers 5's PretrainedConfig.torch_dtype is a property returning .dtype that logs a deprecation on the
    # console of every worker: read the old name only where it is a plain attribute (older configs, namespaces)
    if dtype is None and not isinstance(getattr(type(cfg), "torch_dtype", None), property):
        dtype = getattr(cfg, "torch_dtype", None)
    dtype = dtype or "float32"
    name = str(dtype).replace("torch.", "")
    return name if name in ("float32", "bfloat16", "float16") else "float32"
