"""`hybridrl plan`: JSON keys, and refusals that name the knob to turn."""
from __future__ import annotations

import json

import pytest

from hybridrl.__main__ import main as hybridrl_main
from hybridrl.plan.cli import main
from hybridrl.plan.memory import COMPONENTS
from hybridrl.plan.report import KEYS

ARA = "actor_rollout_ref"
TP = f"{ARA}.actor.megatron.tensor_model_parallel_size"
PP = f"{ARA}.actor.megatron.pipeline_model_parallel_size"


def plan_json(capsys, *argv):
    code = main([*argv, "--json"])
    out = json.loads(capsys.readouterr().out)
    return code, out


def refused(capsys, *argv):
    code, out = plan_json(capsys, *argv)
    assert code == 2 and out["ok"] is False and out["problems"], out
    return out["problems"]


def test_json_keys_are_stable(capsys):
    code, out = plan_json(capsys, "preset=7b_8gpu", "--model-config", "Qwen2.5-7B")
    assert code == 0 and out["ok"] is True and out["problems"] == []
    assert tuple(out) == KEYS and out["format"] == "hybridrl.plan/1"
    assert set(out["phases"]) == {"train_actor", "train_actor_onload", "actor_step", "train_critic", "critic_step",
                                  "ref_log_prob", "rollout", "reward"}
    assert out["phases"]["ref_log_prob"] is None  # PPO without a KL loss: no reference
    assert out["phases"]["reward"] is None  # no reward model
    for phase in filter(None, out["phases"].values()):
        assert set(phase) == {*COMPONENTS, "total", "stage"}
        assert phase["total"] == sum(phase[c] for c in COMPONENTS)
    assert out["peak"]["bytes"] == max(p["total"] for p in filter(None, out["phases"].values()))
    assert out["layout"]["tp"] == 2 and out["layout"]["dp"] == 4 and out["layout"]["rollout_tp"] == 2
    assert out["model"]["params"] == 7_615_616_512 and out["gpu_memory_bytes"] == 80 * 2**30
    assert set(out["kv_cache"]) == {"bytes", "bytes_per_token", "tokens", "max_model_len", "full_length_sequences"}
    assert "tp=2" in out["summary"]


def test_grpo_has_no_critic_phase(capsys):
    code, out = plan_json(capsys, "--config-name", "grpo_trainer", "preset=7b_8gpu", "--model-config", "Qwen2.5-7B")
    assert code == 0 and out["phases"]["train_critic"] is None and out["layout"]["use_reference"] is True


def test_table_and_dispatcher(capsys):
    assert hybridrl_main(["plan", "--preset", "7b_8gpu", "--model-config", "Qwen2.5-7B", "--gpu-mem-gb", "80"]) == 0
    out = capsys.readouterr().out
    assert "actor layout: tp=2 pp=1" in out and "train_actor" in out and "KV cache" in out and "fits: peak" in out


def test_heads_not_divisible_by_tp(capsys):
    problems = refused(capsys, "preset=7b_8gpu", f"{TP}=8", "--model-config", "Qwen2.5-7B")
    heads = [p for p in problems if "num_attention_heads=28" in p["message"]]
    assert heads and heads[0]["knob"] == TP and "1, 2, 4" in heads[0]["message"]


def test_kv_heads_not_divisible_by_tp(capsys):
    problems = refused(capsys, "preset=0.5b_1gpu", "trainer.n_gpus_per_node=7", f"{TP}=7",
                       "--model-config", "Qwen2.5-0.5B")  # 14 heads divide by 7, 2 KV heads do not
    kv = [p for p in problems if "num_key_value_heads=2" in p["message"]]
    assert kv and kv[0]["knob"] == TP


def test_layers_not_divisible_by_pp(capsys):
    problems = refused(capsys, "preset=7b_8gpu_tp2pp2", "trainer.n_gpus_per_node=12", f"{PP}=3",
                       "--model-config", "Qwen2.5-7B")
    assert problems[0]["knob"] == PP and "num_hidden_layers=28" in problems[0]["message"]


