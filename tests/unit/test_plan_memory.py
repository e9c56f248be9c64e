"""Memory plan numbers against hand computations and published parameter counts."""
from __future__ import annotations

import dataclasses
import json

import pytest

from hybridrl.config import load_config, validate
from hybridrl.plan import GiB, estimate, resolve
from hybridrl.plan.memory import (
    MEGATRON_VOCAB_MULTIPLE,
    kv_bytes_per_token,
    model_state_bytes,
    padded_vocab,
    rollout_weight_bytes,
    stage_params,
)
from hybridrl.plan.model_shape import ModelShapeError, canonical_name

GPU = lambda: True  # noqa: E731  plan as on a GPU machine

# Parameter counts the model cards publish (HF `num_parameters()`): the built-in table must reproduce them.
PUBLISHED = {
    "Qwen2.5-0.5B": 494_032_768, "Qwen2.5-1.5B": 1_543_714_304, "Qwen2.5-3B": 3_085_938_688,
    "Qwen2.5-7B": 7_615_616_512, "Qwen2.5-14B": 14_770_033_664, "Qwen2.5-32B": 32_763_876_352,
    "Qwen2.5-72B": 72_706_203_648, "Llama-3-8B": 8_030_261_248, "Llama-3-70B": 70_553_706_496,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_builtin_shapes_match_published_parameter_counts(name):
    assert resolve(name).params == PUBLISHED[name]


def test_names_and_paths_resolve_to_the_table():
    assert canonical_name("Qwen/Qwen2.5-7B-Instruct") == "Qwen2.5-7B"
    assert canonical_name("/models/Meta-Llama-3.1-70B-Instruct/") == "Llama-3-70B"
    assert canonical_name("~/models/deepseek-llm-7b-chat") == "deepseek-llm-7b"
    assert canonical_name("/models/my-finetune") is None
    with pytest.raises(ModelShapeError, match="--model-config"):
        resolve("/models/my-finetune")


def test_local_config_json_and_override_config(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = resolve(str(tmp_path), {"num_hidden_layers": 6})
    assert (shape.num_layers, shape.head_dim, shape.num_key_value_heads, shape.qkv_bias) == (6, 16, 2, False)
    # embed 512*64 + 6 layers * (64*(64+2*32) + 64*64 + 3*64*128 + 2*64) + final norm 64 + untied head 512*64
    assert shape.params == 512 * 64 + 6 * (64 * 128 + 64 * 64 + 3 * 64 * 128 + 128) + 64 + 512 * 64


def test_vocab_padding_matches_the_megatron_adapter():
    from hybridrl.adapters.megatron.hf_config import VOCAB_PAD_MULTIPLE

    assert MEGATRON_VOCAB_MULTIPLE == VOCAB_PAD_MULTIPLE
    assert (padded_vocab(152_064, 2), padded_vocab(128_256, 8), padded_vocab(1001, 2)) == (152_064, 128_256, 1024)
    assert padded_vocab(151_000, 2) == padded_vocab(151_000, 8) == 151_040 and padded_vocab(1001, 3) == 1152


def test_7b_tp2_params_bytes_by_hand():
    """Qwen2.5-7B (h=3584, f=18944, 28 heads of 128, 4 KV heads, V=152064, untied) at tp=2 in bf16.

    Per layer, tp-sharded: 3584*(3584+2*512) + 3584*3584 + (3584+2*512) + 3*3584*18944 = 233,050,624 -> /2
    = 116,525,312, plus 2*3584 norm weights = 116,532,480; x28 = 3,262,909,440. Embedding and LM head: 152,064 is
    already a multiple of 64, so no padding rows: 76,032*3584 = 272,498,688 each; final norm 3584.
    Total 3,807,910,400 params = 7,615,820,800 bytes.
    """
    shape = resolve("Qwen2.5-7B")
    p = stage_params(shape, tp=2, pp=1, stage=0)
    assert p == 3_807_910_400
    # the two tp shards hold the model once and the replicated norms twice
    assert 2 * p - (28 * 2 * 3584 + 3584) == PUBLISHED["Qwen2.5-7B"]
    s = model_state_bytes(p, 2, optimizer_shards=4)
    assert (s.params, s.grads, s.optimizer) == (7_615_820_800, 15_231_641_600, 11_423_731_200)  # 2P, 4P, 12P/4
    assert model_state_bytes(p, 2, optimizer_shards=1).optimizer == 12 * p
    assert model_state_bytes(p, 4).optimizer == 8 * p  # fp32 training: no master copy


def test_70b_tp8_pp2_stages_by_hand():
    """Llama-3-70B at tp=8, pp=2: 40 layers a stage of 855,638,016/8 + 2*8192 params; embedding on stage 0,
    final norm + LM head on stage 1 (each 128,256/8 * 8192: the vocab is a multiple of 64, no padding)."""
    shape = resolve("Llama-3-70B")
    layers = 40 * (855_638_016 // 8 + 2 * 8192)
    s0, s1 = stage_params(shape, 8, 2, 0), stage_params(shape, 8, 2, 1)
    assert (s0, s1) == (layers + 16_032 * 8192, layers + 8192 + 16_032 * 8192)
    assert 8 * (s0 + s1) - 7 * (80 * 2 * 8192 + 8192) == PUBLISHED["Llama-3-70B"]


def test_tied_embeddings_copy_on_last_stage_only_with_pipeline():
    shape = resolve("Qwen2.5-0.5B")  # tied; vocab 151,936, a multiple of 64: no padding rows
    padding = 0
    assert stage_params(shape, 1, 2, 1) - stage_params(shape, 1, 2, 0) == 896  # both hold Vp*h; last adds the norm
    assert stage_params(shape, 1, 1, 0) == PUBLISHED["Qwen2.5-0.5B"] + padding  # one shared matrix
    assert stage_params(shape, 1, 1, 0, lm_head=False) == PUBLISHED["Qwen2.5-0.5B"] + padding + 896  # value head


def test_kv_cache_and_rollout_weights_by_hand():
    shape = resolve("Qwen2.5-7B")
    assert kv_bytes_per_token(shape, 2, 2) == 2 * 28 * 2 * 128 * 2  # K+V, 28 layers, 4/2 KV heads, d=128, bf16
    assert kv_bytes_per_token(shape, 8, 2) == 2 * 28 * 1 * 128 * 2  # tp_g > KV heads: one head each, replicated
    assert rollout_weight_bytes(shape, 2, 2) == 7_615_820_800  # vLLM keeps the unpadded 152,064 rows


def _run(*overrides, config_name=None):
    return validate(load_config(list(overrides), config_name=config_name), cuda_available=GPU)


def test_7b_8gpu_preset_plan_by_hand():
    run = _run("preset=7b_8gpu")
    plan = estimate(run, resolve("Qwen2.5-7B"), 80 * GiB, overhead_bytes=3 * GiB)
    train = plan.phases["train_actor"].parts
    assert (train["actor_params"], train["actor_grads"], train["actor_optimizer"]) == (
        7_615_820_800, 15_231_641_600, 11_423_731_200)
    # micro-batch 4 x 1024 tokens = 4096 tokens; per layer and token (bytes): 2*(4*3584/2 + (2*3584+2*512)/2
    # + 5*18944/2) + 4*28/2 = 117,304; x4096 x28 layers = 13,453,361,152; logits 4096 * 152,064/2 * (2+4+4).
    assert train["activations"] == 117_304 * 4096 * 28 + 4096 * 76_032 * 10
    # the critic (PPO default) and the sleeping vLLM are offloaded/asleep while the actor trains
    assert train["critic_params"] == train["critic_optimizer"] == train["rollout_kv_cache"] == 0
    rollout = plan.phases["rollout"].parts
    assert rollout["actor_params"] == rollout["actor_optimizer"] == rollout["critic_grads"] == 0
    vllm = rollout["rollout_weights"] + rollout["rollout_activations"] + rollout["rollout_kv_cache"]
    assert vllm == int(0.5 * 80 * GiB)  # vLLM's share is gpu_memory_utilization of the card
    assert plan.kv_cache.tokens == rollout["rollout_kv_cache"] // 28_672
    assert plan.phases["rollout"].total == vllm + 3 * GiB


def test_offload_flags_decide_what_stays_during_rollout():
    flags = [f"actor_rollout_ref.actor.megatron.{k}=false" for k in ("param_offload", "grad_offload", "optimizer_offload")]
    run = _run("preset=7b_8gpu", *flags, "critic.megatron.grad_offload=false",
               "actor_rollout_ref.actor.megatron.use_distributed_optimizer=false")
    rollout = estimate(run, resolve("Qwen2.5-7B"), 80 * GiB).phases["rollout"].parts
    # the weight sync always releases the actor's grads; params and optimizer state follow their offload flags
    assert rollout["actor_params"] == 7_615_820_800 and rollout["actor_grads"] == 0
    assert rollout["actor_optimizer"] == 12 * 3_807_910_400
    offloaded = _run("preset=7b_8gpu", "critic.megatron.grad_offload=false")
    assert estimate(offloaded, resolve("Qwen2.5-7B"), 80 * GiB).phases["rollout"].parts["actor_optimizer"] == 0
    assert rollout["critic_grads"] > 0 and rollout["critic_params"] == 0  # the critic follows its own flags
    train = estimate(run, resolve("Qwen2.5-7B"), 80 * GiB).phases["train_actor"].parts
    assert train["actor_optimizer"] == 12 * 3_807_910_400  # not sharded over dp


def test_pipeline_in_flight_and_recompute_by_hand():
    """7b_8gpu_tp2pp2: 14 layers a stage, training micro-batches of 2 x 1024 tokens, log-prob passes of 4 x 1024."""
    shape = resolve("Qwen2.5-7B")
    layer = 117_304 * 2048  # A_layer for 2048 tokens (see test_7b_8gpu_preset_plan_by_hand)
    train = estimate(_run("preset=7b_8gpu_tp2pp2"), shape, 80 * GiB).phases["train_actor"]
    # 1F1B: stage 0 holds pp=2 micro-batches in flight; stage 1 holds one plus the logits
    assert train.stage == 0 and train.parts["activations"] == 14 * 2 * layer

    recompute = _run("preset=7b_8gpu_tp2pp2", "actor_rollout_ref.model.enable_gradient_checkpointing=true")
    phase = estimate(recompute, shape, 80 * GiB).phases["train_actor"]
    kept = 2048 * 2 * 3584 // 2  # a recomputed layer keeps its input (bf16, split over tp by sequence parallelism)
    train_last = 14 * kept + layer + 2048 * 76_032 * 10
    forward_last = 117_304 * 4096 + 4096 * 76_032 * 6  # one layer + bf16 logits and fp32 log-softmax, no grad
    assert phase.stage == 1 and phase.parts["activations"] == max(train_last, forward_last)


# ------------------------------------------------------------------------------------------ mixture of experts
@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "Qwen3-235B-A22B"])
def test_moe_shape_counts_what_transformers_builds(name):
    """Total parameters of the table's config, counted by transformers itself (meta device, no weights), and the
    parameters one token runs through (all but the experts it is not routed to)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from hybridrl.plan.model_shape import KNOWN_CONFIGS

    shape = resolve(name)
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{k: v for k, v in KNOWN_CONFIGS[name].items() if k != "model_type"}))
    assert shape.params == sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert shape.expert_params == experts
    assert shape.active_params == shape.params - experts + experts * shape.moe_topk // shape.num_experts
    assert {"Qwen3-30B-A3B": 3.35e9, "Qwen3-235B-A22B": 22.19e9}[name] == pytest.approx(shape.active_params, rel=1e-3)


def test_moe_stage_params_and_expert_optimizer_sharding_by_hand():
    """Qwen3-30B-A3B at tp=2, ep=8, etp=1 on 8 GPUs (dp=4, expert dp=1), bf16, distributed optimizer.
    Per layer: attention 2048*(4096+2*512) + 4096*2048 = 18,874,368 over tp=2; norms 2*2048 + q/k norms 2*128 and
    the router 128*2048 = 262,144 whole; experts 128*3*2048*768 = 603,979,776 over ep*etp = 8."""
    from hybridrl.plan.memory import stage_expert_params

    shape = resolve("Qwen3-30B-A3B")
    experts = stage_expert_params(shape, pp=1, ep=8, etp=1)
    assert experts == 48 * 603_979_776 // 8
    vocab = padded_vocab(151936, 2) // 2 * 2048
    dense = 48 * (18_874_368 // 2 + 4096 + 256 + 262_144) + 2 * vocab + 2048
    assert stage_params(shape, tp=2, pp=1, stage=0, ep=8, etp=1) == dense + experts
    run = validate(load_config(["trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                                "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8",
                                "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"], config_name="grpo_trainer"),
                   cuda_available=GPU)
    parts = estimate(run, shape, 141 * GiB).phases["train_actor"].parts
    # Adam (8) + fp32 master (4) bytes per param: the dense part over dp=4, the experts over expert dp=1
    assert parts["actor_optimizer"] == -(-dense * 12 // 4) + experts * 12
    assert parts["actor_params"] == 2 * (dense + experts) and parts["actor_grads"] == 4 * (dense + experts)


def test_rollout_expert_parallel_is_refused_where_the_experts_do_not_split_into_whole_blocks():
    """rollout.expert_parallel_size = tp_g gives each vLLM rank num_experts / tp_g whole experts: the same bytes as
    tensor-parallel experts (memory unchanged), refused on a dense model or where tp_g does not divide the experts."""
    from hybridrl.plan.checks import shape_problems

    moe = ["trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
           "actor_rollout_ref.rollout.tensor_model_parallel_size=8"]
    whole = validate(load_config(moe + ["actor_rollout_ref.rollout.expert_parallel_size=8"], config_name="grpo_trainer"),
                     cuda_available=GPU)
    split = validate(load_config(moe, config_name="grpo_trainer"), cuda_available=GPU)
    shape = resolve("Qwen3-30B-A3B")
    assert not shape_problems(whole, shape)
    assert estimate(whole, shape, 141 * GiB).phases["rollout"].parts == estimate(split, shape, 141 * GiB).phases[
        "rollout"].parts
    odd = dataclasses.replace(shape, num_experts=124)
    assert [p.knob for p in shape_problems(whole, odd)] == ["actor_rollout_ref.rollout.expert_parallel_size"]
    assert "actor_rollout_ref.rollout.expert_parallel_size" in [p.knob for p in shape_problems(whole, resolve(
        "Qwen2.5-7B"))]  # a dense model (whose 28 heads refuse tp_g 8 as well)


def test_split_placement_plans_the_rollout_gpu_and_the_training_gpus_apart():
    colocated = estimate(_run("preset=7b_8gpu"), resolve("Qwen2.5-7B"), 80 * GiB, overhead_bytes=3 * GiB)
    split = estimate(_run("preset=7b_8gpu", "actor_rollout_ref.hybrid_engine=false",
                          "actor_rollout_ref.rollout.n_gpus_per_node=8", "trainer.n_gpus_per_node=8"),
                     resolve("Qwen2.5-7B"), 80 * GiB, overhead_bytes=3 * GiB)
    engine = ("rollout_weights", "rollout_activations", "rollout_kv_cache")
    rollout = split.phases["rollout"].parts
    # the rollout's own GPU holds the engine and nothing of the training roles
    assert {k: v for k, v in rollout.items() if v} == {**{k: colocated.phases["rollout"].parts[k] for k in engine},
                                                        "overhead": 3 * GiB}
    # the training GPUs never hold the engine; their training state is what the colocated plan has
    train = split.phases["train_actor"].parts
    assert all(train[k] == 0 for k in engine)
    assert {k: v for k, v in train.items() if k not in engine} == \
        {k: v for k, v in colocated.phases["train_actor"].parts.items() if k not in engine}


def test_reference_pass_is_its_own_phase_by_hand():
    """The reference's log-prob pass: its weights (with ref param_offload, back for the pass) beside the actor's
    params and grads (restored after generation; its optimizer state comes back at the update's first step): params
    + grads + the reference + one forward pass."""
    shape = resolve("Qwen2.5-7B")
    run = validate(load_config(["preset=7b_8gpu", "actor_rollout_ref.ref.megatron.param_offload=true"],
                               config_name="grpo_trainer"), cuda_available=GPU)
    plan = estimate(run, shape, 80 * GiB, overhead_bytes=3 * GiB)
    ref = plan.phases["ref_log_prob"].parts
    assert (ref["actor_params"], ref["actor_grads"], ref["actor_optimizer"]) == (7_615_820_800, 15_231_641_600, 0)
    assert ref["ref_params"] == 7_615_820_800  # the same bf16 shard as the actor's (tp=2)
    # forward micro-batch 8 x 1024 tokens: one layer's activations + bf16 logits and their fp32 log-softmax
    assert ref["activations"] == 117_304 * 8192 + 8192 * 76_032 * 6
    assert plan.phases["ref_log_prob"].total == sum(ref.values())
    assert plan.phases["train_actor"].parts["ref_params"] == 0  # offloaded while the actor trains
    kept = validate(load_config(["preset=7b_8gpu", "actor_rollout_ref.ref.megatron.param_offload=false"],
                                config_name="grpo_trainer"), cuda_available=GPU)
    kept_plan = estimate(kept, shape, 80 * GiB)
    assert kept_plan.phases["train_actor"].parts["ref_params"] == 7_615_820_800
    # a resident reference's pass is planned too (memory/ref_peak_bytes is measured against it): the same parts,
    # never above train_actor, which counts the reference and the larger activations
    kept_ref = kept_plan.phases["ref_log_prob"].parts
    assert kept_ref == ref
    assert kept_plan.phases["ref_log_prob"].total <= kept_plan.phases["train_actor"].total


def test_optimizer_state_comes_back_for_the_step_only_by_hand():
    """Hybrid engine, one optimizer step per update: the forward/backward runs without the optimizer state (still on
    the host) and the step holds the whole state plus, with bf16 grads, their fp32 copies (P * 4 / S). With two
    mini-batches, or a split placement, the state is on the GPU during forward/backward too."""
    shape = resolve("Qwen2.5-7B")
    one = ["preset=7b_8gpu", "data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
           "+actor_rollout_ref.actor.megatron.override_ddp_config.grad_reduce_in_fp32=false"]
    run = validate(load_config(one, config_name="grpo_trainer"), cuda_available=GPU)
    assert run.derived.actor_batch.optimizer_steps_per_step == 1
    plan = estimate(run, shape, 80 * GiB, overhead_bytes=3 * GiB)
    a = run.derived.actor
    p = 7_615_820_800 // 2  # the bf16 shard of tp=2 is 7_615_820_800 bytes: p parameters
    shards = a.dp * a.cp
    train, step = plan.phases["train_actor"].parts, plan.phases["actor_step"].parts
    assert (train["actor_params"], train["actor_grads"], train["actor_optimizer"]) == (2 * p, 2 * p, 0)
    assert train["optimizer_step"] == 0 and train["activations"] > 0
    assert (step["actor_params"], step["actor_grads"], step["actor_optimizer"]) == (2 * p, 2 * p, -(-12 * p // shards))
    assert step["optimizer_step"] == -(-4 * p // shards) and step["activations"] == 0
    assert plan.phases["actor_step"].total == sum(step.values())
    two = validate(load_config(one[:2] + ["actor_rollout_ref.actor.ppo_mini_batch_size=32"] + one[3:],
                               config_name="grpo_trainer"), cuda_available=GPU)
    assert two.derived.actor_batch.optimizer_steps_per_step == 2
    assert estimate(two, shape, 80 * GiB).phases["train_actor"].parts["actor_optimizer"] == -(-12 * p // shards)
    fp32 = validate(load_config(one[:3], config_name="grpo_trainer"), cuda_available=GPU)
    fp32_step = estimate(fp32, shape, 80 * GiB).phases["actor_step"].parts
    assert fp32_step["optimizer_step"] == 0 and fp32_step["actor_grads"] == 4 * p  # the fp32 grads are Adam's own


def test_critic_step_holds_the_critics_state_and_its_grad_copies():
    """PPO with GAE: the critic's optimizer step is a phase of its own, like the actor's: whole state, no activations,
    the fp32 copies of bf16 grads; the actor is idle then (its grads and optimizer state as its flags say)."""
    shape = resolve("Qwen2.5-7B")
    args = ["preset=7b_8gpu", "algorithm.adv_estimator=gae", "+critic.megatron.override_ddp_config.grad_reduce_in_fp32=false"]
    run = validate(load_config(args, config_name="ppo_trainer"), cuda_available=GPU)
    plan = estimate(run, shape, 80 * GiB)
    step, train = plan.phases["critic_step"].parts, plan.phases["train_critic"].parts
    assert step["activations"] == 0 and train["activations"] > 0
    assert (step["critic_params"], step["critic_grads"], step["critic_optimizer"]) == \
        (train["critic_params"], train["critic_grads"], train["critic_optimizer"])
    assert step["optimizer_step"] == step["critic_optimizer"] // 3  # 4 of the 12 bytes a parameter, same shards
    fp32 = validate(load_config(args[:2], config_name="ppo_trainer"), cuda_available=GPU)
    assert estimate(fp32, shape, 80 * GiB).phases["critic_step"].parts["optimizer_step"] == 0
    grpo = _run("preset=7b_8gpu", config_name="grpo_trainer")
    assert estimate(grpo, shape, 80 * GiB).phases["critic_step"] is None  # no critic


# ------------------------------------------------------------------------------------------ LoRA
def test_lora_adapter_count_is_what_peft_adds():
    """tp=1: the adapters the plan counts are the parameters peft adds to the same transformers model (meta device)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hybridrl.plan.memory import stage_lora_params
    from hybridrl.plan.model_shape import KNOWN_CONFIGS

    peft = pytest.importorskip("peft")
    targets = ("q_proj", "v_proj", "o_proj", "down_proj")
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**{k: v for k, v in KNOWN_CONFIGS["Qwen2.5-0.5B"].items()
                                                if k != "model_type"}))
        model = peft.get_peft_model(model, peft.LoraConfig(r=16, target_modules=list(targets)))
    added = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert stage_lora_params(resolve("Qwen2.5-0.5B"), 16, targets, tp=1, pp=1) == added


