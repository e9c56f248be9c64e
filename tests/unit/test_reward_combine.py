"""Model-based rewards on the driver: combining rule / model / judge scores per data source, re-rendering samples in
the reward model's chat template, the reward model's input layout, and reward_model.* validation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridrl.adapters.megatron.reward_model import score_layout
from hybridrl.config import ConfigError
from hybridrl.config.loader import load_config
from hybridrl.config.reward_checks import CombineRule, RewardPlan
from hybridrl.config.validate import validate
from hybridrl.data.tokenizer import build_tiny_tokenizer
from hybridrl.model_rewards.combined import CombinedReward, combine
from hybridrl.model_rewards.rm_inputs import RewardInputs, tokenizers_differ
from hybridrl.protocol import DataProto
from hybridrl.reward.managers import RewardManager, RewardOutput

CPU = lambda: False  # noqa: E731
BASE = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2", "trainer.device=cpu"]


def test_combine_modes_by_hand():
    assert combine(CombineRule("replace"), 1.0, 0.3, None) == 0.3  # verl: the model score replaces the rule's
    assert combine(CombineRule("replace"), None, 0.3, 0.5) == pytest.approx(0.8)
    s = CombineRule("sum", rule_weight=2.0, model_weight=0.5, judge_weight=0.25)
    assert combine(s, 1.0, 0.4, 0.8) == pytest.approx(2.0 + 0.2 + 0.2)
    assert combine(s, 1.0, 0.4, None) == pytest.approx(2.2)  # a failed judgement leaves its part out, not 0*w
    g = CombineRule("gate", rule_weight=1.0, model_weight=1.0, gate_threshold=1.0)
    assert combine(g, 1.0, 0.4, None) == pytest.approx(1.4)
    assert combine(g, 0.0, 0.4, None) == 0.0  # a wrong answer gets no model bonus


class FixedRule(RewardManager):
    """Rule scores from the sample's ground truth (a float), on the last valid response token."""

    def __init__(self):
        super().__init__(tokenizer=None)
        self.seen = []

    def __call__(self, data):
        self.seen.append(len(data))
        _, truths, _ = self.sample_fields(data)
        last = torch.tensor([int(m.nonzero().max()) for m in data.batch["response_mask"]])
        return self.build_output([float(t) for t in truths], [{"score": float(t), "acc": t > 0} for t in truths], last,
                                 data.batch["responses"].shape)


