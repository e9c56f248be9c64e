"""Step metrics under verl's names, against values computed by hand on a 2-sample batch."""
import math

import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.metrics import (
    causal_training_flops,
    compute_data_metrics,
    compute_mfu,
    compute_throughput_metrics,
    compute_timing_metrics,
    effective_seq_len,
    flops_per_token,
    matmul_params,
    peak_flops_for,
    reduce_metrics,
)

X = 100.0  # junk at masked-out positions: it must never reach a metric


def tiny_batch(with_response_mask=True):
    """2 samples, prompt width P=3 (left-padded), response width T=4 (right-padded).
    sample 0: prompt 2 tokens, response 4 (hits the limit); sample 1: prompt 3 (hits it), response 2."""
    attention = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]])
    rmask = attention[:, 3:]
    scores = torch.tensor([[0, 0, 0, 1.0], [0, 0.5, 0, 0]])
    tensors = {
        "responses": torch.ones(2, 4, dtype=torch.long),
        "attention_mask": attention,
        "token_level_scores": scores,
        "token_level_rewards": scores - 0.1 * rmask,  # a KL-like penalty on each response token
        "advantages": torch.tensor([[1.0, 2, 3, 4], [5, 6, X, X]]),
        "returns": torch.tensor([[1.0, 1, 1, 1], [2, 2, -X, -X]]),
        "values": torch.tensor([[1.0, 1, 1, 1], [1.5, 1.5, X, X]]),
    }
    if with_response_mask:
        tensors["response_mask"] = rmask
    return DataProto.from_dict(tensors)


@pytest.mark.parametrize("with_response_mask", [True, False])
def test_data_metrics_by_hand(with_response_mask):
    m = compute_data_metrics(tiny_batch(with_response_mask), use_critic=True)
    expect = {
        "critic/score/mean": 0.75, "critic/score/max": 1.0, "critic/score/min": 0.5,
        "critic/rewards/mean": (0.6 + 0.3) / 2, "critic/rewards/max": 0.6, "critic/rewards/min": 0.3,
        "critic/advantages/mean": 3.5, "critic/advantages/max": 6.0, "critic/advantages/min": 1.0,
        "critic/returns/mean": 8 / 6, "critic/returns/max": 2.0, "critic/returns/min": 1.0,
        "critic/values/mean": 7 / 6, "critic/values/max": 1.5, "critic/values/min": 1.0,
        # returns - values = [0,0,0,0,.5,.5]: unbiased var 1/15; var(returns) = 4/15
        "critic/vf_explained_var": 1 - (1 / 15) / (4 / 15 + 1e-5),
        "response_length/mean": 3.0, "response_length/max": 4.0, "response_length/min": 2.0,
        "response_length/clip_ratio": 0.5,
        "prompt_length/mean": 2.5, "prompt_length/max": 3.0, "prompt_length/min": 2.0, "prompt_length/clip_ratio": 0.5,
    }
    assert set(m) == set(expect)
    for k, v in expect.items():
        assert m[k] == pytest.approx(v, rel=1e-6), k


def test_response_mask_only_limits_token_stats():
    """A multi-turn sample whose response holds a tool-output token (attended, not trained on): lengths
    count it, advantage/return/value statistics leave it out."""
    batch = tiny_batch()
    batch.batch["response_mask"] = batch.batch["response_mask"].clone()
    batch.batch["response_mask"][0, 1] = 0
    m = compute_data_metrics(batch, use_critic=True)
    assert m["response_length/mean"] == 3.0 and m["response_length/clip_ratio"] == 0.5
    assert m["critic/advantages/mean"] == pytest.approx((1 + 3 + 4 + 5 + 6) / 5)


def test_no_critic_metrics_without_critic():
    m = compute_data_metrics(tiny_batch(), use_critic=False)
    assert not any(k.startswith("critic/values") for k in m) and "critic/vf_explained_var" not in m
    assert m["critic/score/mean"] == pytest.approx(0.75)


def test_timing_metrics_per_token():
    timing = {"gen": 0.6, "update_actor": 1.1, "reshard": 0.1, "save_checkpoint": 3.0, "step": 2.0}
    m = compute_timing_metrics(tiny_batch(), timing)
    assert {k: m[k] for k in m if k.startswith("timing_s/")} == {f"timing_s/{k}": v for k, v in timing.items()}
    # 6 response tokens, 6 + 5 prompt tokens = 11 in all
    assert m["timing_per_token_ms/gen"] == pytest.approx(600 / 6)
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(1100 / 11)
    assert set(k for k in m if k.startswith("timing_per_token_ms/")) == {
        "timing_per_token_ms/gen", "timing_per_token_ms/update_actor"}


