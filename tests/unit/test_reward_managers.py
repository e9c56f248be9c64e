"""Reward managers: score on the last valid token, extra info, batch mode, errors that name the sample,
custom functions loaded by path, the registry."""
import math
import textwrap

import numpy as np
import pytest
import torch

from hybridrl.config.schema.critic import CustomRewardFunctionConfig
from hybridrl.data import build_tiny_tokenizer
from hybridrl.protocol import DataProto
from hybridrl.reward import (
    REWARD_MANAGERS,
    BatchRewardManager,
    NaiveRewardManager,
    RewardFunctionError,
    RewardManager,
    RewardOutput,
    load_reward_fn,
    register_reward_manager,
)


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


R = 6


def make_batch(tok, responses, sources, truths, mask_kind="response_mask", prompt_len=3, extra=None):
    """responses: strings; each encoded, followed by <|im_end|> when it fits, right-padded to R."""
    ids, mask = [], []
    for text in responses:
        t = tok(text, add_special_tokens=False)["input_ids"]
        t = (t + [tok.eos_token_id])[:R] if text else []
        ids.append(t + [tok.pad_token_id] * (R - len(t)))
        mask.append([1] * len(t) + [0] * (R - len(t)))
    tensors = {"responses": torch.tensor(ids)}
    m = torch.tensor(mask)
    if mask_kind == "response_mask":
        tensors["response_mask"] = m
    else:  # attention over [prompt | response]
        tensors["attention_mask"] = torch.cat([torch.ones(len(responses), prompt_len, dtype=torch.long), m], dim=1)
    non_tensor = {"data_source": sources, "reward_model": [{"style": "rule", "ground_truth": g} for g in truths],
                  "index": [100 + i for i in range(len(responses))]}
    if extra is not None:
        non_tensor["extra_info"] = extra
    return DataProto.from_dict(tensors, non_tensor)


@pytest.mark.parametrize("mask_kind", ["response_mask", "attention_mask"])
def test_naive_scores_on_last_valid_token(tok, mask_kind):
    data = make_batch(tok, ["7", "12", "123456", "9"], ["arithmetic"] * 3 + ["openai/gsm8k"],
                      ["7", "13", "123456", "9"], mask_kind)
    out = load_reward_fn(None, "naive", tok)(data)
    assert isinstance(out, RewardOutput)
    expected = torch.zeros(4, R)
    expected[0, 1] = 1.0   # "7" + eos: last valid token is the eos at 1
    expected[1, 2] = 0.0   # "12" + eos, wrong answer
    expected[2, 5] = 1.0   # "123456" fills R: no eos, last token at 5
    expected[3, 1] = 0.0   # gsm8k strict needs '#### '
    assert torch.equal(out.reward_tensor, expected)
    assert out.reward_tensor.dtype == torch.float32
    assert out.reward_extra_info == {}


def test_holes_in_mask_and_empty_response(tok):
    data = make_batch(tok, ["12", ""], ["arithmetic", "arithmetic"], ["12", "0"])
    data.batch["response_mask"][0] = torch.tensor([1, 0, 1, 0, 0, 0])  # a masked middle token
    seen = []
    fn = lambda data_source, solution_str, ground_truth, extra_info: seen.append(solution_str) or 0.5  # noqa: E731
    out = NaiveRewardManager(tok, fn)(data)
    assert seen == ["12", ""]  # decoded through the last valid token; an empty response is ""
    assert out.reward_tensor[0].tolist() == [0, 0, 0.5, 0, 0, 0]
    assert out.reward_tensor[1].tolist() == [0.5, 0, 0, 0, 0, 0]


def test_dict_results_fill_extra_info(tok):
    def fn(data_source, solution_str, ground_truth, extra_info):
        if solution_str == "x":
            return 0.25
        return {"score": float(solution_str == ground_truth), "acc": solution_str == ground_truth,
                "split": extra_info["split"]}

    data = make_batch(tok, ["7", "x", "8"], ["arithmetic"] * 3, ["7", "0", "9"],
                      extra=[{"split": "a"}, {"split": "b"}, {"split": "c"}])
    out = NaiveRewardManager(tok, fn)(data)
    assert out.reward_extra_info == {"score": [1.0, 0.25, 0.0], "acc": [True, None, False], "split": ["a", None, "c"]}
    assert out.reward_tensor.sum(-1).tolist() == [1.0, 0.25, 0.0]


