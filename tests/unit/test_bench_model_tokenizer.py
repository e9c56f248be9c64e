"""The random benchmark models' tokenizer (benchmarks/multi_gpu_bench.py model) as transformers loads it back."""
import importlib.util
import os

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "multi_gpu_bench.py")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("multi_gpu_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = str(tmp_path_factory.mktemp("m_tiny"))
    bench.make_model(out, "tiny", weights=False)
    return out


def test_newline_is_one_token_that_decodes_back(folder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)  # a qwen2 config.json: transformers picks Qwen2Tokenizer
    ids = tok.encode("\n", add_special_tokens=False)
    assert len(ids) == 1, (type(tok).__name__, ids)
    text = "12+3=\n45"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_chat_template_turns_end_with_im_end_and_newline(folder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template([{"role": "user", "content": "1+2="}], tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    im_end, newline = tok.convert_tokens_to_ids("<|im_end|>"), tok.encode("\n", add_special_tokens=False)[0]
    assert im_end in ids and ids[ids.index(im_end) + 1] == newline
