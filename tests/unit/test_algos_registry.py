"""Registries: error messages, user-registered estimator and loss round-trips, module boundaries."""

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
    Registry,
    agg_loss,
    compute_advantage,
)


def test_builtin_names():
    assert ADVANTAGE_ESTIMATORS.names() == sorted(
        ["gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"]
    )
    assert POLICY_LOSSES.names() == ["gspo", "vanilla"]
    assert KL_PENALTIES.names() == ["abs", "k1", "k2", "k3", "kl", "low_var_kl", "mse"]
    assert LOSS_AGG_MODES.names() == [
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "token-mean",
    ]


def test_unknown_name_lists_choices_and_did_you_mean():
    with pytest.raises(ValueError) as err:
        ADVANTAGE_ESTIMATORS.get("grp")
    msg = str(err.value)
    assert "Unknown adv_estimator 'grp'" in msg
    assert "Did you mean 'grpo'" in msg
    assert "Valid choices: gae, grpo, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, rloo" in msg
    with pytest.raises(ValueError, match="Did you mean 'vanilla'"):
        POLICY_LOSSES.get("vanila")
    with pytest.raises(ValueError) as err:  # nothing close: no hint, still the list
        POLICY_LOSSES.get("zzzzzz")
    assert "Did you mean" not in str(err.value) and "Valid choices: gspo, vanilla" in str(err.value)


def test_registry_duplicates_and_override():
    reg = Registry("thing")
    reg.register("a")(len)
    reg.register("a")(len)  # same object again: fine
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(abs)
    reg.register("a", override=True)(abs)
    assert reg.get("a") is abs and "a" in reg
    reg.unregister("a")
    assert reg.names() == []
    with pytest.raises(ValueError, match="non-empty"):
        reg.register("")


def test_user_estimator_roundtrip():
    @ADVANTAGE_ESTIMATORS.register("test_last_token_minus_batch_mean")
    def user_est(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
        scores = inputs.token_level_rewards.sum(-1)
        adv = (scores - scores.mean()).unsqueeze(-1) * inputs.response_mask
        return AdvantageOutput(adv, adv)

    try:
        rewards = torch.tensor([[0.0, 3.0], [1.0, 0.0]])
        mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
        adv, ret = compute_advantage(
            "test_last_token_minus_batch_mean", AdvantageInputs(rewards, mask), AdvantageParams()
        )
        # scores 3, 1 -> mean 2 -> +1 on row0's two tokens, -1 on row1's one token
        torch.testing.assert_close(adv, torch.tensor([[1.0, 1.0], [-1.0, 0.0]]))
        assert "test_last_token_minus_batch_mean" in ADVANTAGE_ESTIMATORS.names()
    finally:
        ADVANTAGE_ESTIMATORS.unregister("test_last_token_minus_batch_mean")


def test_user_policy_loss_roundtrip():
    @POLICY_LOSSES.register("test_reinforce")
    def reinforce(
        old_log_prob, log_prob, advantages, response_mask, params, loss_agg_mode="token-mean", rollout_is_weights=None
    ):
        loss = agg_loss(-advantages * log_prob, response_mask, loss_agg_mode)
        zero = torch.zeros(())
        return PolicyLossOutput(loss, zero, zero, zero)

    try:
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
    finally:
        POLICY_LOSSES.unregister("test_reinforce")


def test_user_estimator_sees_group_index():
    seen = {}

    @ADVANTAGE_ESTIMATORS.register("test_group_probe")
    def probe(inputs, params):
        seen["index"] = list(inputs.index)
        z = torch.zeros_like(inputs.token_level_rewards)
        return AdvantageOutput(z, z)

    try:
        compute_advantage(
            "test_group_probe",
            AdvantageInputs(torch.zeros(2, 1), torch.ones(2, 1), index=np.array(["u1", "u2"])),
            AdvantageParams(),
        )
        assert seen["index"] == ["u1", "u2"]
    finally:
        ADVANTAGE_ESTIMATORS.unregister("test_group_probe")


def test_algos_has_no_engine_or_distributed_imports():
    root = pathlib.Path(algos.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) >= 15
    banned = re.compile(r"megatron|^\s*(import|from)\s+(ray|vllm|torch\.distributed)\b|dist\.all_reduce", re.M)
    for path in files:
        text = path.read_text()
        assert not banned.search(text), f"{path} imports an engine or distributed module"
        assert len(text.splitlines()) < 300, f"{path} is too long"
