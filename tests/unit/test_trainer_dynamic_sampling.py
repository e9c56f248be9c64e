"""DAPO's dynamic sampling (trainer/dynamic_sampling.py) with a scripted generator, and the overlong buffer."""
import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.reward import DAPORewardManager, OverlongBuffer, overlong_penalty
from hybridrl.reward.managers import RewardOutput
from hybridrl.trainer.dynamic_sampling import RolloutStream, first_groups, groups_with_signal

N = 3  # samples per prompt


def test_groups_with_signal_keeps_varied_groups_and_singletons():
    # uids shuffled and not contiguous: g1 varies, g2 constant, g3 alone, g4 constant, g5 varies by 1e-9
    uids = ["g1", "g2", "g3", "g1", "g2", "g4", "g4", "g1", "g5", "g5"]
    values = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.5 + 1e-9]
    rows, kept, total = groups_with_signal(values, uids)
    assert rows == [0, 2, 3, 7, 8, 9] and (kept, total) == (3, 5)


def prompts_stream(batches, prompts_per_batch=4):
    for b in range(batches):
        ids = torch.arange(prompts_per_batch) + 100 * b
        yield DataProto.from_dict({"pid": ids}, meta_info={"epoch": b // 10})


class Scripted:
    """A Sampler's generate and score. generate: n samples per prompt with uid; scores follow
    `signal(batch_no, prompt_no)` (True: the group's samples differ). Records the steps, draw numbers and weight
    versions it is called with."""

    def __init__(self, signal):
        self.signal, self.calls, self.batch_no = signal, [], 0

    def generate(self, prompts, step, draw, version):
        assert version == step - 1  # generated on the weights after the steps before it
        self.calls.append((step, draw))
        pids = prompts.batch["pid"].repeat_interleave(N)
        uids = np.array([f"u{int(p)}" for p in pids], dtype=object)
        scores = torch.zeros(len(pids), 2)
        for k in range(len(prompts.batch["pid"])):
            if self.signal(self.batch_no, k):
                scores[k * N, -1] = 1.0  # one sample of the group scores differently
        self.batch_no += 1
        return DataProto.from_dict({"token_level_scores": scores, "pid": pids}, {"uid": uids},
                                   {"metrics": {"rollout/batch": float(self.batch_no)}})

    @staticmethod
    def score(batch):
        return batch


def stream(signal, batches=20, steps=2, max_gen=0, start=0):
    s = Scripted(signal)
    return s, RolloutStream(prompts_stream(batches), s, start_step=start, steps=steps,
                            train_batch_size=4, filter_metric="reward", max_num_gen_batches=max_gen)


def test_keeps_generating_until_enough_groups_and_cuts_the_surplus():
    # batch 0: prompts 0 and 2 vary; batch 1: prompts 1, 2, 3 vary -> 2 + 3 = 5 groups >= 4 after 2 batches;
    # the surplus group is cut so the step trains on exactly 4 groups x N samples
    varied = {0: {0, 2}, 1: {1, 2, 3}, 2: {0, 1, 2, 3}}
    s, rollouts = stream(lambda b, k: k in varied.get(b, set()))
    first, second = list(rollouts)
    assert first.metrics["train/num_gen_batches"] == 2.0
    assert first.metrics["train/kept_groups_fraction"] == 5 / 8
    assert first.metrics["rollout/batch"] == 2.0  # the last batch's generation metrics are passed on
    assert len(first.batch) == 4 * N
    assert sorted(set(first.batch.batch["pid"].tolist())) == [0, 2, 101, 102]  # first 4 kept groups, whole
    assert second.metrics["train/num_gen_batches"] == 1.0 and len(second.batch) == 4 * N
    assert s.calls == [(1, 0), (1, 1), (2, 0)]  # draws number the batches of a step: distinct sampling seeds
    assert first.timing["gen"] >= 0 and first.timing["reward"] >= 0


def test_gives_up_after_max_num_gen_batches():
    _, rollouts = stream(lambda b, k: k == 0, max_gen=3)  # one varied group per batch
    with pytest.raises(RuntimeError, match="step 1: 3 generation batches gave 3 prompt groups.*max_num_gen_batches"):
        next(iter(rollouts))


def test_no_filter_is_one_batch_per_step_and_the_stream_ends_with_the_prompts():
    s = Scripted(lambda b, k: False)
    rollouts = list(RolloutStream(prompts_stream(3), s, start_step=5, steps=10, train_batch_size=4))
    assert len(rollouts) == 3 and all(len(r.batch) == 4 * N and "train/num_gen_batches" not in r.metrics
                                      for r in rollouts)
    assert s.calls == [(6, 0), (7, 0), (8, 0)]


def test_filter_on_a_reward_field_names_the_missing_one():
    s = Scripted(lambda b, k: True)
    rollouts = RolloutStream(prompts_stream(2), s, start_step=0, steps=1, train_batch_size=4,
                             filter_metric="acc")
    with pytest.raises(KeyError, match="metric=acc: the reward function returned no 'acc' field"):
        next(iter(rollouts))


def test_first_groups_keeps_whole_groups_in_order():
    batch = DataProto.from_dict({"x": torch.arange(6)}, {"uid": np.array(["b", "a", "b", "c", "a", "c"], dtype=object)})
    assert first_groups(batch, 2).batch["x"].tolist() == [0, 1, 2, 4]


# ============================================================== overlong buffer
def test_overlong_penalty_hand():
    # max 10, buffer 4: no penalty up to 6 tokens, then -(L - 6) / 4 * factor, -factor at 10
    lengths = torch.tensor([3, 6, 7, 8, 10])
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4, 2.0),
                               torch.tensor([0.0, 0.0, -0.5, -1.0, -2.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="overlong_buffer.len=11"):
        overlong_penalty(lengths, 10, 11, 1.0)


class Fixed:
    """A reward manager returning score 1 on each row's last response token."""

    def __call__(self, data):
        mask = data.batch["response_mask"]
        reward = torch.zeros(mask.shape)
        for i, row in enumerate(mask):
            reward[i, int(row.nonzero().max()) if row.any() else 0] = 1.0
        return RewardOutput(reward, {})


def test_overlong_buffer_adds_the_penalty_at_the_last_token():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    data = DataProto.from_dict({"responses": torch.zeros(3, 4, dtype=torch.long), "response_mask": mask})
    out = OverlongBuffer(Fixed(), max_response_length=4, buffer_len=2, penalty_factor=1.0, log=True)(data)
    # lengths 2, 4, 3 against an expected 2: penalties 0, -1, -0.5
    torch.testing.assert_close(out.reward_tensor, torch.tensor([[0, 1.0, 0, 0], [0, 0, 0, 0.0], [0, 0, 0.5, 0]]))
    assert out.reward_extra_info == {"overlong_reward": [0.0, -1.0, -0.5], "overlong": [False, True, True]}


def test_dapo_manager_reports_a_number_as_acc():
    manager = DAPORewardManager(tokenizer=None, compute_score=lambda **kw: 1.0)
    score, extras = manager.check_result(0.5, lambda: "sample")
    assert (score, extras) == (0.5, {"acc": 0.5})
    assert manager.check_result({"score": 1.0, "fmt": 0.1}, lambda: "sample") == (1.0, {"score": 1.0, "fmt": 0.1})