def test_extra_info_is_a_copy_and_reward_kwargs_pass_through(tok, tmp_path):
    path = tmp_path / "rf.py"
    path.write_text(textwrap.dedent('''
        def my_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
            extra_info["touched"] = True
            return float(solution_str == ground_truth) + bonus
    '''))
    extra = [{"split": "t"}, {"split": "t"}]
    data = make_batch(tok, ["3", "4"], ["arithmetic"] * 2, ["3", "5"], extra=extra)
    cfg = CustomRewardFunctionConfig(path=str(path), name="my_score", reward_kwargs={"bonus": 0.5})
    out = load_reward_fn(cfg, "naive", tok)(data)
    assert out.reward_tensor.sum(-1).tolist() == [1.5, 0.5]
    assert list(data.non_tensor_batch["extra_info"]) == [{"split": "t"}, {"split": "t"}]


def test_batch_manager_calls_once_with_lists(tok):
    calls = []

    def batched(data_sources, solution_strs, ground_truths, extra_infos, scale=1.0):
        calls.append((list(data_sources), list(solution_strs), list(ground_truths), list(extra_infos)))
        return [{"score": scale * float(s == g), "len": len(s)} for s, g in zip(solution_strs, ground_truths)]

    data = make_batch(tok, ["12", "3"], ["arithmetic", "arithmetic"], ["12", "4"], extra=[None, {"k": 1}])
    out = BatchRewardManager(tok, batched, reward_kwargs={"scale": 2.0})(data)
    assert calls == [(["arithmetic", "arithmetic"], ["12", "3"], ["12", "4"], [None, {"k": 1}])]
    expected = torch.zeros(2, R)
    expected[0, 2] = 2.0
    assert torch.equal(out.reward_tensor, expected)
    assert out.reward_extra_info == {"score": [2.0, 0.0], "len": [2, 1]}


def test_batch_manager_default_and_bad_lengths(tok):
    data = make_batch(tok, ["#### 5", "9"], ["openai/gsm8k", "arithmetic"], ["5", "9"])
    out = load_reward_fn(CustomRewardFunctionConfig(), "batch", tok)(data)
    assert out.reward_tensor.sum(-1).tolist() == [1.0, 1.0]
    assert out.reward_tensor[0, 5].item() == 1.0  # "#### 5" is 6 tokens: no room for eos
    with pytest.raises(RewardFunctionError, match=r"returned 1 results for 2 samples"):
        BatchRewardManager(tok, lambda **kw: [1.0])(data)
    with pytest.raises(RewardFunctionError, match=r"returned float results for 2 samples"):
        BatchRewardManager(tok, lambda **kw: 1.0)(data)


def test_exception_surfaces_with_the_sample(tok):
    def fn(data_source, solution_str, ground_truth, extra_info):
        if ground_truth == "bad":
            raise ValueError("cannot parse ground truth")
        return 1.0

    long = "1" * 300
    data = make_batch(tok, ["7", long], ["arithmetic", "arithmetic"], ["7", "bad"])
    data.batch["responses"] = torch.cat([data.batch["responses"], torch.zeros(2, 300 - R, dtype=torch.long)], dim=1)
    data.batch["response_mask"] = torch.cat([data.batch["response_mask"], torch.zeros(2, 300 - R, dtype=torch.long)], 1)
    data.batch["responses"][1] = torch.tensor(tok(long, add_special_tokens=False)["input_ids"])
    data.batch["response_mask"][1] = 1
    with pytest.raises(RewardFunctionError) as e:
        NaiveRewardManager(tok, fn)(data)
    msg = str(e.value)
    assert msg.startswith("compute_score raised ValueError: cannot parse ground truth on sample 1 (index=101, "
                          "data_source='arithmetic', ground_truth='bad', response[:200]=")
    assert repr("1" * 200 + "...") in msg and "1" * 201 not in msg
    assert isinstance(e.value.__cause__, ValueError)
    assert e.value.__cause__.__traceback__ is not None


