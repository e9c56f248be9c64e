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