def test_lora_plan_freezes_the_base_and_has_no_reference_by_hand():
    """7b_8gpu (tp=2, dp=4, distributed optimizer) with rank-32 adapters on all seven modules: per layer and GPU
    q, o: 32 * (3584 + 1792); k, v: 32 * (3584 + 256); gate, up, down: 32 * (3584 + 9472) -> 1,843,200 x 28 layers
    = 51,609,600 adapter parameters. Grads (fp32) and Adam + fp32 master state (12 bytes, / dp) are the adapters'
    only; the base keeps its bf16 params; the reference (the actor with adapters off) has no weights of its own."""
    n = 51_609_600
    run = validate(load_config(["preset=7b_8gpu", "actor_rollout_ref.model.lora_rank=32",
                                "actor_rollout_ref.actor.megatron.transformer_impl=local",
                                "actor_rollout_ref.ref.megatron.param_offload=true"], config_name="grpo_trainer"),
                   cuda_available=GPU)
    plan = estimate(run, resolve("Qwen2.5-7B"), 80 * GiB, overhead_bytes=3 * GiB)
    train = plan.phases["train_actor"].parts
    assert train["actor_params"] == 7_615_820_800 + 2 * n
    assert train["actor_grads"] == 4 * n
    assert plan.phases["actor_step"].parts["actor_optimizer"] == 12 * n // 4
    assert plan.phases["ref_log_prob"] is None and train["ref_params"] == 0


