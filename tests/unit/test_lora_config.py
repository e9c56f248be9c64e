"""actor_rollout_ref.model.lora_* (verl's keys): what they resolve to and the errors that name the key to fix."""
from __future__ import annotations

import pytest

from hybridrl.config import ConfigError, load_config, validate
from hybridrl.config.lora_checks import LORA_MODULES, lora_targets

M = "actor_rollout_ref.model"
BASE = ["data.train_files=/data/train.parquet", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1"]


def CPU() -> bool:  # validation as on a machine without CUDA
    return False


def run(*overrides: str, cuda=CPU, te=lambda: False):
    return validate(load_config(BASE + list(overrides)), cuda_available=cuda, te_available=te)


def test_target_names_resolve_to_hf_modules_in_a_fixed_order():
    assert lora_targets("all-linear") == LORA_MODULES
    assert lora_targets(["v_proj", "q_proj"]) == ("q_proj", "v_proj")
    assert lora_targets("linear_qkv,linear_fc2") == ("q_proj", "k_proj", "v_proj", "down_proj")
    assert lora_targets("all-linear", ["linear_fc1"]) == ("q_proj", "k_proj", "v_proj", "o_proj", "down_proj")


def test_a_lora_run_validates_on_cpu():
    run(f"{M}.lora_rank=8", f"{M}.lora_alpha=16", f"{M}.target_modules=[q_proj,v_proj]")


@pytest.mark.parametrize("overrides, message", [
    ([f"{M}.lora_rank=-1"], f"{M}.lora_rank=-1 must be >= 0"),
    ([f"{M}.lora_rank=8", f"{M}.lora_alpha=0"], f"{M}.lora_alpha=0"),
    ([f"{M}.lora_rank=8", f"{M}.target_modules=[q_proj,qproj]"], f"{M}.target_modules: 'qproj' is not one of"),
    ([f"{M}.lora_rank=8", f"{M}.target_modules=[o_proj]", f"{M}.exclude_modules=[linear_proj]"],
     "leaves no layer for the adapters"),
    ([f"{M}.lora_adapter_path=/tmp/adapter"], f"{M}.lora_adapter_path is set but {M}.lora_rank=0"),
])
def test_bad_lora_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        run(*overrides)


def test_lora_refuses_the_transformer_engine_spec_naming_the_key():
    with pytest.raises(ConfigError, match="transformer_impl=local"):
        run(f"{M}.lora_rank=8", "trainer.device=cuda", cuda=lambda: True, te=lambda: True)


def test_a_peft_adapter_must_match_the_keys_and_the_error_says_what_to_set():
    from hybridrl.adapters.megatron.lora import LoraSpec
    from hybridrl.adapters.megatron.lora_io import check_peft_config

    spec = LoraSpec(8, 16.0, ("q_proj", "v_proj"))
    ok = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["v_proj", "q_proj"], "bias": "none"}
    check_peft_config(ok, spec, "/adapter")
    for change, message in [({"r": 4}, f"set {M}.lora_rank=4"), ({"lora_alpha": 32}, f"set {M}.lora_alpha=32"),
                            ({"target_modules": ["q_proj"]}, rf"set {M}.target_modules=\[q_proj\]"),
                            ({"use_dora": True}, "no DoRA"), ({"lora_bias": True}, "trained biases"),
                            ({"rank_pattern": {"q_proj": 4}}, "rank_pattern")]:
        with pytest.raises(ValueError, match=message):
            check_peft_config({**ok, **change}, spec, "/adapter")


SPLIT = ["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=1", "trainer.backend=ray",
         "trainer.n_gpus_per_node=1"]


@pytest.mark.parametrize("overrides, message", [
    ([f"{M}.lora.merge=true"], f"{M}.lora.merge=true but {M}.lora_rank=0"),
    ([f"{M}.lora_rank=8", *SPLIT], f"hybrid_engine=false: the rollout workers take broadcast full weights.*set {M}.lora.merge=true"),
    ([f"{M}.lora_rank=1024", "actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda"],
     f"vLLM's LoRA takes ranks up to 512.*{M}.lora.merge=true"),
])
def test_the_adapter_sync_refuses_what_cannot_take_adapters(overrides, message):
    """lora.merge=false (the default) sends the adapters apart from the base: only the colocated engine takes them,
    and vLLM only up to its largest LoRA rank; each error names lora.merge, the key that gets full weights instead."""
    with pytest.raises(ConfigError, match=message):
        run(*overrides, cuda=lambda: "trainer.device=cuda" in overrides)


def test_merged_lora_runs_where_adapters_cannot():
    run(f"{M}.lora_rank=1024", f"{M}.lora.merge=true", "actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda",
        cuda=lambda: True)
    cfg = load_config(BASE + [f"{M}.lora_rank=8"])
    assert cfg.actor_rollout_ref.model.lora.merge is False  # verl's default: adapters apart from the base
