"""Config: verl command lines resolve, wrong configs fail naming the key, derived sizes are right."""
import dataclasses
import os
import subprocess
import sys

import pytest

from hybridrl.config import ConfigError, load_config, validate
from hybridrl.config.loader import CONFIG_DIR, defaults_yaml

# verl's quick-start command line (PPO on GSM8K, one GPU), unchanged.
QUICKSTART = """
data.train_files=/data/gsm8k/train.parquet data.val_files=/data/gsm8k/test.parquet
data.train_batch_size=256 data.max_prompt_length=512 data.max_response_length=512
actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 actor_rollout_ref.rollout.tensor_model_parallel_size=1
actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
critic.optim.lr=1e-5 critic.model.path=Qwen/Qwen2.5-0.5B-Instruct critic.ppo_micro_batch_size_per_gpu=4
algorithm.kl_ctrl.kl_coef=0.001 trainer.logger=console trainer.val_before_train=False
trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.save_freq=10 trainer.test_freq=10 trainer.total_epochs=15
""".split()
CPU = lambda: False  # noqa: E731  validation as on a machine without CUDA


def test_quickstart_resolves_with_cfg_job():
    out = subprocess.run(
        [sys.executable, "-m", "hybridrl.trainer.main_ppo", "--cfg", "job", *QUICKSTART],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    import yaml

    tree = yaml.safe_load(out.stdout)
    assert tree["data"]["train_batch_size"] == 256
    assert tree["actor_rollout_ref"]["actor"]["optim"]["lr"] == 1e-6
    assert tree["actor_rollout_ref"]["rollout"]["prompt_length"] == 512
    assert tree["trainer"]["logger"] == ["console"]
    assert tree["trainer"]["default_local_dir"] == "checkpoints/verl_examples/gsm8k"
    assert "grad accumulation 16" in out.stderr


def test_cfg_job_of_a_gpu_job_on_a_machine_without_gpu_prints_and_exits_0():
    """A login node has no GPU: --cfg job resolves a vllm job as the GPU host would and says so; a real run
    of the same command line still stops at validation with the GPU message."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the behaviour on a machine without a GPU")
    cmd = [sys.executable, "-m", "hybridrl.trainer.main_ppo", *QUICKSTART, "actor_rollout_ref.rollout.name=vllm"]
    out = subprocess.run(cmd[:3] + ["--cfg", "job"] + cmd[3:], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "this machine has no GPU" in out.stderr and "rollout.name=vllm needs a GPU" in out.stderr
    assert "device=cuda" in out.stderr and "rollout: vllm" in out.stderr  # derived as on the GPU host
    real = subprocess.run(cmd + ["data.train_files=/nonexistent.parquet"], capture_output=True, text=True, timeout=120)
    assert real.returncode == 2 and "rollout.name=vllm needs a GPU" in real.stderr, real.stderr
    # a mistake that is not about the GPU still fails --cfg job
    bad = subprocess.run(cmd[:3] + ["--cfg", "job"] + cmd[3:] + ["actor_rollout_ref.rollout.n=0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "rollout.n=0 must be >= 1" in bad.stderr


def test_cudagraph_capture_sizes_validated():
    ok = validate(load_config(QUICKSTART + ["actor_rollout_ref.rollout.cudagraph_capture_sizes=[1,8,64]"]),
                  cuda_available=CPU)
    assert ok.cfg.actor_rollout_ref.rollout.cudagraph_capture_sizes == [1, 8, 64]
    for extra, message in ((["actor_rollout_ref.rollout.cudagraph_capture_sizes=[0,8]"], "non-empty list of batch sizes"),
                           (["actor_rollout_ref.rollout.cudagraph_capture_sizes=[8]",
                             "actor_rollout_ref.rollout.enforce_eager=true"], "captures no graphs")):
        with pytest.raises(ConfigError, match=message):
            validate(load_config(QUICKSTART + extra), cuda_available=CPU)


def test_quickstart_derived_sizes():
    run = validate(load_config(QUICKSTART), cuda_available=CPU)
    d = run.derived
    assert (d.world_size, d.actor.tp, d.actor.dp, d.rollout.tp, d.rollout.dp) == (1, 1, 1, 1, 1)
    b = d.actor_batch
    assert (b.samples_per_step, b.mini_batch_samples, b.mini_batches_per_epoch) == (256, 64, 4)
    assert (b.mini_batch_per_dp, b.micro_batch_per_gpu, b.grad_accum, b.forward_micro_batch_per_gpu) == (64, 4, 16, 8)
    assert d.use_critic and not d.use_reference and d.ref_forward_micro_batch_per_gpu == 4
    assert d.actor.dtype == "float32" and d.rollout.engine == "torch"


def test_grpo_layout_derivation_8_gpus():
    cfg = load_config([
        "data.train_batch_size=32", "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.n_gpus_per_node=8",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    ], config_name="grpo_trainer")
    d = validate(cfg, cuda_available=lambda: True).derived
    assert (d.actor.tp, d.actor.pp, d.actor.dp, d.actor.sequence_parallel, d.actor.dtype) == (2, 2, 2, True, "bfloat16")
    assert (d.rollout.engine, d.rollout.tp, d.rollout.dp) == ("vllm", 2, 4)
    b = d.actor_batch
    # 16 prompts x 8 samples = 128 per mini-batch; over dp=2 -> 64 per rank; micro 4 -> 16 accumulation steps
    assert (b.samples_per_step, b.mini_batch_samples, b.mini_batch_per_dp, b.grad_accum) == (256, 128, 64, 16)
    assert not d.use_critic and d.use_reference
    assert cfg.actor_rollout_ref.ref.megatron.tensor_model_parallel_size == 2  # follows the actor


BAD = [
    (["actor_rollout_ref.actor.ppo_micro_batch_size_pergpu=4"], "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    (["actor_rollout_ref.actor.fsdp_config.param_offload=True"], "*.megatron.*"),
    (["data.train_batch_size=100"], "actor_rollout_ref.actor.ppo_mini_batch_size=64 must divide data.train_batch_size=100"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5"], "ppo_micro_batch_size_per_gpu=5 does not divide"),
    (["trainer.n_gpus_per_node=3", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"],
     "actor_rollout_ref.actor.megatron: tp*pp*cp = 2*1*1 = 2 does not divide the 3 ranks"),
    (["algorithm.adv_estimator=grpo"], "actor_rollout_ref.rollout.n >= 2"),
    (["actor_rollout_ref.rollout.tensor_model_parallel_size=2"], "actor_rollout_ref.rollout.tensor_model_parallel_size=2 must divide"),
    (["actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2", "trainer.n_gpus_per_node=2"],
     "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2 differs"),
    (["trainer.logger=[console,tensorbord]"], "did you mean tensorboard"),
    (["data.train_batch_size=abc"], "data.train_batch_size: expects an integer"),
    (["actor_rollout_ref.rollout.name=vllm"], "actor_rollout_ref.rollout.name=vllm needs a GPU"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size=8"], "both set"),
    (["critic.ppo_micro_batch_size_per_gpu=null"], "critic.ppo_micro_batch_size_per_gpu is not set"),
    (["trainer.resume_mode=resume_path"], "trainer.resume_from_path"),
    (["actor_rollout_ref.actor.strategy=fsdp"], "actor_rollout_ref.actor.strategy='fsdp'"),
    (["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100"],
     "ppo_max_token_len_per_gpu=100 is below the longest sequence"),
    (["trainer.n_gpus_per_node=2", "trainer.nnodes=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=4"],
     "a colocated rollout replica must fit in one node; use at most 2"),
    (["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
      "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2", "data.train_batch_size=2",
      "actor_rollout_ref.actor.ppo_mini_batch_size=1", "critic.ppo_micro_batch_size_per_gpu=1",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"],
     "actor_rollout_ref.actor.ppo_mini_batch_size=1: each dp rank gets 1 sample(s) per mini-batch"),
    # exactly pp micro-batches: megatron-core's interleaved schedule deadlocks on them (test_megatron_interleaved.py)
    (["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
      "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2", "data.train_batch_size=2",
      "actor_rollout_ref.actor.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=1",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"],
     "and hangs on exactly 2: at least 4 are needed; raise it to >= 4 or unset "
     "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size"),
    (["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.megatron.context_parallel_size=2"],
     "actor_rollout_ref.actor.megatron.context_parallel_size=2 needs transformer-engine attention: set "
     "actor_rollout_ref.actor.megatron.transformer_impl=transformer_engine on a GPU"),
    (["actor_rollout_ref.actor.megatron.transformer_impl=transformer_engine"],
     "actor_rollout_ref.actor.megatron.transformer_impl=transformer_engine needs a GPU"),
    (["actor_rollout_ref.actor.megatron.transformer_impl=te"], "transformer_impl='te' is not one of"),
    (["+actor_rollout_ref.actor.megatron.override_transformer_config.fp8=e4m3"],
     "override_transformer_config.fp8=e4m3 needs transformer-engine layers"),
    (["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
      "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2"],
     "expert_model_parallel_size * expert_tensor_parallel_size = 2*2 does not divide the 2 ranks of a pipeline stage"),
    (["actor_rollout_ref.actor.megatron.expert_model_parallel_size=0"], "expert_model_parallel_size=0 must be >= 1"),
    (["trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
      "actor_rollout_ref.ref.megatron.expert_model_parallel_size=4"],
     "actor_rollout_ref.ref.megatron.expert_model_parallel_size=4 differs"),
    (["actor_rollout_ref.actor.router_replay.mode=R3"], "set actor_rollout_ref.rollout.enable_rollout_routing_replay=true"),
    (["actor_rollout_ref.actor.router_replay.mode=R2"], "router_replay.mode=R2 (replaying the actor's own"),
    (["actor_rollout_ref.actor.router_replay.mode=R3", "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
      "actor_rollout_ref.model.enable_gradient_checkpointing=true"], "enable_gradient_checkpointing=true is not supported"),
    (["actor_rollout_ref.rollout.enable_rollout_routing_replay=true", "actor_rollout_ref.model.use_remove_padding=true"],
     "enable_rollout_routing_replay=true with actor_rollout_ref.model.use_remove_padding=true is not supported"),
]


@pytest.mark.parametrize("extra,message", BAD, ids=[b[1][:40] for b in BAD])
def test_wrong_configs_name_the_key(extra, message):
    with pytest.raises(ConfigError) as e:
        validate(load_config(QUICKSTART + extra), cuda_available=CPU)
    assert message in str(e.value)


def test_expert_layout_derivation_16_gpus():
    """Qwen3-30B-A3B-style: tp=2 pp=2 on 16 GPUs -> dp=4; experts over ep=8 with etp=1 -> expert dp 1."""
    cfg = load_config(["trainer.n_gpus_per_node=8", "trainer.nnodes=2",
                       "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                       "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                       "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8",
                       "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
                       "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"], config_name="grpo_trainer")
    run = validate(cfg, cuda_available=lambda: True)
    a = run.derived.actor
    assert (a.tp, a.pp, a.dp, a.ep, a.expert_tp, a.expert_dp) == (2, 2, 4, 8, 1, 1)
    assert "ep=8 etp=1 expert_dp=1" in run.summary()
    assert cfg.actor_rollout_ref.ref.megatron.expert_model_parallel_size == 8  # follows the actor


def test_moe_grouped_gemm_and_rollout_expert_parallel_validate_where_they_can_run():
    """Issue 38's 4-GPU layout: ep4 training, vLLM tp_g4 with whole experts per rank; grouped GEMM needs TE."""
    key = "actor_rollout_ref.actor.megatron"
    four = ["trainer.n_gpus_per_node=4", f"{key}.expert_model_parallel_size=4",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=4", "actor_rollout_ref.rollout.expert_parallel_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.device=cuda"]
    gpu = dict(cuda_available=lambda: True, te_available=lambda: True)
    grouped = [f"+{key}.override_transformer_config.moe_grouped_gemm=true"]
    run = validate(load_config(four + grouped, config_name="grpo_trainer"), **gpu)
    assert (run.derived.rollout.tp, run.derived.rollout.ep, run.derived.actor.ep) == (4, 4, 4)
    assert "tp_g=4 dp_g=1 n=5 ep_g=4 (whole experts per rank)" in run.summary()
    with pytest.raises(ConfigError, match=r"moe_grouped_gemm=true runs a mixture of experts' experts as "
                                          r"transformer-engine's grouped GEMM: set actor_rollout_ref\.actor\.megatron"
                                          r"\.transformer_impl=transformer_engine"):
        validate(load_config(four + grouped + [f"{key}.transformer_impl=local"], config_name="grpo_trainer"), **gpu)
    with pytest.raises(ConfigError, match=r"moe_grouped_gemm=true"):  # no TE on the machine
        validate(load_config(four + grouped, config_name="grpo_trainer"), cuda_available=lambda: True,
                 te_available=lambda: False)
    with pytest.raises(ConfigError, match=r"rollout\.expert_parallel_size=2 must be 1 .* or "
                                          r"actor_rollout_ref\.rollout\.tensor_model_parallel_size=4"):
        validate(load_config(four + ["actor_rollout_ref.rollout.expert_parallel_size=2"], config_name="grpo_trainer"),
                 **gpu)
    plain = validate(load_config(four[:-2] + ["actor_rollout_ref.rollout.expert_parallel_size=1",
                                              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"],
                                 config_name="grpo_trainer"), **gpu)
    assert plain.derived.rollout.ep == 1 and "ep_g" not in plain.summary()


def test_list_values_and_scalar_promotion():
    cfg = load_config(["data.train_files=['a.parquet','b.parquet']", "data.val_files=c.parquet", "trainer.logger=console"])
    assert cfg.data.train_files == ["a.parquet", "b.parquet"]
    assert cfg.data.val_files == ["c.parquet"] and cfg.trainer.logger == ["console"]


def test_plus_adds_into_free_dicts_only():
    cfg = load_config(["+actor_rollout_ref.model.override_config.attention_dropout=0.0",
                       "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"])
    assert cfg.actor_rollout_ref.model.override_config == {"attention_dropout": 0.0}
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {"swap_space": 4}
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(["+actor_rollout_ref.actor.not_a_key=1"])
    with pytest.raises(ConfigError, match=r"add it with \+"):
        load_config(["actor_rollout_ref.model.override_config.rope_theta=1"])


def test_links_follow_until_overridden_and_tilde_resets():
    cfg = load_config(["data.max_prompt_length=100"])
    assert cfg.actor_rollout_ref.rollout.prompt_length == 100
    cfg = load_config(["data.max_prompt_length=100", "actor_rollout_ref.rollout.prompt_length=50"])
    assert cfg.actor_rollout_ref.rollout.prompt_length == 50
    cfg = load_config(["data.train_batch_size=8", "~data.train_batch_size"])
    assert cfg.data.train_batch_size == 1024


def test_config_is_frozen():
    cfg = load_config([])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.data.train_batch_size = 3  # type: ignore[misc]


def test_base_yaml_matches_schema():
    with open(os.path.join(CONFIG_DIR, "ppo_trainer.yaml")) as f:
        assert f.read() == defaults_yaml(), "regenerate with: python -m hybridrl.config.dump"


def test_yaml_config_files_compose_and_equal_defaults():
    assert load_config([], config_name="ppo_trainer") == load_config([])
    grpo = load_config([], config_name="grpo_trainer")
    assert grpo.algorithm.adv_estimator == "grpo" and grpo.actor_rollout_ref.rollout.n == 5
    assert grpo.actor_rollout_ref.actor.use_kl_loss


def test_bad_yaml_file_is_named(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("data:\n  train_batch_sise: 3\n")
    with pytest.raises(ConfigError, match=r"mine.yaml: unknown key data.train_batch_sise; did you mean data.train_batch_size"):
        load_config([], config_name="mine", config_path=str(tmp_path))


def test_no_effect_keys_are_reported():
    run = validate(load_config(QUICKSTART + ["actor_rollout_ref.model.use_fused_kernels=True"]), cuda_available=CPU)
    assert any("use_fused_kernels" in n and "no effect" in n for n in run.derived.notes)
    packed = validate(load_config(QUICKSTART + ["actor_rollout_ref.model.use_remove_padding=True"]), cuda_available=CPU)
    assert not any("use_remove_padding" in n for n in packed.derived.notes)  # packs micro-batches now


def test_virtual_pipeline_and_transformer_engine_options_validate_where_they_can_run():
    two = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"]
    run = validate(load_config(QUICKSTART + two + ["actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2"]),
                   cuda_available=CPU)
    assert (run.derived.actor.pp, run.derived.actor.vpp) == (2, 2)
    key = "actor_rollout_ref.actor.megatron"
    gpu = dict(cuda_available=lambda: True, te_available=lambda: True)
    te = [f"{key}.transformer_impl=transformer_engine", f"+{key}.override_transformer_config.fp8=hybrid",
          f"+{key}.override_transformer_config.fp8_recipe=tensorwise", f"{key}.context_parallel_size=2",
          "trainer.n_gpus_per_node=2"]
    run = validate(load_config(QUICKSTART + te), **gpu)
    assert run.derived.actor.cp == 2 and run.cfg.critic.megatron.transformer_impl == "transformer_engine"
    run = validate(load_config(QUICKSTART + te[1:]), **gpu)  # null picks TE where it imports
    with pytest.raises(ConfigError) as e:
        validate(load_config(QUICKSTART + te), cuda_available=lambda: True, te_available=lambda: False)
    assert "transformer_engine does not import here" in str(e.value) and "context_parallel_size=2 needs" in str(e.value)
    with pytest.raises(ConfigError, match=r"fp8_recipe='current' is not one of blockwise, delayed, mxfp8, tensorwise"):
        validate(load_config(QUICKSTART + te[:1] + [f"+{key}.override_transformer_config.fp8=e4m3",
                                                    f"+{key}.override_transformer_config.fp8_recipe=current"]), **gpu)
    with pytest.raises(ConfigError, match="context_parallel_size=2 needs transformer-engine"):  # local spec chosen
        validate(load_config(QUICKSTART + te[3:] + [f"{key}.transformer_impl=local"]), **gpu)


def test_override_transformer_config_is_checked_before_any_worker_starts():
    ara = "actor_rollout_ref.actor.megatron.override_transformer_config"
    ok = validate(load_config(QUICKSTART + [f"+{ara}.attention_backend=local"]), cuda_available=CPU)
    assert ok.cfg.actor_rollout_ref.actor.megatron.override_transformer_config == {"attention_backend": "local"}
    auto = validate(load_config(QUICKSTART + [f"+{ara}.attention_backend=null"]), cuda_available=CPU)  # as the adapter reads it
    assert auto.cfg.actor_rollout_ref.actor.megatron.override_transformer_config == {"attention_backend": None}
    with pytest.raises(ConfigError) as e:
        validate(load_config(QUICKSTART + [f"+{ara}.attention_backend=flash3",
                                           "+critic.megatron.override_transformer_config.recompute_granularty=full"]),
                 cuda_available=CPU)
    msg = str(e.value)
    assert f"{ara}.attention_backend='flash3' is not one of auto, flash, fused, local, unfused; did you mean flash?" in msg
    assert ("critic.megatron.override_transformer_config.recompute_granularty is not a megatron TransformerConfig "
            "field; did you mean recompute_granularity?") in msg


def test_verl_091_reward_custom_reward_function_is_the_same_setting(tmp_path):
    # verl 0.9.1's main_ppo reads only reward.custom_reward_function (the old top-level key is silently ignored
    # there); both spellings set one field here, from the command line and from YAML.
    cli = load_config(["reward.custom_reward_function.path=r.py", "reward.custom_reward_function.name=f"])
    assert (cli.custom_reward_function.path, cli.custom_reward_function.name) == ("r.py", "f")
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text("defaults:\n  - ppo_trainer\n  - _self_\nreward:\n  custom_reward_function:\n    path: y.py\n")
    assert load_config([], config_name="job", config_path=str(tmp_path)).custom_reward_function.path == "y.py"
    cfg_file.write_text("reward:\n  custom_reward_function:\n    path: y.py\ncustom_reward_function:\n  path: z.py\n")
    with pytest.raises(ConfigError, match="disagree on \\['path'\\]"):
        load_config([], config_name="job", config_path=str(tmp_path))
    with pytest.raises(ConfigError, match="unknown key reward.num_workers"):
        load_config(["reward.num_workers=4"])


GRPO_SPLIT = ["data.train_batch_size=32", "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.n_gpus_per_node=4",
              "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.calculate_log_probs=true",
              "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=4"]


def test_split_placement_lays_the_rollout_on_its_own_gpus():
    cfg = load_config(GRPO_SPLIT + ["trainer.one_step_off_policy=true"], config_name="grpo_trainer")
    run = validate(cfg, cuda_available=lambda: True, gpu_count=lambda: 8)
    d = run.derived
    assert d.placement.split and d.placement.one_step_off and d.placement.rollout_world == 4
    assert (d.world_size, d.actor.dp, d.rollout.tp, d.rollout.dp) == (4, 4, 2, 2)  # replicas over the rollout's 4
    # one step stale: token TIS against the rollout's log-probs unless the user picks a correction
    rc = d.algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold) == ("token", 2.0)
    assert any("one_step_off_policy" in n for n in d.notes) and "placement: split" in run.summary()
    chosen = validate(load_config(GRPO_SPLIT + ["trainer.one_step_off_policy=true",
                                                "algorithm.rollout_correction.rollout_is=sequence",
                                                "algorithm.rollout_correction.rollout_is_threshold=5.0"],
                                  config_name="grpo_trainer"), cuda_available=lambda: True, gpu_count=lambda: 8)
    assert chosen.derived.algorithm.rollout_correction.rollout_is == "sequence"
    offload = validate(load_config(GRPO_SPLIT + ["actor_rollout_ref.actor.megatron.param_offload=true"],
                                   config_name="grpo_trainer"), cuda_available=lambda: True, gpu_count=lambda: 8)
    assert any("{param_offload}=true have no effect" in n for n in offload.derived.notes)
    sync = validate(load_config(GRPO_SPLIT, config_name="grpo_trainer"), cuda_available=lambda: True, gpu_count=lambda: 8)
    assert sync.derived.placement.split and not sync.derived.placement.one_step_off
    assert sync.derived.algorithm.rollout_correction is None


@pytest.mark.parametrize("extra, gpus, message", [
    (["actor_rollout_ref.hybrid_engine=true"], 8, r"one_step_off_policy=true needs a split placement.*hybrid_engine=false"),
    (["actor_rollout_ref.rollout.n_gpus_per_node=0"], 8, r"rollout.n_gpus_per_node >= 1"),
    (["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
      "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=8"], 1,
     r"needs .* = 1 \+ 1 = 2 GPUs; this machine has 1. One GPU cannot hold a split placement"),
    (["trainer.backend=local"], 8, r"needs trainer.backend=ray"),
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"], 8, r"filter_groups.enable=true is not"),
    (["actor_rollout_ref.rollout.calculate_log_probs=false"], 8, r"needs the rollout's log-probs"),
    (["actor_rollout_ref.rollout.tensor_model_parallel_size=8"], 8, r"tensor_model_parallel_size=8 must divide the 4"),
])
def test_split_placement_errors_name_the_fix(extra, gpus, message):
    cfg = load_config(GRPO_SPLIT + ["trainer.one_step_off_policy=true"] + extra, config_name="grpo_trainer")
    with pytest.raises(ConfigError, match=message):
        validate(cfg, cuda_available=lambda: True, gpu_count=lambda: gpus)


def test_megatron_cpu_optimizer_offload_beside_the_hybrid_engine_is_noted():
    base = ["trainer.device=cpu", "actor_rollout_ref.rollout.name=torch", "actor_rollout_ref.actor.use_dynamic_bsz=true"]
    key = "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=true"
    noted = validate(load_config(base + [key], config_name="grpo_trainer"), cuda_available=False)
    assert any("optimizer_cpu_offload=true" in n and "host" in n for n in noted.derived.notes)
    plain = validate(load_config(base, config_name="grpo_trainer"), cuda_available=False)
    assert not any("optimizer_cpu_offload" in n for n in plain.derived.notes)


def test_a_yaml_file_is_parsed_once_per_content_and_each_caller_gets_its_own_copy(tmp_path):
    """load_yaml caches the parse (plan --search composes hundreds of configs): a rewritten file, even of the same
    size within the same clock tick, is read anew, and a caller changing what it got changes no later load."""
    from hybridrl.config.loader import load_yaml

    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  total_epochs: 1\n")
    first = load_yaml(str(path))
    first["trainer"]["total_epochs"] = 99
    assert load_yaml(str(path)) == {"trainer": {"total_epochs": 1}}
    path.write_text("trainer:\n  total_epochs: 2\n")  # same size
    assert load_yaml(str(path)) == {"trainer": {"total_epochs": 2}}
