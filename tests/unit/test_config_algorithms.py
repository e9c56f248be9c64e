"""The algorithm keys: every estimator and loss is usable from the command line and shows in --cfg job, the
one validation pass rejects bad names and impossible combinations naming the key, and derives the plan
(the loss that runs, the effective rollout correction, whether sum_pi_squared is computed)."""
import pytest
import yaml

from hybridrl.algos import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from hybridrl.config import ConfigError, load_config, validate
from hybridrl.config.cli import load_run

CPU = lambda: False  # noqa: E731
GRPO = ["--config-name", "grpo_trainer", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "trainer.device=cpu"]
ESTIMATOR_KEYS = {"gdpo": ["algorithm.gdpo_reward_keys=[fmt,acc]"]}
LOSS_KEYS = {"dro": ["actor_rollout_ref.actor.policy_loss.dro_beta=0.1"],
             "bypass_mode": ["algorithm.rollout_correction.bypass_mode=true",
                             "actor_rollout_ref.rollout.calculate_log_probs=true"]}


def run_of(*overrides, config=GRPO):
    cl = config[2:] + list(overrides)
    return validate(load_config(cl, config_name=config[1]), cuda_available=CPU)


def problems(*overrides) -> str:
    with pytest.raises(ConfigError) as err:
        run_of(*overrides)
    return str(err.value)


def cfg_job(capsys, *overrides) -> tuple[dict, str]:
    with pytest.raises(SystemExit) as done:
        load_run(["--cfg", "job", *GRPO, *overrides])
    out = capsys.readouterr()
    assert done.value.code == 0, out.err
    return yaml.safe_load(out.out), out.err


def builtin(registry):
    return [n for n in registry.names() if not n.startswith("test")]


@pytest.mark.parametrize("name", builtin(ADVANTAGE_ESTIMATORS))
def test_every_estimator_from_the_command_line(name, capsys):
    extra = ["critic.model.path=x", "critic.ppo_micro_batch_size_per_gpu=4"] if name == "gae" else []
    tree, derived = cfg_job(capsys, f"algorithm.adv_estimator={name}", *ESTIMATOR_KEYS.get(name, []), *extra)
    assert tree["algorithm"]["adv_estimator"] == name
    assert f"adv_estimator={name} " in derived


