"""Registries: error messages, user-registered estimator and loss round-trips, module boundaries.

User entries are registered with override=True under "test_" names so reruns in one process work.
"""

import pathlib
import re

import numpy as np
import pytest
import torch

import hybridrl.algos as algos
from hybridrl.algos import (
    ADVANTAGE_ESTIMATORS,
    KL_PENALTIES,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    AdvantageInputs,
    AdvantageOutput,
    AdvantageParams,
    GlobalBatch,
    PolicyLossOptions,
    PolicyLossParams,
    agg_loss,
    compute_advantage,
    compute_policy_loss,
    estimator_needs,
    loss_metric_names,
    needs,
    register_policy_loss,
)
from hybridrl.algos import torch_functional as verl_F


def builtin(registry):
    return [n for n in registry.names() if not n.startswith("test")]


# verl 0.9.1's AdvantageEstimator enum and registered policy losses (plus `reinforce`, verl's
# compute_policy_loss_reinforce, which bypass_mode dispatches to)
VERL_ESTIMATORS = ["gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "opo",
                   "grpo_passk", "gpg", "rloo_vectorized", "grpo_vectorized", "optimal_token_baseline",
                   "tir_optimal_token_baseline", "gdpo"]
VERL_LOSSES = ["vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro",
               "cispo", "bypass_mode", "reinforce"]


def test_builtin_names():
    assert builtin(ADVANTAGE_ESTIMATORS) == sorted(VERL_ESTIMATORS)
    assert builtin(POLICY_LOSSES) == sorted(VERL_LOSSES)
    base = ["abs", "k1", "k2", "k3", "kl", "low_var_kl", "mse"]
    assert builtin(KL_PENALTIES) == sorted(base + [k + "+" for k in base])
    assert builtin(LOSS_AGG_MODES) == [
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "token-mean",
        "token-sum",
    ]


def test_unknown_name_names_key_choices_and_did_you_mean():
    with pytest.raises(ValueError) as err:
        ADVANTAGE_ESTIMATORS.get("grp")
    msg = str(err.value)
    assert msg.startswith("algorithm.adv_estimator='grp'")
    assert "did you mean 'grpo'" in msg
    for name in ["gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo"]:
        assert name in msg
    with pytest.raises(ValueError, match=r"policy_loss.loss_mode='vanila'.*did you mean 'vanilla'"):
        POLICY_LOSSES.get("vanila")
    with pytest.raises(ValueError) as err:  # nothing close: no hint, still the list
        POLICY_LOSSES.get("zzzzzz")
    assert "did you mean" not in str(err.value) and "gspo, kl_cov, reinforce, sapo, vanilla" in str(err.value)
    with pytest.raises(ValueError, match="already registered"):
        ADVANTAGE_ESTIMATORS.register("grpo")(lambda inputs, params: None)


def test_user_estimator_roundtrip():
    @ADVANTAGE_ESTIMATORS.register("test_minus_batch_mean", override=True)
    def user_est(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
        scores = inputs.token_level_rewards.sum(-1)
        adv = (scores - scores.mean()).unsqueeze(-1) * inputs.response_mask
        return AdvantageOutput(adv, adv)

    rewards = torch.tensor([[0.0, 3.0], [1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, ret = compute_advantage("test_minus_batch_mean", AdvantageInputs(rewards, mask), AdvantageParams())
    # scores 3, 1 -> mean 2 -> +1 on row0's two tokens, -1 on row1's one token
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1.0], [-1.0, 0.0]]))
    assert ADVANTAGE_ESTIMATORS.get("test_minus_batch_mean") is user_est


def test_user_estimator_sees_group_index():
    seen = {}

    @ADVANTAGE_ESTIMATORS.register("test_group_probe", override=True)
    def probe(inputs, params):
        seen["index"] = list(inputs.index)
        z = torch.zeros_like(inputs.token_level_rewards)
        return AdvantageOutput(z, z)

    inputs = AdvantageInputs(torch.zeros(2, 1), torch.ones(2, 1), index=np.array(["u1", "u2"]))
    compute_advantage("test_group_probe", inputs, AdvantageParams())
    assert seen["index"] == ["u1", "u2"]


def test_verl_written_policy_loss_runs_unchanged():
    # Written against verl 0.9's contract: keyword arguments, verl's config attribute names, .get(),
    # **config.global_batch_info into agg_loss, and a (loss, metrics) tuple back. Only the imports differ.
    @register_policy_loss("test_verl_style", override=True)
    def compute_policy_loss_verl_style(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                       config=None, rollout_is_weights=None):
        assert config is not None
        clip_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
        ratio = torch.exp(log_prob - old_log_prob).clamp(min=1 - clip_low)
        pg_losses = -advantages * ratio * config.get("clip_ratio_c", 3.0) / 3.0 * config.policy_loss.ppo_kl_coef
        pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode,
                           **config.global_batch_info)
        return pg_loss, {"actor/ppo_kl": verl_F.masked_mean(old_log_prob - log_prob, response_mask).item()}

    log_prob = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]], requires_grad=True)
    adv = torch.tensor([[2.0, 2.0], [1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    options = PolicyLossOptions(ppo_kl_coef=0.5)
    params = PolicyLossParams(policy_loss=options, global_batch_info=GlobalBatch(dp_size=2, batch_num_tokens=6))
    out = compute_policy_loss("test_verl_style", log_prob.detach(), log_prob, adv, mask, params)
    out.pg_loss.backward()
    # ratio 1: per token -A * 0.5 on (2 | 1, 1) valid tokens = -1 - 0.5 - 0.5 = -2, over 6 global tokens, x dp 2
    assert out.pg_loss.item() == pytest.approx(2 * -2.0 / 6)
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-2 * 1.0 / 6, 0.0], [-2 * 0.5 / 6, -2 * 0.5 / 6]]))
    assert out.metrics == {"actor/ppo_kl": 0.0}
    # the actor reports verl's standard metric names for a loss that declares none
    assert loss_metric_names("test_verl_style", params) == ["actor/pg_clipfrac", "actor/ppo_kl",
                                                            "actor/pg_clipfrac_lower"]


def test_policy_loss_with_a_wrong_return_type_is_named():
    @POLICY_LOSSES.register("test_bad_return", override=True)
    def bad(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
            rollout_is_weights=None):
        return log_prob.sum()

    with pytest.raises(TypeError, match="'test_bad_return' returned Tensor"):
        compute_policy_loss("test_bad_return", torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1),
                            torch.ones(1, 1), PolicyLossParams())


def test_estimators_declare_what_they_need():
    assert estimator_needs("gae") == {"values"}
    assert estimator_needs("remax") == {"reward_baselines"}
    assert estimator_needs("optimal_token_baseline") == {"index", "old_log_probs", "sum_pi_squared"}
    assert estimator_needs("reinforce_plus_plus") == set()
    with pytest.raises(ValueError, match="not AdvantageInputs fields"):
        needs("logits")


def test_algos_has_no_engine_or_distributed_imports():
    root = pathlib.Path(algos.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) >= 15
    banned = re.compile(r"megatron|^\s*(import|from)\s+(ray|vllm|torch\.distributed)\b|dist\.all_reduce", re.M)
    for path in files:
        text = path.read_text()
        assert not banned.search(text), f"{path} imports an engine or distributed module"
        assert len(text.splitlines()) < 320, f"{path} is too long"