def test_batched_exception_names_the_batch(tok):
    def batched(data_sources, solution_strs, ground_truths, extra_infos):
        raise KeyError("boom")

    data = make_batch(tok, ["1", "2"], ["arithmetic", "openai/gsm8k"], ["1", "2"])
    with pytest.raises(RewardFunctionError, match=r"batched compute_score raised KeyError: 'boom' on a batch of 2 "
                                                  r"samples \(data_sources \['arithmetic', 'openai/gsm8k'\]\); first "
                                                  r"sample 0 \(index=100") as e:
        BatchRewardManager(tok, batched)(data)
    assert isinstance(e.value.__cause__, KeyError)


@pytest.mark.parametrize("result,problem", [
    (float("nan"), "compute_score returned nan for sample 1"),
    (float("inf"), "compute_score returned inf for sample 1"),
    (None, "compute_score returned None (NoneType), expected a number or a dict with a numeric 'score', for sample 1"),
    ("1.0", "compute_score returned '1.0' (str), expected a number"),
    ({"acc": 1.0}, "compute_score returned a dict without 'score' (keys ['acc']) for sample 1"),
    ({"score": float("nan")}, "compute_score returned nan for sample 1"),
    # finite in float64, inf in the float32 reward tensor
    (1e39, "compute_score returned 1e+39, outside the float32 range of the reward tensor (|score| <= 3.403e+38; it "
           "would become inf) for sample 1"),
    ({"score": -1e39}, "compute_score returned -1e+39, outside the float32 range"),
])
def test_non_scores_are_rejected_with_the_sample(tok, result, problem):
    data = make_batch(tok, ["1", "2"], ["arithmetic"] * 2, ["1", "2"])
    fn = lambda data_source, solution_str, ground_truth, extra_info: 1.0 if solution_str == "1" else result  # noqa
    with pytest.raises(RewardFunctionError) as e:
        NaiveRewardManager(tok, fn)(data)
    assert str(e.value).startswith(problem)
    assert "(index=101, data_source='arithmetic', ground_truth='2', response[:200]='2')" in str(e.value)


def test_numpy_torch_and_bool_scores_are_numbers(tok):
    data = make_batch(tok, ["1", "2", "3"], ["arithmetic"] * 3, ["1", "2", "3"])
    results = iter([np.float32(0.5), torch.tensor(2.0), True])
    out = NaiveRewardManager(tok, lambda **kw: next(results))(data)
    assert out.reward_tensor.sum(-1).tolist() == [0.5, 2.0, 1.0]


def test_missing_fields_are_named(tok):
    data = make_batch(tok, ["1"], ["arithmetic"], ["1"])
    data.non_tensor_batch["reward_model"] = np.array([{"style": "rule"}], dtype=object)
    with pytest.raises(RewardFunctionError, match=r"sample 0 \(index=100\): reward_model is \{'style': 'rule'\}"):
        NaiveRewardManager(tok)(data)
    data = make_batch(tok, ["1"], ["arithmetic"], ["1"])
    del data.non_tensor_batch["data_source"]
    with pytest.raises(KeyError, match="no non-tensor 'data_source'"):
        NaiveRewardManager(tok)(data)
    data = make_batch(tok, ["1"], ["arithmetic"], ["1"])
    del data.batch["response_mask"]
    with pytest.raises(KeyError, match="needs 'response_mask'"):
        NaiveRewardManager(tok)(data)


def test_reward_fn_key(tok):
    data = make_batch(tok, ["1"], ["ignored"], ["1"])
    data.non_tensor_batch["task"] = np.array(["arithmetic"], dtype=object)
    out = load_reward_fn(None, "naive", tok, reward_fn_key="task")(data)
    assert out.reward_tensor.sum().item() == 1.0


def test_unknown_data_source_surfaces_as_reward_error(tok):
    data = make_batch(tok, ["1"], ["my/data"], ["1"])
    with pytest.raises(RewardFunctionError, match=r"NotImplementedError: no rule scorer for data_source='my/data'") as e:
        load_reward_fn(None, "naive", tok)(data)
    assert isinstance(e.value.__cause__, NotImplementedError)