@pytest.mark.parametrize("name", builtin(POLICY_LOSSES))
def test_every_policy_loss_from_the_command_line(name, capsys):
    mode = [] if name == "bypass_mode" else [f"actor_rollout_ref.actor.policy_loss.loss_mode={name}"]
    tree, derived = cfg_job(capsys, *mode, *LOSS_KEYS.get(name, []))
    if mode:
        assert tree["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] == name
    else:
        assert tree["algorithm"]["rollout_correction"]["bypass_mode"] is True
    assert f"loss_mode={name} " in derived


def test_new_keys_show_in_cfg_job(capsys):
    tree, _ = cfg_job(capsys, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc",
                      "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=64",
                      "actor_rollout_ref.actor.kl_loss_type=k3+", "actor_rollout_ref.actor.loss_agg_mode=token-sum")
    assert tree["algorithm"]["filter_groups"] == {"enable": True, "metric": "acc", "max_num_gen_batches": 0,
                                                  "max_inflight_gen_batches": 1}
    assert tree["reward_model"]["overlong_buffer"]["len"] == 64
    assert tree["actor_rollout_ref"]["actor"]["kl_loss_type"] == "k3+"
    assert tree["actor_rollout_ref"]["actor"]["policy_loss"]["rollout_correction"] == tree["algorithm"]["rollout_correction"]


def test_bad_names_get_did_you_mean():
    msg = problems("algorithm.adv_estimator=grpo_passs", "actor_rollout_ref.actor.policy_loss.loss_mode=kl_covv",
                   "algorithm.kl_penalty=k3-", "actor_rollout_ref.actor.loss_agg_mode=token_sum",
                   "algorithm.rollout_correction.rollout_is=tokens", "actor_rollout_ref.rollout.calculate_log_probs=true")
    assert "algorithm.adv_estimator='grpo_passs' is not one of" in msg and "did you mean grpo_passk?" in msg
    assert "loss_mode='kl_covv'" in msg and "did you mean kl_cov?" in msg
    assert "algorithm.kl_penalty='k3-'" in msg and "did you mean k3" in msg
    assert "loss_agg_mode='token_sum'" in msg and "did you mean token-sum?" in msg
    assert "algorithm.rollout_correction.rollout_is='tokens' is not one of token, sequence" in msg
    with pytest.raises(ConfigError, match="filter_group.*did you mean algorithm.filter_groups"):
        load_config(["algorithm.filter_group.enable=true"])


def test_kl_full_is_rejected_with_the_reason():
    assert "kl_penalty=full: kl_penalty='full' needs the full vocabulary" in problems("algorithm.kl_penalty=full")


def test_loss_and_estimator_requirements():
    assert "needs algorithm.gdpo_reward_keys" in problems("algorithm.adv_estimator=gdpo")
    assert "one weight per key" in problems("algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[a,b]",
                                            "algorithm.gdpo_reward_weights=[1.0]")
    assert "policy_loss.dro_beta > 0" in problems("actor_rollout_ref.actor.policy_loss.loss_mode=dro")
    assert "compares samples of the same prompt" in problems("algorithm.adv_estimator=opo",
                                                             "actor_rollout_ref.rollout.n=1",
                                                             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    assert "tau_pos=0.0" in problems("actor_rollout_ref.actor.tau_pos=0")


def test_rollout_correction_rules_and_the_old_tis_key():
    # off by default
    assert run_of().derived.algorithm.rollout_correction is None
    # the old key is rollout_is=token with its threshold
    plan = run_of("actor_rollout_ref.actor.tis_imp_ratio_cap=2.5", "actor_rollout_ref.rollout.calculate_log_probs=true")
    rc = plan.derived.algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold) == ("token", 2.5)
    assert "are both set" in problems("actor_rollout_ref.actor.tis_imp_ratio_cap=2.5",
                                      "algorithm.rollout_correction.rollout_is=sequence",
                                      "actor_rollout_ref.rollout.calculate_log_probs=true")
    assert "set actor_rollout_ref.rollout.calculate_log_probs=true" in problems(
        "algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs_threshold=2")
    assert "needs rollout_rs_threshold" in problems("algorithm.rollout_correction.rollout_rs=token_k1",
                                                    "actor_rollout_ref.rollout.calculate_log_probs=true")
    assert "it follows algorithm.rollout_correction" in problems(
        "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is=token")


def test_bypass_mode_rules():
    on = ["algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=true"]
    plan = run_of(*on).derived.algorithm
    assert plan.bypass_mode and plan.loss_mode == "bypass_mode"
    assert "would be ignored: set it to vanilla" in problems(*on, "actor_rollout_ref.actor.policy_loss.loss_mode=cispo")
    assert "needs algorithm.rollout_correction.bypass_mode=true" in problems(
        "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode")
    assert "skips the old-log-prob pass" in problems(*on, "algorithm.adv_estimator=optimal_token_baseline")


def test_sum_pi_squared_only_when_asked():
    assert not run_of().derived.algorithm.sum_pi_squared
    assert run_of("algorithm.adv_estimator=tir_optimal_token_baseline").derived.algorithm.sum_pi_squared
    assert run_of("actor_rollout_ref.actor.calculate_sum_pi_squared=true").derived.algorithm.sum_pi_squared


def test_dapo_keys():
    assert "needs algorithm.filter_groups.metric" in problems("algorithm.filter_groups.enable=true",
                                                              "algorithm.filter_groups.metric=null")
    assert "filtered right after scoring" in problems("algorithm.filter_groups.enable=true",
                                                      "algorithm.filter_groups.metric=seq_final_reward",
                                                      "algorithm.use_kl_in_reward=true")
    msg = problems("reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=0")
    assert "reward_model.overlong_buffer.len=0 must be in (0, data.max_response_length=512]" in msg
    assert run_of("algorithm.filter_groups.enable=true").derived.algorithm.dynamic_sampling


def test_dapo_config_files_validate():
    # the recipe (real models) and its CPU demo variant
    cfg = load_config(["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"],
                      config_name="dapo_trainer")
    a = validate(cfg, cuda_available=CPU).derived.algorithm
    assert a.dynamic_sampling and a.loss_agg_mode == "token-mean"
    assert (cfg.actor_rollout_ref.actor.clip_ratio_low, cfg.actor_rollout_ref.actor.clip_ratio_high) == (0.2, 0.28)
    assert cfg.reward_model.overlong_buffer.enable and cfg.algorithm.filter_groups.metric == "acc"
    demo = load_config(["data.train_files=x", "data.val_files=y"], config_name="dapo_demo")
    d = validate(demo, cuda_available=CPU).derived.algorithm
    assert d.dynamic_sampling and demo.reward_model.reward_manager == "dapo"