def test_virtual_stages_must_divide_the_layers(capsys):
    vpp = f"{ARA}.actor.megatron.virtual_pipeline_model_parallel_size"
    problems = refused(capsys, "preset=7b_8gpu_tp2pp2", f"{vpp}=4", "--model-config", "Qwen2.5-7B")
    assert problems[0]["knob"] == vpp and "num_hidden_layers=28" in problems[0]["message"]
    code, out = plan_json(capsys, "preset=7b_8gpu_tp2pp2", f"{vpp}=2", "--model-config", "Qwen2.5-7B")
    assert code == 0 and out["ok"] is True  # 28 layers = 2 stages * 2 virtual stages * 7


def test_world_not_divisible_by_model_parallel_size(capsys):
    problems = refused(capsys, "preset=7b_8gpu_tp2pp2", f"{PP}=3", "--model-config", "Qwen2.5-7B")
    assert "tp*pp*cp = 2*3*1 = 6 does not divide the 8 ranks" in problems[0]["message"]


def test_odd_vocab_is_padded_not_refused(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1001}))
    code, out = plan_json(capsys, "preset=7b_8gpu", "--model-config", str(tmp_path))
    assert code == 0 and out["model"]["vocab_size"] == 1001  # the adapter pads it to 1024 (lcm(64, tp) rows)


def test_rollout_tp_must_split_heads(capsys):
    knob = f"{ARA}.rollout.tensor_model_parallel_size"
    problems = refused(capsys, "preset=7b_8gpu", f"{knob}=8", "--model-config", "Qwen2.5-7B")
    assert [p["knob"] for p in problems] == [knob]


def test_training_does_not_fit(capsys):
    problems = refused(capsys, "preset=7b_8gpu", f"{TP}=1", f"{ARA}.actor.megatron.use_distributed_optimizer=false",
                       "--model-config", "Qwen2.5-7B")
    assert problems[0]["knob"] == f"{ARA}.actor.megatron.use_distributed_optimizer"
    msg = problems[0]["message"]
    assert "does not fit: the train_actor phase" in msg and "enable_gradient_checkpointing=true" in msg
    assert f"a larger {TP}" in msg


SEVEN_B_ONE_GPU = ["--config-name", "grpo_trainer", "trainer.n_gpus_per_node=1", f"{ARA}.rollout.tensor_model_parallel_size=1",
                   f"{ARA}.model.use_remove_padding=true", f"{ARA}.actor.use_dynamic_bsz=true",
                   f"{ARA}.actor.ppo_max_token_len_per_gpu=4096", f"{ARA}.model.enable_gradient_checkpointing=true",
                   f"{ARA}.ref.megatron.param_offload=true", f"{ARA}.actor.megatron.optimizer_offload=true",
                   "data.train_batch_size=16",
                   f"{ARA}.actor.ppo_mini_batch_size=16", "data.max_prompt_length=64", "data.max_response_length=256",
                   "--model-config", "Qwen2.5-7B", "--gpu-mem-gb"]


def test_seven_b_on_one_h200_fits_with_fp32_grads_only(capsys):
    """The scale curve's 7B row on one H200 (139.8 GiB as torch reports it). With bf16 grads the optimizer step holds
    their fp32 copies beside the whole Adam state (it ran out of memory there, 2026-11-25): refused at actor_step,
    and fp32 grads are the fix. With them it fits, the reference included: the optimizer state stays on the host
    through the log-prob passes, and comes back beside the forward/backward (train_actor_onload): with full recompute
    and 4096-token micro-batches nearly all of it fits there, which makes that phase the peak."""
    bf16 = f"+{ARA}.actor.megatron.override_ddp_config.grad_reduce_in_fp32=false"
    problems = refused(capsys, *SEVEN_B_ONE_GPU, "139.8", bf16)
    assert len(problems) == 1 and "the actor_step phase needs 144.9 GiB" in problems[0]["message"]
    assert problems[0]["knob"] == f"+{ARA}.actor.megatron.override_ddp_config.grad_reduce_in_fp32"
    code, out = plan_json(capsys, *SEVEN_B_ONE_GPU, "139.8")
    phases = out["phases"]
    assert code == 0 and round(phases["actor_step"]["total"] / 2**30, 1) == 130.7
    assert phases["ref_log_prob"]["actor_optimizer"] == phases["train_actor"]["actor_optimizer"] == 0
    onload, whole = phases["train_actor_onload"]["actor_optimizer"], phases["actor_step"]["actor_optimizer"]
    assert 0.98 * whole < onload < whole
    assert phases["train_actor_onload"]["total"] == phases["train_actor"]["total"] + onload
    assert out["peak"]["phase"] == "train_actor_onload" and out["peak"]["bytes"] < 139.8 * 2**30


