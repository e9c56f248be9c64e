"""assemble_rollout: the output layout of every rollout engine, on hand-built cases."""
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.rollout.assemble import assemble_rollout

PAD = 0


def two_prompts() -> DataProto:
    # prompt 0: [5, 6] (left-padded to 3), prompt 1: [7, 8, 9]
    return DataProto.from_dict(
        {
            "input_ids": torch.tensor([[PAD, 5, 6], [7, 8, 9]]),
            "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
            "position_ids": torch.tensor([[0, 0, 1], [0, 1, 2]]),
        },
        {"data_source": ["a", "b"], "reward_model": [{"gt": 1}, {"gt": 2}]},
        {"step": 3},
    )


def test_layout_of_two_prompts_two_samples_each():
    responses = [[11, 2], [12, 13, 14, 2], [15], []]
    logprobs = [[-0.1, -0.2], [-1.0, -1.1, -1.2, -1.3], [-0.5], []]
    out = assemble_rollout(two_prompts(), responses, logprobs, n=2, max_tokens=4, pad_token_id=PAD)
    b = out.batch
    assert len(out) == 4
    assert b["prompts"].tolist() == [[PAD, 5, 6], [PAD, 5, 6], [7, 8, 9], [7, 8, 9]]
    assert b["responses"].tolist() == [[11, 2, PAD, PAD], [12, 13, 14, 2], [15, PAD, PAD, PAD], [PAD] * 4]
    assert b["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert b["input_ids"].tolist()[0] == [PAD, 5, 6, 11, 2, PAD, PAD]
    assert b["attention_mask"].tolist()[0] == [0, 1, 1, 1, 1, 0, 0]
    assert b["attention_mask"].tolist()[3] == [1, 1, 1, 0, 0, 0, 0]
    # positions continue from the prompt's last position, also over response padding
    assert b["position_ids"].tolist()[0] == [0, 0, 1, 2, 3, 4, 5]
    assert b["position_ids"].tolist()[2] == [0, 1, 2, 3, 4, 5, 6]
    expected_lp = torch.tensor([[-0.1, -0.2, 0, 0], [-1.0, -1.1, -1.2, -1.3], [-0.5, 0, 0, 0], [0, 0, 0, 0]])
    assert torch.equal(b["rollout_log_probs"], expected_lp)
    assert b["rollout_log_probs"].dtype == torch.float32 and b["responses"].dtype == torch.long
    assert list(out.non_tensor_batch["data_source"]) == ["a", "a", "b", "b"]
    assert list(out.non_tensor_batch["reward_model"]) == [{"gt": 1}, {"gt": 1}, {"gt": 2}, {"gt": 2}]
    assert out.meta_info == {"step": 3}


def test_no_logprobs_gives_zeros_and_n1_keeps_rows():
    out = assemble_rollout(two_prompts(), [[3], [4, 5]], None, n=1, max_tokens=2, pad_token_id=9)
    assert out.batch["responses"].tolist() == [[3, 9], [4, 5]]
    assert not out.batch["rollout_log_probs"].any()


def test_multi_axis_position_ids_continue_per_axis():
    prompts = two_prompts()
    pos = torch.stack([prompts.batch["position_ids"], prompts.batch["position_ids"] * 2], dim=1)  # [B, 2, P]
    prompts.batch["position_ids"] = pos
    out = assemble_rollout(prompts, [[1], [1]], None, n=1, max_tokens=2, pad_token_id=PAD)
    assert out.batch["position_ids"][0].tolist() == [[0, 0, 1, 2, 3], [0, 0, 2, 3, 4]]


@pytest.mark.parametrize(
    "responses,logprobs,n,match",
    [
        ([[1]], None, 1, "1 responses for 2 prompts"),
        ([[1, 2, 3], [1]], None, 1, "more than max_tokens=2"),
        ([[1], [1]], [[0.0, 0.0], [0.0]], 1, "1 tokens but 2 log-probs"),
        ([[1], [1]], [[0.0]], 1, "1 log-prob lists"),
    ],
)
def test_inconsistent_inputs_are_named(responses, logprobs, n, match):
    with pytest.raises(ValueError, match=match):
        assemble_rollout(two_prompts(), responses, logprobs, n=n, max_tokens=2, pad_token_id=PAD)


def test_missing_prompt_key_is_named():
    prompts = two_prompts()
    del prompts.batch["position_ids"]
    with pytest.raises(KeyError, match="position_ids"):
        assemble_rollout(prompts, [[1], [1]], None, n=1, max_tokens=2, pad_token_id=PAD)


def test_routed_experts_are_kept_inside_the_attention_mask_and_agreement_averages_known_tokens():
    from hybridrl.hybrid.checks import routing_agreement

    prompts = DataProto.from_dict({"input_ids": torch.tensor([[0, 5, 6]]), "attention_mask": torch.tensor([[0, 1, 1]]),
                                   "position_ids": torch.tensor([[0, 0, 1]])})
    routed = torch.arange(2 * 5 * 1 * 2).reshape(2, 5, 1, 2)
    out = assemble_rollout(prompts, [[7], [8, 9]], None, n=2, max_tokens=2, pad_token_id=0, routed_experts=routed)
    got = out.batch["routed_experts"]
    assert got.dtype == torch.int16 and got.shape == (2, 5, 1, 2)
    assert (got[0, 0] == -1).all() and (got[0, 4] == -1).all()  # left pad, response pad
    assert torch.equal(got[1, 1:], routed[1, 1:].to(torch.int16))
    agreement = torch.tensor([[0.5, -1.0], [1.0, -1.0]])  # -1: unknown (e.g. a row's last token)
    batch = {"routing_agreement": agreement, "response_mask": torch.tensor([[1, 0], [1, 1]])}
    assert routing_agreement(batch) == {"rollout_vs_actor/routing_agreement": 0.75,
                                        "rollout_vs_actor/routing_agreement_min": 0.5}
    assert routing_agreement({"response_mask": batch["response_mask"]}) == {}
