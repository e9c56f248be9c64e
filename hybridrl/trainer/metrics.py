"""Per-step metrics under verl's names, computed from the step's DataProto and the phase timings.

The batch holds, per sample i (B rows): `responses` [B, T], `attention_mask` [B, P + T] (prompt
left-padded to P columns, response right-padded to T), optionally `response_mask` [B, T] (else the last T
columns of attention_mask; it may also leave out tool-output tokens), `token_level_scores`, `token_level_rewards`, `advantages`, `returns` and,
with a critic, `values`, all [B, T]. Sequence scores/rewards are sums over the row (scores sit on the
last response token); advantages, returns and values are reduced over response tokens only.

MFU (model FLOPs utilization) for a dense decoder, per token of a sequence of length s:
    training  6 N + 12 L d s        forward only  2 N + 4 L d s
N counts the matmul weights (attention q/k/v/o and MLP per layer, plus the LM head; the input
embedding is a lookup, not a matmul), L is the number of layers and d = heads x head_dim (the width of
the attention scores). 2 FLOPs per weight per token forward, twice that backward; the attention term
is QK^T and AV (2 x 2 s d per layer forward), counted without the causal-mask halving, as PaLM
(Chowdhery et al. 2022, appendix B) and Megatron do. MFU = achieved FLOP/s / (n_gpus x peak FLOP/s).
A mixture-of-experts layer counts the weights a token is routed through (MFU on active parameters): the
router [E, h], top-k routed experts and the shared expert (qwen2_moe), not the experts it skips.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

import numpy as np
import torch

from hybridrl.protocol import DataProto

# Stages normalised by response tokens only (generation produces them); the other token-processing
# stages see every prompt + response token. Stages not listed (reshard, testing, save_checkpoint,
# step) are wall time that does not scale with tokens, so they get no per-token figure.
_PER_TOKEN_RESPONSE = ("gen",)
_PER_TOKEN_ALL = ("reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")

# Dense bf16 peak FLOP/s per GPU (vendor datasheets, without sparsity), for compute_mfu's peak_flops.
PEAK_FLOPS = {"H100": 989.4e12, "H200": 989.4e12, "H20": 148e12, "A100": 312e12, "A800": 312e12,
              "L40S": 362e12, "B200": 2250e12}

# MLPs with one up projection (fc1, fc2); every other supported family (Llama, Qwen2, Mistral, ...)
# uses a gated MLP (gate, up, down).
_NON_GATED_MLP = {"gpt2", "gpt_neox", "gptj", "opt", "phi", "bloom", "falcon"}


# ------------------------------------------------------------------------------------------ batch metrics
def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.detach().float()
    if x.numel() == 0:  # e.g. every response empty: report NaN rather than crash the step
        return {f"{prefix}/{s}": float("nan") for s in ("mean", "max", "min")}
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


def response_mask(batch: DataProto) -> torch.Tensor:
    """[B, T] bool: `response_mask` when the batch has one, else the attention mask's last T columns."""
    if "response_mask" in batch.batch:
        return batch.batch["response_mask"].bool()
    width = batch.batch["responses"].shape[-1]
    return batch.batch["attention_mask"][:, -width:].bool()