def test_reference_pass_does_not_fit(capsys):
    """The reference's pass with 96k-token forward micro-batches: its logits do not fit beside the reference's
    weights; the fixes name its micro-batch and dropping the reference, not its offload (already on)."""
    big = [f"{ARA}.rollout.log_prob_max_token_len_per_gpu=98304", f"{ARA}.ref.log_prob_max_token_len_per_gpu=98304"]
    problems = refused(capsys, *SEVEN_B_ONE_GPU, "155", *big)
    assert len(problems) == 1 and "the ref_log_prob phase needs 164.8 GiB" in problems[0]["message"]
    assert problems[0]["knob"] == f"{ARA}.ref.log_prob_max_token_len_per_gpu"  # frees the most: half the logits
    assert f"no reference: {ARA}.actor.use_kl_loss=false" in problems[0]["message"]
    assert "ref.megatron.param_offload=true (" not in problems[0]["message"]  # already on: not offered
    code, out = plan_json(capsys, *SEVEN_B_ONE_GPU, "170", *big)
    assert code == 0 and out["peak"]["phase"] == "ref_log_prob"
    # a resident reference: its pass is planned (no larger than train_actor), the refusal is train_actor's alone
    kept = [a.replace(f"{ARA}.ref.megatron.param_offload=true", f"{ARA}.ref.megatron.param_offload=false")
            for a in SEVEN_B_ONE_GPU]
    problems = refused(capsys, *kept, "155", *big)
    assert len(problems) == 1 and "the train_actor phase needs" in problems[0]["message"], problems
    code, out = plan_json(capsys, *kept, "400", *big)
    phases = out["phases"]
    assert code == 0 and phases["ref_log_prob"]["total"] <= phases["train_actor"]["total"]
    assert out["peak"]["phase"] != "ref_log_prob"


def test_rollout_does_not_fit(capsys):
    flags = [f"{ARA}.actor.megatron.{k}=false" for k in ("param_offload", "grad_offload", "optimizer_offload")]
    problems = refused(capsys, "preset=7b_8gpu", *flags, f"{ARA}.rollout.gpu_memory_utilization=0.9",
                       "--model-config", "Qwen2.5-7B")
    # the grads leave anyway; with optimizer_offload=false the optimizer state (45.7 GB a GPU) stays: the most to free
    assert problems[0]["knob"] == f"{ARA}.actor.megatron.optimizer_offload"
    assert "the rollout phase" in problems[0]["message"] and "gpu_memory_utilization (now 0.9" in problems[0]["message"]


def test_kv_cache_too_small(capsys):
    problems = refused(capsys, "preset=7b_8gpu", f"{ARA}.rollout.tensor_model_parallel_size=1",
                       f"{ARA}.rollout.gpu_memory_utilization=0.15", "--model-config", "Qwen2.5-7B")
    assert problems[-1]["knob"] == f"{ARA}.rollout.gpu_memory_utilization" and "KV cache" in problems[-1]["message"]


def test_unknown_model_names_the_option(capsys):
    code = main(["preset=7b_8gpu", f"{ARA}.model.path=/nowhere/my-model"])
    assert code == 2 and "--model-config" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--gpu-mem-gb", "--overhead-gb"])
def test_smaller_gpu_refuses_what_a_larger_one_takes(capsys, flag):
    argv = ["preset=7b_8gpu", "--model-config", "Qwen2.5-7B"]
    assert main(argv) == 0
    capsys.readouterr()
    value = "40" if flag == "--gpu-mem-gb" else "40"
    assert main([*argv, flag, value]) == 2
