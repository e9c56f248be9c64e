"""`hybridrl plan` with a reward model: its own phase, its params counted against transformers' parameter count,
idle offload, and a refusal that names the reward model's knob."""
from __future__ import annotations

import pytest

from hybridrl.config.loader import load_config
from hybridrl.config.validate import validate
from hybridrl.plan.checks import fit_problems
from hybridrl.plan.estimate import estimate
from hybridrl.plan.memory import GiB
from hybridrl.plan.model_shape import resolve

GPU = lambda: True  # noqa: E731


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    cfg = Qwen2Config(vocab_size=640, hidden_size=64, intermediate_size=112, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, num_labels=1, tie_word_embeddings=True, pad_token_id=0)
    model = Qwen2ForSequenceClassification(cfg)
    folder = tmp_path_factory.mktemp("rm") / "rm"
    model.save_pretrained(folder)
    return str(folder), sum(p.numel() for p in model.parameters())


def _run(rm_path, *extra):
    return validate(load_config(["preset=7b_8gpu", "reward_model.enable=true", f"reward_model.model.path={rm_path}",
                                 "reward_model.micro_batch_size_per_gpu=8", *extra]), cuda_available=GPU)


def test_reward_phase_holds_the_reward_model(rm_folder):
    path, hf_params = rm_folder
    run = _run(path)
    plan = estimate(run, resolve("Qwen2.5-7B"), 80 * GiB, rm_shape=resolve(path))
    reward = plan.phases["reward"].parts
    tp = run.derived.reward.layout.tp
    # vocab 640 needs no padding at tp=2; the norms (2 a layer + the final one) and the score head are replicated,
    # every other tensor (embedding, qkv with its bias, o, gate/up, down) is split over tp
    replicated = 64 * (2 * 4 + 1) + 64
    assert tp == 2 and reward["rm_params"] == 2 * ((hf_params - replicated) // tp + replicated)  # bf16
    assert reward["activations"] > 0 and reward["rollout_kv_cache"] == 0  # vLLM asleep, the RM's forward pass
    train = plan.phases["train_actor"].parts
    assert train["rm_params"] == 0  # offloaded while idle (reward_model.megatron.param_offload defaults to true)
    kept = estimate(_run(path, "reward_model.megatron.param_offload=false"), resolve("Qwen2.5-7B"), 80 * GiB,
                    rm_shape=resolve(path))
    assert kept.phases["train_actor"].parts["rm_params"] == reward["rm_params"]
    assert kept.phases["rollout"].parts["rm_params"] == reward["rm_params"]


def test_reward_phase_refusal_names_the_reward_models_knob(rm_folder):
    path, _ = rm_folder
    big = _run(path, "reward_model.micro_batch_size_per_gpu=2048")
    shape = resolve("Qwen2.5-7B")
    plan = estimate(big, shape, 80 * GiB, rm_shape=shape)
    assert plan.phases["reward"].total > 80 * GiB
    problems = [p for p in fit_problems(plan, big, shape) if "the reward phase" in p.message]
    assert problems and problems[0].knob == "reward_model.micro_batch_size_per_gpu", problems
    assert estimate(big, shape, 80 * GiB).notes == [
        "the reward model is planned with the actor's shape (pass --reward-model-config for its own)"]


def test_reward_model_bench_run_planned_by_hand(tmp_path):
    """Issue 42's GPU run (benchmarks/reward_model_bench.py's overrides: Qwen2.5-0.5B's shape as policy and reward
    model, one GPU, nothing offloaded but the idle reward model) planned term by term in float64. The reward phase
    holds what is resident when the reward model scores (the actor's params, its grads (back after generation) and
    Adam state, the reference, the reward model and one forward micro-batch); the ref_log_prob phase, which
    memory/ref_peak_bytes is measured against, is planned although the reference stays resident."""
    import os
    import sys

    from transformers import Qwen2Config

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import reward_model_bench as bench

    shape = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)
    Qwen2Config(**shape).save_pretrained(tmp_path / "policy")
    Qwen2Config(**shape, num_labels=1).save_pretrained(tmp_path / "rm")
    args = bench.overrides(str(tmp_path / "policy"), str(tmp_path / "rm"), str(tmp_path / "out"), 6, cpu=False)
    assert args[:2] == ["--config-name", "grpo_trainer"]
    run = validate(load_config(args[2:], config_name="grpo_trainer"), cuda_available=GPU)
    plan = estimate(run, resolve(str(tmp_path / "policy")), 80 * GiB, rm_shape=resolve(str(tmp_path / "rm")))

    h, f, layers, vocab, heads, q, kv = 896.0, 4864.0, 24.0, 151936.0, 14.0, 896.0, 128.0
    layer = h * (q + 2 * kv) + q * h + (q + 2 * kv) + 3 * h * f + 2 * h  # qkv (+ bias), o, SwiGLU, two norms
    p = layers * layer + vocab * h + h  # + the tied embedding and the final norm
    assert p == 494_032_768.0
    per_token = 2 * (4 * h + 2 * q + 2 * kv + 5 * f) + 4 * heads  # A_layer / T in bf16 (memory.py)
    overhead = 3 * 2.0 ** 30
    resident = 2 * p + 4 * p + 12 * p + 2 * p + overhead  # actor bf16 + fp32 grads + Adam (dp 1), the reference
    rm_tokens = run.derived.reward.max_token_len_per_gpu  # dynamic micro-batches, as the run's
    reward = plan.phases["reward"].parts
    assert reward["rm_params"] == 2 * (p + h)  # + the score head
    assert reward["activations"] == rm_tokens * per_token  # no logits: a scalar head
    assert plan.phases["reward"].total == resident + 2 * (p + h) + rm_tokens * per_token == 16_054_717_440
    fwd = run.derived.actor_batch.forward_max_token_len_per_gpu
    ref = plan.phases["ref_log_prob"]
    assert ref.parts["activations"] == fwd * per_token + fwd * vocab * (2 + 4)  # + bf16 logits, fp32 log-softmax
    assert ref.total == resident + fwd * (per_token + vocab * 6) == 29_020_182_016
    assert plan.peak.name == "train_actor" and ref.total <= plan.phases["train_actor"].total
    assert fit_problems(plan, run, resolve(str(tmp_path / "policy"))) == []