def test_throughput():
    batch = tiny_batch()
    m = compute_throughput_metrics(batch, {"step": 2.0}, n_gpus=2)
    assert m == {"perf/total_num_tokens": 11.0, "perf/time_per_step": 2.0, "perf/throughput": 11 / 4}
    batch.meta_info["global_token_num"] = [5, 7]  # the rollout's own count wins when recorded
    assert compute_throughput_metrics(batch, {"step": 2.0}, n_gpus=2)["perf/throughput"] == 3.0


# hidden 8, 2 layers, 2 query heads of dim 4, 1 kv head, gated MLP 16, vocab 10
TINY = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 10}


def test_flops_by_hand():
    # per layer: q,o 2*(8*8) = 128; k,v 2*(8*4) = 64; mlp 3*8*16 = 384 -> 576; 2 layers + lm head 80
    assert matmul_params(TINY) == 2 * 576 + 80 == 1232
    assert flops_per_token(TINY, seq_len=10) == 6 * 1232 + 12 * 2 * 8 * 10
    assert flops_per_token(TINY, seq_len=10, training=False) == 2 * 1232 + 4 * 2 * 8 * 10
    assert flops_per_token(TINY) == 6 * 1232
    gpt2 = {**TINY, "model_type": "gpt2"}  # fc1 + fc2, no gate
    assert matmul_params(gpt2) == 2 * (192 + 2 * 8 * 16) + 80


def test_causal_training_flops_by_hand():
    # megatron_speed.json's numerator: 6 N per token, and per sequence of s tokens 6 L d s^2 (QK^T and AV, causal)
    lengths = [3, 10, 7]
    by_hand = sum(6.0 * 1232 * s + 6.0 * 2 * 8 * s * s for s in lengths)
    assert causal_training_flops(TINY, lengths) == by_hand
    # half the attention term of verl's count at the same effective length
    full = sum(lengths) * flops_per_token(TINY, seq_len=effective_seq_len(lengths))
    assert full - causal_training_flops(TINY, lengths) == pytest.approx(6.0 * 2 * 8 * sum(s * s for s in lengths))


def test_flops_of_a_mixture_of_experts_count_active_weights():
    # attention 192 per layer (TINY); router 8*8 = 64; top-2 experts of width 4: 2 * 3*8*4 = 192 -> 448 a layer
    qwen3_moe = {**TINY, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
                 "moe_intermediate_size": 4}
    assert matmul_params(qwen3_moe) == 2 * (192 + 64 + 192) + 80 == 976
    assert flops_per_token(qwen3_moe) == 6 * 976
    # mixtral: experts are intermediate_size wide (16); qwen2_moe adds a shared expert (width 6) and its gate [1, h]
    mixtral = {**TINY, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}
    assert matmul_params(mixtral) == 2 * (192 + 64 + 2 * 3 * 8 * 16) + 80
    qwen2_moe = {**qwen3_moe, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 6}
    assert matmul_params(qwen2_moe) == 2 * (192 + 64 + 192 + 3 * 8 * 6 + 8) + 80
    with pytest.raises(ValueError, match="mlp_only_layers"):
        matmul_params({**qwen3_moe, "mlp_only_layers": [0]})


def test_mfu_counts_the_plans_active_parameters():
    # the plan's active count (every weight a token runs through) = matmul_params + embedding + norms
    from hybridrl.plan.model_shape import from_hf_config

    cfg = {**TINY, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 4,
           "head_dim": 4, "tie_word_embeddings": False}
    shape = from_hf_config(cfg)
    norms = 2 * (2 * 8 + 2 * 4) + 8  # two RMSNorms + q/k norms a layer, the final norm
    assert matmul_params(cfg) == shape.active_params - 10 * 8 - norms


def test_mfu_and_effective_len():
    assert effective_seq_len([2, 4]) == pytest.approx((4 + 16) / 6)
    mfu = compute_mfu(tokens=1000, seconds=2.0, n_gpus=2, hf_config=TINY, peak_flops=1e7, seq_len=10)
    assert mfu == pytest.approx(1000 * (6 * 1232 + 1920) / 2.0 / (2 * 1e7))
    assert math.isnan(compute_mfu(1000, 0.0, 1, TINY, 1e7))
    assert peak_flops_for("NVIDIA H200") == peak_flops_for("NVIDIA H100 80GB HBM3") == 989.4e12
    assert peak_flops_for("NVIDIA H20") == 148e12 and peak_flops_for("Intel Xeon") is None


def test_reduce_metrics():
    out = reduce_metrics({"a": [1, 2, 3], "b": [], "c": [1.0, float("nan")], "d": [torch.tensor(4.0)]})
    assert out["a"] == 2.0 and "b" not in out and math.isnan(out["c"]) and out["d"] == 4.0