def lengths(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(prompt lengths [B], response lengths [B], prompt width P, response width T), from the attention
    mask: a response's length counts every token it holds, also those response_mask leaves out of the
    loss (tool outputs in a multi-turn rollout), as verl does."""
    width = batch.batch["responses"].shape[-1]
    attention = batch.batch["attention_mask"]
    return attention[:, :-width].sum(-1).float(), attention[:, -width:].sum(-1).float(), attention.shape[-1] - width, width


def _length_metrics(name: str, length: torch.Tensor, limit: int) -> dict[str, float]:
    # clip_ratio: the fraction of rows that filled every column, i.e. were cut at the limit
    return {**_stats(name, length), f"{name}/clip_ratio": (length == limit).float().mean().item()}


def explained_variance(returns: torch.Tensor, values: torch.Tensor) -> float:
    """1 - Var(returns - values) / (Var(returns) + 1e-5) over the given (already masked) tokens; verl's
    critic/vf_explained_var (1 is a perfect critic, 0 no better than a constant, negative worse)."""
    returns, values = returns.double(), values.double()
    if returns.numel() < 2:
        return float("nan")
    return (1.0 - torch.var(returns - values) / (torch.var(returns) + 1e-5)).item()


def compute_data_metrics(batch: DataProto, use_critic: bool) -> dict[str, float]:
    """critic/{score,rewards,advantages,returns[,values]}/{mean,max,min}, critic/vf_explained_var (with a
    critic), {response,prompt}_length/{mean,max,min,clip_ratio}."""
    t = batch.batch
    mask = response_mask(batch)
    metrics = {
        **_stats("critic/score", t["token_level_scores"].sum(-1)),
        **_stats("critic/rewards", t["token_level_rewards"].sum(-1)),
        **_stats("critic/advantages", torch.masked_select(t["advantages"], mask)),
        **_stats("critic/returns", torch.masked_select(t["returns"], mask)),
    }
    if use_critic:
        values = torch.masked_select(t["values"], mask)
        metrics.update(_stats("critic/values", values))
        metrics["critic/vf_explained_var"] = explained_variance(torch.masked_select(t["returns"], mask), values)
    prompt_len, response_len, prompt_width, response_width = lengths(batch)
    metrics.update(_length_metrics("response_length", response_len, response_width))
    metrics.update(_length_metrics("prompt_length", prompt_len, prompt_width))
    return metrics


def compute_timing_metrics(batch: DataProto, timing_raw: Mapping[str, float]) -> dict[str, float]:
    """timing_s/{stage} for every stage timed, and timing_per_token_ms/{stage} for the token-processing
    ones (gen per response token, the others per prompt + response token)."""
    prompt_len, response_len, _, _ = lengths(batch)
    n_response = response_len.sum().item()
    n_all = n_response + prompt_len.sum().item()
    out = {f"timing_s/{k}": float(v) for k, v in timing_raw.items()}
    for stage, seconds in timing_raw.items():
        tokens = n_response if stage in _PER_TOKEN_RESPONSE else n_all if stage in _PER_TOKEN_ALL else 0
        if tokens > 0:
            out[f"timing_per_token_ms/{stage}"] = float(seconds) * 1000.0 / tokens
    return out


def total_tokens(batch: DataProto) -> int:
    """Prompt + response tokens of the step: meta_info["global_token_num"] (per-sample counts, as verl's
    rollout records them) when present, else the attention mask's sum."""
    counts = batch.meta_info.get("global_token_num")
    if counts is not None:
        return int(sum(counts))
    return int(batch.batch["attention_mask"].sum().item())


def compute_throughput_metrics(batch: DataProto, timing_raw: Mapping[str, float], n_gpus: int) -> dict[str, float]:
    """perf/total_num_tokens, perf/time_per_step (timing_raw["step"]), perf/throughput (tokens/s/GPU)."""
    tokens, seconds = total_tokens(batch), float(timing_raw["step"])
    throughput = tokens / (seconds * n_gpus) if seconds > 0 and n_gpus > 0 else float("nan")
    return {"perf/total_num_tokens": float(tokens), "perf/time_per_step": seconds, "perf/throughput": throughput}


# ------------------------------------------------------------------------------------------ FLOPs / MFU
def _cfg(hf_config: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if hf_config.get(n) is not None:
            return hf_config[n]
    if default is not None:
        return default
    raise KeyError(f"hf config has none of {names}")


def matmul_params(hf_config: Mapping[str, Any]) -> int:
    """N: weights used in matmuls per token (layers + LM head; biases and norms are negligible); for a
    mixture of experts the active ones (router, the top-k routed experts, a shared expert)."""
    experts = _cfg(hf_config, "num_local_experts", "num_experts", "n_routed_experts", default=0)
    h = _cfg(hf_config, "hidden_size", "n_embd", "d_model")
    layers = _cfg(hf_config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _cfg(hf_config, "num_attention_heads", "n_head")
    kv_heads = _cfg(hf_config, "num_key_value_heads", default=heads)
    head_dim = _cfg(hf_config, "head_dim", default=h // heads)
    ffn = _cfg(hf_config, "intermediate_size", "n_inner", "ffn_dim", default=4 * h)
    vocab = _cfg(hf_config, "vocab_size")
    attention = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2  # q, o ; k, v
    mlp = (2 if hf_config.get("model_type") in _NON_GATED_MLP else 3) * h * ffn
    if experts and experts > 1:
        if hf_config.get("mlp_only_layers") or _cfg(hf_config, "decoder_sparse_step", default=1) != 1:
            raise ValueError("flops_per_token: a mixture of experts with dense layers among its MoE layers "
                             "(mlp_only_layers / decoder_sparse_step) is not supported")
        topk = _cfg(hf_config, "num_experts_per_tok", "moe_topk")
        expert_ffn = _cfg(hf_config, "moe_intermediate_size", default=ffn)  # mixtral: intermediate_size
        shared = _cfg(hf_config, "shared_expert_intermediate_size", default=0) if hf_config.get("model_type") == "qwen2_moe" else 0
        mlp = experts * h + topk * 3 * h * expert_ffn + (3 * h * shared + h if shared else 0)
    return layers * (attention + mlp) + h * vocab


def flops_per_token(hf_config: Mapping[str, Any], seq_len: float = 0.0, training: bool = True) -> float:
    """FLOPs per token of a dense decoder (see the module docstring): 6N + 12 L d s training,
    2N + 4 L d s forward only. `seq_len` s: the sequence length, or for a batch of lengths s_i the
    effective length sum(s_i^2) / sum(s_i) (`effective_seq_len`); 0 leaves out the attention term."""
    layers = _cfg(hf_config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _cfg(hf_config, "num_attention_heads", "n_head")
    h = _cfg(hf_config, "hidden_size", "n_embd", "d_model")
    d = heads * _cfg(hf_config, "head_dim", default=h // heads)
    n = matmul_params(hf_config)
    mult = 3 if training else 1  # backward costs twice the forward
    return mult * (2.0 * n + 4.0 * layers * d * seq_len)


def causal_training_flops(hf_config: Mapping[str, Any], seq_lens: Iterable[float]) -> float:
    """FLOPs of one forward+backward over sequences of `seq_lens` valid tokens, counting causal attention's half:
    6 N sum(s) + 6 L d sum(s^2), megatron_speed.json's (and benchmarks/train_bench.py's) MFU numerator. verl's
    count (flops_per_token) takes attention as full, which reads higher at long sequences."""
    layers = _cfg(hf_config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _cfg(hf_config, "num_attention_heads", "n_head")
    h = _cfg(hf_config, "hidden_size", "n_embd", "d_model")
    d = heads * _cfg(hf_config, "head_dim", default=h // heads)
    s = np.asarray(list(seq_lens), dtype=np.float64)
    return float(6.0 * matmul_params(hf_config) * s.sum() + 6.0 * layers * d * (s * s).sum())


def effective_seq_len(seq_lens: Iterable[float]) -> float:
    """sum(s^2) / sum(s): attention work grows with s per token, so this is the per-token average."""
    s = np.asarray(list(seq_lens), dtype=np.float64)
    return float((s * s).sum() / s.sum()) if s.sum() > 0 else 0.0


def compute_mfu(
    tokens: float,
    seconds: float,
    n_gpus: int,
    hf_config: Mapping[str, Any],
    peak_flops: float,
    seq_len: float = 0.0,
    training: bool = True,
) -> float:
    """Achieved / peak FLOP/s as a fraction in [0, 1]; `peak_flops` is per GPU (see PEAK_FLOPS)."""
    if seconds <= 0 or n_gpus <= 0 or peak_flops <= 0:
        return float("nan")
    achieved = tokens * flops_per_token(hf_config, seq_len, training) / seconds
    return achieved / (n_gpus * peak_flops)


def peak_flops_for(device_name: str) -> Optional[float]:
    """PEAK_FLOPS entry whose name appears in a device name such as "NVIDIA H100 80GB HBM3"."""
    for name in sorted(PEAK_FLOPS, key=len, reverse=True):  # H200 before H20
        if name in device_name.upper():
            return PEAK_FLOPS[name]
    return None


# ------------------------------------------------------------------------------------------ reduction
def reduce_metrics(metrics: Mapping[str, Iterable[Any]]) -> dict[str, float]:
    """Mean of each list (micro-batch values -> one number per step); empty lists are dropped. A NaN
    in a list makes its mean NaN on purpose: averaging it away would hide the bad micro-batch."""
    out = {}
    for k, values in metrics.items():
        vals = [float(v.item() if hasattr(v, "item") else v) for v in values]
        if vals:
            out[k] = float(np.mean(vals))
    return out