CUSTOM = textwrap.dedent('''
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 3.0 if solution_str == ground_truth else -1.0, "source": data_source}

    def batch_score(data_sources, solution_strs, ground_truths, extra_infos):
        return [float(len(s)) for s in solution_strs]

    def two_args(solution_str, ground_truth):
        return 1.0

    NOT_CALLABLE = 3
''')


@pytest.fixture
def custom_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM)
    return str(path)


def test_custom_reward_function_by_path(tok, custom_file):
    data = make_batch(tok, ["5", "6"], ["anything", "else"], ["5", "7"])
    out = load_reward_fn(CustomRewardFunctionConfig(path=custom_file), "naive", tok)(data)
    assert out.reward_tensor.sum(-1).tolist() == [3.0, -1.0]
    assert out.reward_extra_info == {"score": [3.0, -1.0], "source": ["anything", "else"]}
    out = load_reward_fn(CustomRewardFunctionConfig(path=custom_file, name="batch_score"), "batch", tok)(data)
    assert out.reward_tensor.sum(-1).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("name,manager,exc,message", [
    ("two_args", "naive", TypeError, r"custom_reward_function .*my_reward.py:two_args \(reward manager 'naive'\): must "
                                     r"accept keyword arguments \(data_source, solution_str, ground_truth, extra_info\)"),
    ("compute_score", "batch", TypeError, r"must accept keyword arguments \(data_sources, solution_strs"),
    ("missing", "naive", AttributeError, r"custom_reward_function.name=missing: .*my_reward.py defines no 'missing'"),
    ("NOT_CALLABLE", "naive", TypeError, r"defines 'NOT_CALLABLE' as a int, not a function"),
])
def test_custom_reward_function_errors(tok, custom_file, name, manager, exc, message):
    with pytest.raises(exc, match=message):
        load_reward_fn(CustomRewardFunctionConfig(path=custom_file, name=name), manager, tok)


def test_custom_reward_config_errors(tok, tmp_path, custom_file):
    with pytest.raises(FileNotFoundError, match=r"custom_reward_function.path=.*nope.py: no such file"):
        load_reward_fn(CustomRewardFunctionConfig(path=str(tmp_path / "nope.py")), "naive", tok)
    with pytest.raises(ValueError, match="reward_kwargs is set but custom_reward_function.path is not"):
        load_reward_fn(CustomRewardFunctionConfig(reward_kwargs={"x": 1}), "naive", tok)
    with pytest.raises(TypeError, match=r"must accept keyword arguments \(data_source, solution_str, ground_truth, "
                                        r"extra_info, bonus\)"):
        load_reward_fn(CustomRewardFunctionConfig(path=custom_file, reward_kwargs={"bonus": 1}), "naive", tok)


def test_registry_names_did_you_mean_and_user_managers(tok):
    assert {"naive", "batch"} <= set(REWARD_MANAGERS.names())
    assert REWARD_MANAGERS.get("naive") is NaiveRewardManager
    with pytest.raises(ValueError, match=r"reward_model.reward_manager='naiv': unknown reward manager; .*did you mean "
                                         r"'naive'\?"):
        load_reward_fn(None, "naiv", tok)

    @register_reward_manager("constant_test")
    class Constant(RewardManager):
        def __call__(self, data):
            _, last = self.decode_responses(data)
            return self.build_output([0.5] * len(data), [None] * len(data), last, data.batch["responses"].shape)

    try:
        data = make_batch(tok, ["1", "22"], ["x", "y"], ["1", "2"])
        out = load_reward_fn(None, "constant_test", tok)(data)
        assert out.reward_tensor[0, 1].item() == 0.5 and out.reward_tensor[1, 2].item() == 0.5
        assert math.isclose(out.reward_tensor.sum().item(), 1.0)
        with pytest.raises(ValueError, match="already registered"):
            register_reward_manager("constant_test")(NaiveRewardManager)
    finally:
        REWARD_MANAGERS._items.pop("constant_test", None)
