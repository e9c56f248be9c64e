"""RLHFDataset items (exact ids), truncation modes, overlong filtering counts, custom classes, collation."""
import logging
import textwrap

import numpy as np
import pytest
import torch

from hybridrl.config.schema.common import CustomClsConfig
from hybridrl.config.schema.data import DataConfig
from hybridrl.data import PromptTooLongError, RLHFDataset, build_tiny_tokenizer, collate_to_dataproto, create_rl_dataset
from tests.fixtures.data_helpers import TEMPLATE_OVERHEAD, rows_with_lengths, verl_row, write_rows


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def ids(tok, tokens):
    out = tok.convert_tokens_to_ids(tokens)
    assert tok.unk_token_id not in out
    return out


def template_tokens(content):
    return ["<|im_start|>", "user", "\n", *content, "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"]


def test_item_matches_verl_layout(tmp_path, tok):
    path = write_rows([verl_row("3+4=", truth="7", index=41)], str(tmp_path / "d.parquet"))
    ds = RLHFDataset([path], tok, DataConfig(max_prompt_length=16, return_raw_chat=True, return_full_prompt=True))
    item = ds[0]
    prompt = ids(tok, template_tokens("3+4="))  # 12 tokens
    assert len(prompt) == 12
    assert item["input_ids"].tolist() == [tok.pad_token_id] * 4 + prompt
    assert tok.pad_token_id == 0 and tok.pad_token_id != tok.eos_token_id
    assert item["attention_mask"].tolist() == [0] * 4 + [1] * 12
    assert item["position_ids"].tolist() == [0] * 4 + list(range(12))
    assert item["raw_prompt_ids"] == prompt
    assert item["raw_prompt"] == [{"role": "user", "content": "3+4="}]
    assert item["full_prompts"] == "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    assert item["index"] == 41
    assert item["data_source"] == "openai/gsm8k" and item["ability"] == "math"
    assert item["reward_model"] == {"style": "rule", "ground_truth": "7"}
    assert item["extra_info"] == {"split": "train", "index": 41}
    assert "prompt" not in item
    assert set(item) == {"input_ids", "attention_mask", "position_ids", "raw_prompt_ids", "raw_prompt", "full_prompts",
                         "index", "data_source", "ability", "reward_model", "extra_info"}


def test_string_prompt_is_one_user_message_and_index_fallback(tmp_path, tok):
    path = write_rows([{"prompt": "ab", "data_source": "arithmetic"}], str(tmp_path / "s.jsonl"))
    item = RLHFDataset(path, tok, DataConfig(max_prompt_length=10))[0]
    assert item["raw_prompt_ids"] == ids(tok, template_tokens("ab"))
    assert item["index"] == 0  # no extra_info.index: the position in the dataset
    assert "raw_prompt" not in item and "full_prompts" not in item


def test_chat_template_kwargs_are_passed(tmp_path):
    tok = build_tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                         "{% if shout %}!{% endif %}")
    path = write_rows([verl_row("abc")], str(tmp_path / "d.jsonl"))
    plain = RLHFDataset(path, tok, DataConfig(max_prompt_length=8))[0]["raw_prompt_ids"]
    loud = RLHFDataset(path, tok, DataConfig(max_prompt_length=8, apply_chat_template_kwargs={"shout": True}))[0]
    assert plain == ids(tok, list("abc")) and loud["raw_prompt_ids"] == ids(tok, list("abc!"))


@pytest.mark.parametrize("mode,expected", [
    ("left", ["b", "c", "d", "e", "f", "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"]),
    ("right", ["<|im_start|>", "user", "\n", "a", "b", "c", "d", "e", "f", "<|im_end|>"]),
    ("middle", ["<|im_start|>", "user", "\n", "a", "b", "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"]),
])
def test_truncation_modes_exact_ids(tmp_path, tok, mode, expected):
    path = write_rows([verl_row("abcdef")], str(tmp_path / "d.parquet"))  # 14 tokens
    item = RLHFDataset(path, tok, DataConfig(max_prompt_length=10, truncation=mode))[0]
    assert item["input_ids"].tolist() == ids(tok, expected)
    assert item["raw_prompt_ids"] == ids(tok, expected)
    assert item["attention_mask"].tolist() == [1] * 10
    assert item["position_ids"].tolist() == list(range(10))


