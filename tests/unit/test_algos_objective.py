"""ActorObjective: the actor's per-micro-batch loss, and the one rule for weighting micro-batches.

The rule (agg.py): each micro-batch is aggregated with the MINI-batch's global token and row counts and
the result is that micro-batch's share of the mini-batch objective times dp_size. So, for any split of a
mini-batch over dp ranks and micro-batches, the shares divided by dp sum to the objective of the whole
mini-batch, and so do their gradients; checked here for every aggregation mode and the losses whose value
is a sum over tokens or sequences (clip_cov / kl_cov pick tokens from batch statistics, as in verl).
"""

import math

import pytest
import torch

from hybridrl.algos import ActorObjective, GlobalBatch, PolicyLossOptions, PolicyLossParams, RolloutCorrection

T64 = torch.float64
MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSSES = ["vanilla", "gspo", "cispo", "sapo", "geo_mean", "dppo_kl", "dppo_tv", "dro", "gpg", "reinforce"]


def batch(seed, B=8, R=5):
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 0, 5, 1, 4, 5, 2, 5][:B]
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(R)] for n in lengths], dtype=T64)
    mask[2, 1:3] = 0  # an observation hole
    old = -torch.rand(B, R, generator=g, dtype=T64) * 2 - 0.1
    new = (old + torch.randn(B, R, generator=g, dtype=T64) * 0.3).clamp(max=-1e-3)
    inputs = {"response_mask": mask, "old_log_probs": old,
              "advantages": torch.randn(B, 1, generator=g, dtype=T64).expand(B, R).contiguous(),
              "ref_log_prob": old + torch.randn(B, R, generator=g, dtype=T64) * 0.2,
              "rollout_log_probs": old + torch.randn(B, R, generator=g, dtype=T64) * 0.1}
    entropy = torch.rand(B, R, generator=g, dtype=T64) * 2
    return new, entropy, inputs


def objective(loss_mode, mode, **kw):
    options = PolicyLossOptions(dro_beta=0.3, rollout_correction=kw.pop("rc", RolloutCorrection()))
    params = PolicyLossParams(clip_ratio=0.2, clip_ratio_high=0.28, loss_agg_mode=mode, loss_scale_factor=7,
                              policy_loss=options)
    return ActorObjective(loss_mode, params, entropy_coeff=0.01, use_kl_loss=True, kl_loss_type="low_var_kl+",
                          kl_loss_coef=0.1, **kw)


def split_total(obj, new, entropy, inputs, parts, dp):
    """Sum over (rank, micro-batch) parts of loss / dp, with the whole batch's global counts."""
    batch = GlobalBatch(dp, float(inputs["response_mask"].sum()), len(new))
    total = 0
    for rows in parts:
        sub = {k: v[rows] for k, v in inputs.items()}
        total = total + obj(new[rows], entropy[rows], sub, batch).loss / dp
    return total


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("loss_mode", LOSSES)
def test_micro_batch_and_dp_split_gives_the_whole_batch_loss_and_gradient(loss_mode, mode):
    new, entropy, inputs = batch(1)
    obj = objective(loss_mode, mode)
    a = new.clone().requires_grad_(True)
    whole = obj(a, entropy, inputs, GlobalBatch(1, float(inputs["response_mask"].sum()), len(new))).loss
    whole.backward()
    b = new.clone().requires_grad_(True)
    # 2 "dp ranks" of 4 rows, split into micro-batches of 1, 2 and 1 / 3 and 1 rows
    parts = [slice(0, 1), slice(1, 3), slice(3, 4), slice(4, 7), slice(7, 8)]
    split = split_total(obj, b, entropy, inputs, parts, dp=2)
    split.backward()
    torch.testing.assert_close(split, whole, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-10, atol=1e-12)
    assert a.grad.abs().sum() > 0


def test_bypass_mode_split_invariance():
    new, entropy, inputs = batch(2)
    inputs["old_log_probs"] = inputs["rollout_log_probs"]  # bypass: the rollout's log-probs stand in
    rc = RolloutCorrection(rollout_is="token", rollout_is_threshold=1.5, rollout_rs="token_k2",
                           rollout_rs_threshold=0.05, bypass_mode=True, loss_type="reinforce")
    obj = objective("bypass_mode", "token-mean", rc=rc)
    whole = obj(new, entropy, inputs, GlobalBatch(1, float(inputs["response_mask"].sum()), len(new))).loss
    split = split_total(obj, new, entropy, inputs, [slice(0, 3), slice(3, 8)], dp=1)
    torch.testing.assert_close(split, whole, rtol=1e-10, atol=1e-12)


def test_composition_hand():
    # one row, two tokens; vanilla at ratio 1: pg = -mean(A) = -(1 + 3)/2 = -2; entropy mean (0.5 + 1.5)/2 = 1;
    # k1 KL mean ((-1 - -2) + (-1 - -1)) / 2 = 0.5. loss = -2 - 0.1 * 1 + 0.2 * 0.5 = -2.0
    params = PolicyLossParams()
    obj = ActorObjective("vanilla", params, entropy_coeff=0.1, use_kl_loss=True, kl_loss_type="k1", kl_loss_coef=0.2)
    lp = torch.tensor([[-1.0, -1.0]], dtype=T64)
    inputs = {"response_mask": torch.ones(1, 2, dtype=T64), "old_log_probs": lp.clone(),
              "advantages": torch.tensor([[1.0, 3.0]], dtype=T64), "ref_log_prob": torch.tensor([[-2.0, -1.0]], dtype=T64)}
    out = obj(lp, torch.tensor([[0.5, 1.5]], dtype=T64), inputs)
    assert out.loss.item() == pytest.approx(-2.0)
    assert {k: round(v.item(), 9) for k, v in out.totals.items()} == {"actor/pg_loss": -2.0, "actor/entropy": 1.0,
                                                                        "actor/kl_loss": 0.5}
    assert out.means["actor/ppo_kl"] == 0.0
    assert obj.total_names() == ["actor/pg_loss", "actor/entropy", "actor/kl_loss"]
    assert obj.mean_names() == ["actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"]
    assert math.isclose(obj.kl_loss_coef, 0.2)


def test_from_config_and_bypass_switch():
    from hybridrl.config import load_config
    from hybridrl.config.schema import ActorConfig

    # an ActorConfig built by hand (tests, benchmarks) has rollout correction off, not unresolved links
    assert ActorObjective.from_config(ActorConfig()).loss_mode == "vanilla"
    actor = load_config(["actor_rollout_ref.actor.policy_loss.loss_mode=cispo", "actor_rollout_ref.actor.tau_pos=2",
                         "actor_rollout_ref.actor.clip_ratio_high=0.28"]).actor_rollout_ref.actor
    obj = ActorObjective.from_config(actor)
    assert obj.loss_mode == "cispo" and obj.params.tau_pos == 2.0 and obj.params.high == 0.28
    bypass = load_config(["algorithm.rollout_correction.bypass_mode=true",
                          "algorithm.rollout_correction.loss_type=reinforce"]).actor_rollout_ref.actor
    obj = ActorObjective.from_config(bypass)
    assert obj.loss_mode == "bypass_mode" and obj.params.policy_loss.rollout_correction.loss_type == "reinforce"
    with pytest.raises(ValueError, match="did you mean 'cispo'"):
        ActorObjective("cispoo", PolicyLossParams())
