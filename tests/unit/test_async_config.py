"""async_training.*: one validation pass; every refusal names the keys to change."""
import pytest

from hybridrl.config import ConfigError, load_config, validate

CPU = lambda: False  # noqa: E731
SPLIT = ["trainer.device=cpu", "trainer.n_gpus_per_node=2", "data.train_batch_size=8",
         "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=1",
         "actor_rollout_ref.rollout.calculate_log_probs=true", "async_training.enable=true",
         "async_training.require_batches=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
         "algorithm.adv_estimator=grpo"]


def test_plan_and_default_correction():
    run = validate(load_config(SPLIT + ["async_training.compute_prox_log_prob=true", "async_training.staleness_threshold=0.5",
                                        "async_training.trigger_parameter_sync_step=3"]), cuda_available=CPU)
    plan = run.derived.placement.fully_async
    assert (plan.groups_per_step, plan.sync_every, plan.max_stale_syncs, plan.max_lag, plan.window_groups) == (8, 3, 1, 5, 36)
    assert run.derived.algorithm.rollout_correction.rollout_is == "token"  # token TIS unless chosen otherwise
    assert "fully async: 8 prompt groups a step" in run.summary()


@pytest.mark.parametrize("extra,message", [
    (["data.train_batch_size=6"], "set data.train_batch_size=8"),
    ([], "async_training.compute_prox_log_prob=false (verl's default: no old-log-prob pass) needs "
         "algorithm.rollout_correction.bypass_mode=true"),
    (["async_training.compute_prox_log_prob=true", "algorithm.rollout_correction.bypass_mode=true"], "keep one"),
    (["async_training.compute_prox_log_prob=true", "actor_rollout_ref.hybrid_engine=true"],
     "async_training.enable=true needs a split placement"),
    (["async_training.compute_prox_log_prob=true", "async_training.staleness_threshold=-1"],
     "async_training.staleness_threshold=-1.0 must be >= 0"),
    (["async_training.compute_prox_log_prob=true", "trainer.one_step_off_policy=true"], "pick one"),
])
def test_refusals_name_the_keys(extra, message):
    with pytest.raises(ConfigError, match=None) as e:
        validate(load_config(SPLIT + extra), cuda_available=CPU)
    assert message in str(e.value)


def test_bypass_mode_is_verls_default_path():
    run = validate(load_config(SPLIT + ["algorithm.rollout_correction.bypass_mode=true"]), cuda_available=CPU)
    assert run.derived.placement.fully_async is not None and run.derived.algorithm.bypass_mode