def test_truncation_error_names_file_row_and_length(tmp_path, tok):
    a = write_rows(rows_with_lengths([2, 2]), str(tmp_path / "a.parquet"))
    b = write_rows(rows_with_lengths([2, 2, 5, 9]), str(tmp_path / "b.parquet"))
    with pytest.raises(PromptTooLongError) as e:
        RLHFDataset([a, b], tok, DataConfig(max_prompt_length=12, truncation="error"))
    assert str(e.value) == (
        f"{b}: row 2, column 'prompt': prompt is 13 tokens after the chat template, over data.max_prompt_length=12 "
        "(data.truncation=error); 2 of 6 prompts are over. Set data.filter_overlong_prompts=True to drop them, or "
        "data.truncation=left|right|middle")


def test_filter_overlong_prompts_counts_exactly(tmp_path, tok, caplog):
    max_len = 20  # content of at most 12 characters fits
    a = write_rows(rows_with_lengths([5, 12, 13, 30, 1], 0), str(tmp_path / "a.parquet"))
    b = write_rows(rows_with_lengths([12, 40], 100), str(tmp_path / "b.arrow"))
    with caplog.at_level(logging.WARNING, logger="hybridrl.data.dataset"):
        ds = RLHFDataset([a, b], tok, DataConfig(max_prompt_length=max_len, filter_overlong_prompts=True))
    assert ds.num_rows_read == 7
    assert ds.num_filtered_overlong == 3
    assert ds.filtered_overlong == [(a, 2, 13 + TEMPLATE_OVERHEAD), (a, 3, 30 + TEMPLATE_OVERHEAD),
                                    (b, 1, 40 + TEMPLATE_OVERHEAD)]
    assert len(ds) == 4
    assert [ds[i]["index"] for i in range(4)] == [0, 1, 4, 100]
    assert [ds.source_of(i) for i in range(4)] == [(a, 0), (a, 1), (a, 4), (b, 0)]
    assert "dropped 3 of 7 prompts longer than max_prompt_length=20" in caplog.text


def test_filter_with_left_truncation_and_all_filtered(tmp_path, tok):
    path = write_rows(rows_with_lengths([30, 31]), str(tmp_path / "a.jsonl"))
    with pytest.raises(ValueError, match=r"all 2 prompts are longer than data.max_prompt_length=20"):
        RLHFDataset(path, tok, DataConfig(max_prompt_length=20, filter_overlong_prompts=True, truncation="left"))
    ds = RLHFDataset(path, tok, DataConfig(max_prompt_length=20, truncation="left"))
    assert ds.num_filtered_overlong == 0 and len(ds) == 2 and ds[1]["input_ids"].shape == (20,)


def test_max_samples_before_filtering(tmp_path, tok):
    path = write_rows(rows_with_lengths([1, 30, 2, 3, 4]), str(tmp_path / "a.parquet"))
    cfg = DataConfig(max_prompt_length=20, filter_overlong_prompts=True, train_max_samples=3, val_max_samples=4)
    train = create_rl_dataset([path], cfg, tok, is_train=True)
    val = create_rl_dataset([path], cfg, tok, is_train=False)
    assert (train.num_rows_read, train.num_filtered_overlong, len(train)) == (3, 1, 2)
    assert (val.num_rows_read, val.num_filtered_overlong, len(val)) == (4, 1, 3)
    assert [train[i]["index"] for i in range(2)] == [0, 2]


def test_bad_truncation_mode_and_processor(tmp_path, tok):
    path = write_rows([verl_row("a")], str(tmp_path / "a.jsonl"))
    with pytest.raises(ValueError, match=r"data.truncation='cut': expected one of error, left, right, middle"):
        RLHFDataset(path, tok, DataConfig(truncation="cut"))
    with pytest.raises(NotImplementedError, match="multimodal"):
        RLHFDataset(path, tok, DataConfig(), processor=object())