ONE_H200 = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.actor.use_dynamic_bsz=true",
            "actor_rollout_ref.ref.megatron.param_offload=true", "actor_rollout_ref.actor.megatron.optimizer_offload=true",
            "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=16", "data.max_prompt_length=256",
            "data.max_response_length=512"]


def test_optimizer_state_coming_back_during_the_forward_backward_by_hand():
    """Qwen2.5-7B on one H200 (139.8 GiB), GRPO, the optimizer state on the host until its step, packed 8192-token
    micro-batches without recompute (the speed7b bench's shape). P = 7,615,616,512 params (tp=1, no vocab padding).
    train_actor: 2P bf16 params + 4P fp32 grads + activations + 3 GiB; activations per layer and token
    2*(4*3584 + 2*3584 + 2*512 + 5*18944) + 4*28 = 234,608 bytes, x8192 tokens x28 layers, plus the logits
    8192 * 152,064 * (2+4+4). train_actor_onload adds the part of the 12P bytes of Adam state that fits in the GPU
    less train_actor less the margin (2 GiB + a tenth of the activations); the runtime keeps activations + margin
    free (actor_onload_reserve)."""
    from hybridrl.plan.estimate import actor_onload_reserve

    shape, gpu, P = resolve("Qwen2.5-7B"), int(139.8 * GiB), 7_615_616_512
    run = _run(*ONE_H200, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192", config_name="grpo_trainer")
    act = 234_608 * 8192 * 28 + 8192 * 152_064 * 10
    train = 2 * P + 4 * P + act + 3 * GiB
    margin = 2 * GiB + act // 10
    plan = estimate(run, shape, gpu, overhead_bytes=3 * GiB)
    assert plan.phases["train_actor"].total == train and plan.phases["train_actor"].parts["actor_optimizer"] == 0
    onload = plan.phases["train_actor_onload"]
    assert 0 < gpu - train - margin < 12 * P  # only part of the state fits beside these activations
    assert onload.parts["actor_optimizer"] == gpu - train - margin and onload.total == gpu - margin
    assert plan.phases["actor_step"].parts["actor_optimizer"] == 12 * P  # the step holds all of it, as before
    assert actor_onload_reserve(run, shape) == act + margin
    assert any("comes back from the host during the forward/backward" in n for n in plan.notes)
    # 512-token micro-batches: every byte of the state comes back beside the forward/backward. The phase counts the
    # update's activations, not the larger ones of the 8192-token log-prob passes that train_actor folds in.
    small = _run(*ONE_H200, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=512", "data.max_prompt_length=128",
                 "data.max_response_length=256", "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=8192",
                 config_name="grpo_trainer")
    act = 234_608 * 512 * 28 + 512 * 152_064 * 10
    phases = estimate(small, shape, gpu, overhead_bytes=3 * GiB).phases
    assert phases["train_actor"].parts["activations"] == 234_608 * 8192 + 8192 * 152_064 * 6  # the forward pass
    assert phases["train_actor_onload"].parts["actor_optimizer"] == 12 * P
    assert phases["train_actor_onload"].total == 18 * P + act + 3 * GiB
    # no phase where the state is not deferred: resident through the update (optimizer_offload=false), or
    # counted in train_actor already (two optimizer steps per update)
    kept = _run(*ONE_H200, "actor_rollout_ref.actor.megatron.optimizer_offload=false", config_name="grpo_trainer")
    two = _run(*ONE_H200, "actor_rollout_ref.actor.ppo_mini_batch_size=8", config_name="grpo_trainer")
    assert estimate(kept, shape, gpu).phases["train_actor_onload"] is None
    assert estimate(two, shape, gpu).phases["train_actor_onload"] is None
    # the overlap turned off: the state comes back after the backward, so no phase holds it beside the activations
    serial = _run(*ONE_H200, "actor_rollout_ref.actor.megatron.optimizer_onload_overlap=false", config_name="grpo_trainer")
    assert estimate(serial, shape, gpu).phases["train_actor_onload"] is None
    assert estimate(serial, shape, gpu).phases["actor_step"].parts["actor_optimizer"] == 12 * P


# the lora_7b_lora row of benchmarks/runs.py (rows_one_gpu.lora_7b): Qwen2.5-7B, one GPU, rank-32 adapters on all seven
# modules, vLLM at tp_g 1
LORA_7B_ONE_GPU = [
    "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "data.max_prompt_length=64",
    "data.max_response_length=256", "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.model.use_remove_padding=true",
    "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
    "actor_rollout_ref.model.enable_gradient_checkpointing=true", "actor_rollout_ref.actor.use_kl_loss=false",
    "actor_rollout_ref.actor.megatron.transformer_impl=local", "actor_rollout_ref.ref.megatron.transformer_impl=local",
    "actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.model.lora_alpha=32"]


def test_lora_base_kept_on_the_gpu_is_counted_in_every_phase_by_hand():
    """The engine's weights W: the base at tp_g 1, 2 x 7,615,616,512 bytes, plus vLLM's LoRA slots at max_lora_rank
    32, per layer 32 * (q 3584+3584, k 3584+512, v 3584+512, o 3584+3584, gate 3584+18944, up 3584+18944,
    down 18944+3584) = 2,883,584 params, x28 layers x2 bytes = 161,480,704 (the 161 MB of adapters the 7B row syncs).
    Kept resident (true, or auto where it fits): W in every phase, the training phases W above the plan with the base
    in host memory (false), the rollout phase unchanged; auto falls back to false where a phase would not fit."""
    shape = resolve("Qwen2.5-7B")
    w = 2 * 7_615_616_512 + 28 * 2_883_584 * 2

    def plan(mode, gpu_gib=80, util=0.3):
        run = _run(*LORA_7B_ONE_GPU, f"actor_rollout_ref.rollout.lora_base_resident={mode}",
                   f"actor_rollout_ref.rollout.gpu_memory_utilization={util}", config_name="grpo_trainer")
        return estimate(run, shape, gpu_gib * GiB, overhead_bytes=3 * GiB)

    kept, off = plan("true"), plan("false")
    assert kept.rollout_base_resident and not off.rollout_base_resident
    assert kept.phases["rollout"].parts == off.phases["rollout"].parts and off.phases["rollout"].parts["rollout_weights"] == w
    for name in ("train_actor", "actor_step"):
        assert kept.phases[name].parts["rollout_weights"] == w and off.phases[name].parts["rollout_weights"] == 0
        assert kept.phases[name].total == off.phases[name].total + w, name
        assert kept.phases[name].parts["rollout_kv_cache"] == kept.phases[name].parts["rollout_activations"] == 0
    assert any("keeps its base (14.3 GiB)" in n for n in kept.notes)
    auto = plan("auto")
    assert auto.rollout_base_resident and auto.phases == kept.phases  # 80 GiB: every phase fits with it
    # 40 GiB at util 0.45: the rollout (the actor's 14.3 GiB + 18 GiB of vLLM + 3) fits, training with W beside it not
    small_kept, small = plan("true", 40, 0.45), plan("auto", 40, 0.45)
    assert small_kept.phases["train_actor"].total > 40 * GiB >= max(p.total for p in small.phases.values() if p)
    assert not small.rollout_base_resident and small.phases == plan("false", 40, 0.45).phases
    assert any("goes to host memory" in n and "train_actor would need" in n for n in small.notes)


def test_a_resident_base_that_does_not_fit_names_the_key():
    from hybridrl.plan import fit_problems

    run = _run(*LORA_7B_ONE_GPU, "actor_rollout_ref.rollout.lora_base_resident=true",
               "actor_rollout_ref.rollout.gpu_memory_utilization=0.45", config_name="grpo_trainer")
    problems = fit_problems(estimate(run, resolve("Qwen2.5-7B"), 40 * GiB), run, resolve("Qwen2.5-7B"))
    assert problems and problems[0].knob == "actor_rollout_ref.rollout.lora_base_resident"
    assert "lora_base_resident=false" in problems[0].message


def test_lora_base_resident_applies_to_the_adapter_sync_only():
    from hybridrl.config import ConfigError

    merged = _run(*LORA_7B_ONE_GPU, "actor_rollout_ref.model.lora.merge=true", config_name="grpo_trainer")
    assert not estimate(merged, resolve("Qwen2.5-7B"), 80 * GiB).rollout_base_resident  # full weights: level 2 sleep
    awake = _run(*LORA_7B_ONE_GPU, "actor_rollout_ref.rollout.free_cache_engine=false", config_name="grpo_trainer")
    assert not estimate(awake, resolve("Qwen2.5-7B"), 80 * GiB).rollout_base_resident  # never asleep: all of it stays
    with pytest.raises(ConfigError, match="lora_base_resident=true keeps a LoRA base"):
        _run(*LORA_7B_ONE_GPU, "actor_rollout_ref.model.lora.merge=true",
             "actor_rollout_ref.rollout.lora_base_resident=true", config_name="grpo_trainer")
    with pytest.raises(ConfigError, match="use auto, true or false"):
        _run(*LORA_7B_ONE_GPU, "actor_rollout_ref.rollout.lora_base_resident=sometimes", config_name="grpo_trainer")


def test_the_worker_resolves_auto_as_the_plan_does(monkeypatch):
    """hybridrl.workers.common.lora_base_resident: the plan on the device's memory (from the model's config), the
    key's value when set, and never on CPU (the torch engine keeps its weights anyway)."""
    import torch
    from transformers import Qwen2Config

    from hybridrl.plan.model_shape import KNOWN_CONFIGS
    from hybridrl.workers.common import lora_base_resident

    hf = Qwen2Config(**{k: v for k, v in KNOWN_CONFIGS["Qwen2.5-7B"].items() if k != "model_type"})
    cuda = torch.device("cuda", 0)
    memory = {"bytes": 80 * GiB}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: type("P", (), {"total_memory": memory["bytes"]}))
    run = _run(*LORA_7B_ONE_GPU, "actor_rollout_ref.rollout.gpu_memory_utilization=0.45", config_name="grpo_trainer")
    assert lora_base_resident(run, hf, cuda) and not lora_base_resident(run, hf, torch.device("cpu"))
    memory["bytes"] = 40 * GiB  # the plan's small case above: kept, training would not fit
    assert not lora_base_resident(run, hf, cuda)
    forced = _run(*LORA_7B_ONE_GPU, "actor_rollout_ref.rollout.lora_base_resident=true", config_name="grpo_trainer")
    assert lora_base_resident(forced, hf, cuda)
