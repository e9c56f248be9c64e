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
    PolicyLossOutput,
    PolicyLossParams,
    agg_loss,
    compute_advantage,
)


def builtin(registry):
    return [n for n in registry.names() if not n.startswith("test")]


def test_builtin_names():
    assert builtin(ADVANTAGE_ESTIMATORS) == sorted(
        ["gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"]
    )
    assert builtin(POLICY_LOSSES) == ["gspo", "vanilla"]
    assert builtin(KL_PENALTIES) == ["abs", "k1", "k2", "k3", "kl", "low_var_kl", "mse"]
    assert builtin(LOSS_AGG_MODES) == [
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "token-mean",
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
    assert "did you mean" not in str(err.value) and "gspo, vanilla" in str(err.value)
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


def test_user_policy_loss_roundtrip():
    @POLICY_LOSSES.register("test_reinforce", override=True)
    def reinforce(
        old_log_prob, log_prob, advantages, response_mask, params, loss_agg_mode="token-mean", rollout_is_weights=None
    ):
        loss = agg_loss(-advantages * log_prob, response_mask, loss_agg_mode)
        zero = torch.zeros(())
        return PolicyLossOutput(loss, zero, zero, zero)

    log_prob = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    fn = POLICY_LOSSES.get("test_reinforce")
    out = fn(
        log_prob.detach(),
        log_prob,
        torch.tensor([[2.0, 2.0]]),
        torch.tensor([[1.0, 0.0]]),
        PolicyLossParams(),
        "token-mean",
    )
    out.pg_loss.backward()
    # only the first token counts: loss = -2 * -1 = 2, gradient -2
    assert out.pg_loss.item() == pytest.approx(2.0)
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-2.0, 0.0]]))
    assert out.metrics()["actor/pg_loss"] == pytest.approx(2.0)


def test_algos_has_no_engine_or_distributed_imports():
    root = pathlib.Path(algos.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) >= 15
    banned = re.compile(r"megatron|^\s*(import|from)\s+(ray|vllm|torch\.distributed)\b|dist\.all_reduce", re.M)
    for path in files:
        text = path.read_text()
        assert not banned.search(text), f"{path} imports an engine or distributed module"
        assert len(text.splitlines()) < 300, f"{path} is too long"
