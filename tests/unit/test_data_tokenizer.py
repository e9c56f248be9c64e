"""build_tiny_tokenizer (char-level and byte-BPE, ChatML) and load_tokenizer (HF folder, GGUF, fallbacks)."""
import os

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import hybridrl.data.tokenizer as tokmod
from hybridrl.data import build_tiny_tokenizer, load_tokenizer

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "3+4="}]
RENDERED = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"


def test_char_tokenizer_template_ids_and_decode():
    tok = build_tiny_tokenizer()
    assert isinstance(tok, PreTrainedTokenizerFast)
    text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert text == RENDERED
    assert [tok.pad_token, tok.unk_token, tok.bos_token, tok.eos_token] == ["<|pad|>", "<|unk|>", "<|endoftext|>",
                                                                            "<|im_end|>"]
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id] == [0, 2, 4]
    enc = tok("3+4=7", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(enc) == ["3", "+", "4", "=", "7"]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids[:4]) == ["<|im_start|>", "system", "\n", "b"]
    assert tok.decode(ids) == text
    assert tok.decode(tok("7", add_special_tokens=False)["input_ids"] + [tok.eos_token_id, 0, 0],
                      skip_special_tokens=True) == "7"
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]


def test_alphabet_argument_limits_vocab():
    tok = build_tiny_tokenizer(alphabet="0123456789+=\n ")
    assert len(tok) == 5 + 14 + 3  # specials + characters + role names
    assert tok.convert_ids_to_tokens(tok("12+a", add_special_tokens=False)["input_ids"]) == ["1", "2", "+", "<|unk|>"]


def test_bpe_from_texts_round_trips_any_text():
    texts = ["the cat sat on the mat", "3 + 4 = 7", "the answer is 42"] * 20
    tok = build_tiny_tokenizer(texts, vocab_size=300)
    assert 261 <= len(tok) <= 300
    for s in ["the cat", "ünïcode ✓ 42", RENDERED]:
        assert tok.decode(tok(s, add_special_tokens=False)["input_ids"]) == s
    assert len(tok("the cat sat", add_special_tokens=False)["input_ids"]) < len("the cat sat")  # merges learned
    with pytest.raises(ValueError, match="vocab_size=100 is below"):
        build_tiny_tokenizer(texts, vocab_size=100)
    with pytest.raises(ValueError, match="not both"):
        build_tiny_tokenizer(texts, alphabet="ab")


@pytest.mark.parametrize("mode", ["chars", "bpe"])
def test_save_pretrained_round_trip(tmp_path, mode):
    tok = build_tiny_tokenizer() if mode == "chars" else build_tiny_tokenizer(["hello world"] * 5, vocab_size=280)
    tok.save_pretrained(tmp_path)
    for loaded in (AutoTokenizer.from_pretrained(tmp_path), load_tokenizer(str(tmp_path))):
        assert loaded.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False) == RENDERED
        assert loaded(RENDERED, add_special_tokens=False)["input_ids"] == tok(RENDERED, add_special_tokens=False)["input_ids"]
        assert (loaded.pad_token_id, loaded.eos_token_id, loaded.bos_token_id) == (tok.pad_token_id, tok.eos_token_id,
                                                                                  tok.bos_token_id)
        assert loaded.decode(tok(RENDERED, add_special_tokens=False)["input_ids"], skip_special_tokens=True) == \
            tok.decode(tok(RENDERED, add_special_tokens=False)["input_ids"], skip_special_tokens=True)


def test_load_tokenizer_pad_fallback_and_no_template(tmp_path):
    base = build_tiny_tokenizer()
    no_pad = PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, eos_token="<|im_end|>",
                                     chat_template=tokmod.CHATML_TEMPLATE)
    no_pad.save_pretrained(tmp_path / "nopad")
    tok = load_tokenizer(str(tmp_path / "nopad"))
    assert tok.pad_token == "<|im_end|>" and tok.pad_token_id == base.eos_token_id
    bare = PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, eos_token="<|im_end|>")
    bare.save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError, match=r"bare: has no chat template"):
        load_tokenizer(str(tmp_path / "bare"))
    assert load_tokenizer(str(tmp_path / "bare"), require_chat_template=False).pad_token == "<|im_end|>"
    with pytest.raises(FileNotFoundError, match="not a local folder"):
        load_tokenizer(str(tmp_path / "nowhere"))


def write_tiny_gguf(path):
    """A GGUF file holding only a (byte-level BPE) tokenizer with a ChatML template and no pad token."""
    import gguf

    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ", "hi"]
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(64), w.add_embedding_length(8), w.add_block_count(1), w.add_feed_forward_length(16)
    w.add_head_count(2), w.add_head_count_kv(2), w.add_layer_norm_rms_eps(1e-5), w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("default"), w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3)), w.add_token_merges(["h i"])
    w.add_token_scores([0.0] * len(tokens)), w.add_bos_token_id(0), w.add_eos_token_id(2)
    w.add_chat_template(tokmod.CHATML_TEMPLATE)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


def test_load_tokenizer_from_gguf(tmp_path):
    pytest.importorskip("gguf")
    write_tiny_gguf(str(tmp_path / "tiny.gguf"))
    for tok in (load_tokenizer(str(tmp_path), gguf_file="tiny.gguf"), load_tokenizer(str(tmp_path / "tiny.gguf"))):
        assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|im_end|>"  # pad falls back to eos
        text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
        assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1  # <|im_start|> twice, <|im_end|> once
        assert tok.decode(ids) == text
    with pytest.raises(FileNotFoundError, match="no GGUF file 'other.gguf'"):
        load_tokenizer(str(tmp_path), gguf_file="other.gguf")


def test_gguf_without_package_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    real = tokmod.importlib.util.find_spec
    monkeypatch.setattr(tokmod.importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ImportError, match=r"m.gguf: reading GGUF files needs the 'gguf' package \(pip install gguf\)"):
        load_tokenizer(str(tmp_path), gguf_file="m.gguf")
    assert os.path.exists(tmp_path / "m.gguf")


def test_gguf_special_tokens_win_over_what_transformers_read(tmp_path, monkeypatch):
    # transformers 5.17 (the GPU host's) read SmolLM2's GGUF with eos <|im_start|> and no pad, where the file says
    # eos 2 and pad 2 (reproduced with 5.17.0 installed apart, 2026-11-28); here that misreading is imposed on the
    # tiny file, whose metadata says bos 0, eos 2 and no pad
    pytest.importorskip("gguf")
    write_tiny_gguf(str(tmp_path / "tiny.gguf"))
    from hybridrl.utils.gguf_tokens import gguf_special_token_ids

    assert gguf_special_token_ids(str(tmp_path / "tiny.gguf")) == {"bos_token": 0, "eos_token": 2}
    from transformers import AutoTokenizer

    real = AutoTokenizer.from_pretrained

    def misread(*args, **kwargs):
        tok = real(*args, **kwargs)
        tok.eos_token, tok.pad_token = "<|im_start|>", None
        return tok

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", misread)
    tok = load_tokenizer(str(tmp_path), gguf_file="tiny.gguf")
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token) == ("<|im_end|>", 2, "<|im_end|>")
    assert tok.bos_token == "<|endoftext|>"