def _batch(tok):
    responses = torch.tensor([[5, 6, 0], [7, 0, 0], [5, 5, 5]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    prompts = torch.tensor([[8, 9], [8, 9], [9, 9]])
    return DataProto.from_dict(
        {"responses": responses, "response_mask": mask, "prompts": prompts,
         "input_ids": torch.cat([prompts, responses], 1), "attention_mask": torch.cat([torch.ones(3, 2, dtype=torch.long), mask], 1)},
        {"data_source": np.array(["math", "chat", "math"], dtype=object),
         "reward_model": np.array([{"ground_truth": 1.0}, {"ground_truth": 0.0}, {"ground_truth": 0.0}], dtype=object)})


def test_combined_reward_per_data_source_places_scores_on_the_last_token():
    tok = build_tiny_tokenizer(alphabet="0123456789+=")
    plan = RewardPlan(model=True, default_rule=CombineRule("replace"),
                      per_source={"math": CombineRule("gate", rule_weight=1.0, model_weight=0.5, gate_threshold=1.0)})
    rule = FixedRule()
    model_scores = torch.tensor([0.2, -0.4, 0.8])
    reward = CombinedReward(plan, rule=rule, tokenizer=tok, model=lambda data: model_scores)
    out = reward(_batch(tok))
    assert rule.seen == [2]  # only the two "math" samples need the rule scorer ("chat" is replace)
    expected = torch.zeros(3, 3)
    expected[0, 1] = 1.0 + 0.5 * 0.2  # gate passed
    expected[1, 0] = -0.4  # replace: the model score
    expected[2, 2] = 0.0  # gate closed: rule 0, no model part
    torch.testing.assert_close(out.reward_tensor, expected)
    assert out.reward_extra_info["rule_score"] == [1.0, None, 0.0]
    assert out.reward_extra_info["rm_score"] == pytest.approx([0.2, -0.4, 0.8])
    assert out.reward_extra_info["acc"] == [True, None, False]
    assert out.metrics["reward_model/score_mean"] == pytest.approx(0.2)


def test_rerender_in_the_reward_models_chat_template():
    policy = build_tiny_tokenizer(alphabet="0123456789+=")
    rm = build_tiny_tokenizer(alphabet="0123456789+=")
    assert not tokenizers_differ(policy, rm)
    rm.chat_template = "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}=={% endif %}{% endfor %}"
    assert tokenizers_differ(policy, rm)
    resp = policy("17", add_special_tokens=False)["input_ids"] + [policy.eos_token_id]
    responses = torch.tensor([resp + [policy.pad_token_id], resp[1:] + [policy.pad_token_id] * 2])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    data = DataProto.from_dict({"responses": responses, "response_mask": mask,
                                "input_ids": torch.zeros(2, 10, dtype=torch.long)},
                               {"raw_prompt": np.array([[{"role": "user", "content": "3+4="}],
                                                        [{"role": "user", "content": "12+5="}]], dtype=object)})
    inputs = RewardInputs(policy, rm, max_length=None)
    assert inputs.texts(data) == ["3+4=17==", "12+5=7=="]  # the policy's EOS is dropped, the RM's template applied
    out = inputs(data)
    want = rm("12+5=7==", add_special_tokens=False)["input_ids"]
    assert out.batch["input_ids"][1, : len(want)].tolist() == want and int(out.batch["attention_mask"][1].sum()) == len(want)
    cut = RewardInputs(policy, rm, max_length=5)(data)
    assert cut.batch["input_ids"].shape[1] == 5  # right truncation at reward_model.max_length, as verl
    with pytest.raises(KeyError, match="data.return_raw_chat=true"):
        inputs.texts(DataProto.from_dict({"responses": responses, "response_mask": mask}))


def test_score_layout_right_aligns_and_appends_the_response_column():
    ids = torch.tensor([[0, 0, 5, 6, 7, 0], [3, 4, 5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    out = score_layout(ids, mask, pad_id=0)
    assert out.batch["input_ids"].tolist() == [[0, 0, 0, 5, 6, 7, 0], [3, 4, 5, 6, 7, 8, 0]]
    assert out.batch["attention_mask"].tolist() == [[0, 0, 0, 1, 1, 1, 1], [1] * 7]
    assert out.batch["responses"].shape == (2, 1)


def test_reward_model_config_validates_and_names_keys(tmp_path):
    (tmp_path / "rm").mkdir()
    ok = validate(load_config(BASE + ["reward_model.enable=true", f"reward_model.model.path={tmp_path / 'rm'}",
                                      "reward_model.micro_batch_size_per_gpu=4",
                                      "reward_model.combine.mode=sum", "reward_model.combine.model_weight=0.5",
                                      "+reward_model.combine.per_data_source.gsm8k.mode=gate"]), cuda_available=CPU)
    plan = ok.derived.reward
    assert plan.model and plan.micro_batch_per_gpu == 4 and plan.layout.tp == 1 and plan.layout.dp == 2
    assert plan.rule_for("gsm8k") == CombineRule("gate", model_weight=0.5)  # unset fields follow the defaults
    assert plan.rule_for("other") == CombineRule("sum", model_weight=0.5)
    assert "reward: reward model (micro-batch 4), combine=sum" in ok.summary()
    rm = ["reward_model.enable=true", f"reward_model.model.path={tmp_path / 'rm'}"]
    bad = [(rm, "reward_model.micro_batch_size_per_gpu is not set"),
           (rm + ["reward_model.micro_batch_size_per_gpu=4", "reward_model.megatron.tensor_model_parallel_size=2"],
            "reward_model.megatron.tensor_model_parallel_size=2 differs from actor_rollout_ref.actor.megatron"),
           (rm + ["reward_model.micro_batch_size_per_gpu=4", "reward_model.enable_resource_pool=true"],
            "reward_model.enable_resource_pool=true is not supported"),
           (["reward_model.enable=true", "reward_model.model.path=/no/such/rm", "reward_model.use_dynamic_bsz=true"],
            "reward_model.model.path=/no/such/rm: no such folder"),
           (["reward_model.combine.mode=average"], "reward_model.combine.mode='average' is not one of gate, replace, sum"),
           (["+reward_model.combine.per_data_source.gsm8k.weight=2"],
            "reward_model.combine.per_data_source.gsm8k: unknown field(s) ['weight']"),
           (["reward_model.judge.enable=true"], "reward_model.judge.prompt_path is not set"),
           (["reward_model.judge.enable=true", f"reward_model.judge.prompt_path={tmp_path}/none.txt"],
            "reward_model.judge.url=None: the endpoint backend needs an http(s) URL")]
    for overrides, message in bad:
        with pytest.raises(ConfigError) as e:
            validate(load_config(BASE + overrides), cuda_available=CPU)
        assert message in str(e.value), (overrides, str(e.value))


def test_rule_only_jobs_keep_the_rule_manager():
    from hybridrl.model_rewards.combined import build_combined_reward

    run = validate(load_config(BASE), cuda_available=CPU)
    rule = FixedRule()
    assert build_combined_reward(run, rule, tokenizer=None) is rule
    assert not run.derived.reward.enabled
    assert RewardOutput(torch.zeros(1, 1)).metrics == {}