def test_collate_to_dataproto(tmp_path, tok):
    path = write_rows(rows_with_lengths([1, 3]), str(tmp_path / "a.parquet"))
    ds = RLHFDataset(path, tok, DataConfig(max_prompt_length=12))
    batch = collate_to_dataproto([ds[0], ds[1]])
    assert sorted(batch.batch) == ["attention_mask", "input_ids", "position_ids"]
    assert sorted(batch.non_tensor_batch) == ["ability", "data_source", "extra_info", "index", "raw_prompt_ids",
                                              "reward_model"]
    assert batch.batch["input_ids"].shape == (2, 12) and batch.batch["input_ids"].dtype == torch.long
    assert batch.batch["attention_mask"].sum(-1).tolist() == [9, 11]
    assert batch.non_tensor_batch["reward_model"].dtype == object
    assert batch.non_tensor_batch["reward_model"][1] == {"style": "rule", "ground_truth": "3"}
    assert batch.non_tensor_batch["raw_prompt_ids"][0] == ids(tok, template_tokens("a"))
    assert list(batch.non_tensor_batch["index"]) == [0, 1]
    with pytest.raises(ValueError, match="item 1 has keys"):
        collate_to_dataproto([ds[0], {"input_ids": torch.zeros(12)}])


CUSTOM = textwrap.dedent('''
    from hybridrl.data import RLHFDataset

    class Duck:
        def __init__(self, data_files, tokenizer, config, processor=None):
            self.n = 7
            self.files = data_files
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            return {"i": i}

    class Sub(RLHFDataset):
        def __getitem__(self, i):
            item = super().__getitem__(i)
            item["tag"] = "sub"
            return item

    class WrongSig:
        def __init__(self, files, tok):
            pass
        def __len__(self):
            return 1
        def __getitem__(self, i):
            return {}

    class NoLen:
        def __init__(self, data_files, tokenizer, config, processor=None):
            pass

    def not_a_class(data_files, tokenizer, config, processor=None):
        return []
''')


@pytest.fixture
def custom_file(tmp_path):
    path = tmp_path / "my_dataset.py"
    path.write_text(CUSTOM)
    return str(path)


def test_custom_dataset_class_by_path(tmp_path, tok, custom_file):
    data = write_rows(rows_with_lengths([1, 2, 3]), str(tmp_path / "a.parquet"))
    duck = create_rl_dataset([data], DataConfig(custom_cls=CustomClsConfig(custom_file, "Duck"), train_max_samples=5),
                             tok)
    assert len(duck) == 5 and duck[4] == {"i": 4} and duck.files == [data]  # max_samples through a view
    with pytest.raises(IndexError):
        duck[5]
    sub = create_rl_dataset([data], DataConfig(custom_cls=CustomClsConfig(custom_file, "Sub"), max_prompt_length=12,
                                               train_max_samples=2), tok)
    assert type(sub).__name__ == "Sub" and len(sub) == 2
    assert sub[1]["tag"] == "sub" and sub[1]["reward_model"]["ground_truth"] == "2"


@pytest.mark.parametrize("name,exc,message", [
    ("WrongSig", TypeError, r"data.custom_cls .*my_dataset.py:WrongSig: its constructor must accept \(data_files, "
                            r"tokenizer, config, processor=None\)"),
    ("NoLen", TypeError, r"my_dataset.py:NoLen has no \['__len__', '__getitem__'\]"),
    ("not_a_class", TypeError, r"my_dataset.py:not_a_class is a function, expected a dataset class"),
    ("Missing", AttributeError, r"data.custom_cls.name=Missing: .*my_dataset.py defines no 'Missing'"),
])
def test_custom_dataset_class_errors(tmp_path, tok, custom_file, name, exc, message):
    data = write_rows(rows_with_lengths([1]), str(tmp_path / "a.parquet"))
    with pytest.raises(exc, match=message):
        create_rl_dataset([data], DataConfig(custom_cls=CustomClsConfig(custom_file, name)), tok)


def test_custom_dataset_missing_file(tmp_path, tok):
    with pytest.raises(FileNotFoundError, match=r"data.custom_cls.path=.*nope.py: no such file"):
        create_rl_dataset(["x.parquet"], DataConfig(custom_cls=CustomClsConfig(str(tmp_path / "nope.py"), "X")), tok)


def test_rows_are_independent_of_numpy_arrays(tmp_path, tok):
    """Parquet list<struct> prompts arrive as Python lists of dicts, not numpy arrays."""
    path = write_rows([verl_row("ab")], str(tmp_path / "a.parquet"))
    ds = RLHFDataset(path, tok, DataConfig(max_prompt_length=12, return_raw_chat=True))
    assert isinstance(ds[0]["raw_prompt"], list) and not isinstance(ds[0]["raw_prompt"], np.ndarray)
