"""Tokenizers: loading a local one (HF folder or GGUF file), and building a tiny one on the fly.

`load_tokenizer` never reaches a model hub: the path must be a local folder (or a .gguf file, or a
folder plus `gguf_file`). A tokenizer without a pad token gets its eos token as pad (verl does the
same); one without a chat template is refused, since every prompt goes through the template.

`build_tiny_tokenizer` makes a small PreTrainedTokenizerFast with a ChatML template for tests and
the CPU demo, in milliseconds and offline:
  * alphabet mode (default): one token per character of `alphabet` (unknown characters -> <|unk|>),
    plus the role names as whole tokens, so "<|im_start|>user\\n3+4=<|im_end|>\\n<|im_start|>assistant\\n"
    is 12 tokens;
  * texts mode: a byte-level BPE trained on `texts` (any text encodes, no unknowns).
Special tokens: bos <|endoftext|>, eos <|im_end|> (a chat model ends its turn with it), pad <|pad|>
(distinct from eos, so a pad/eos mix-up shows in tests), <|im_start|>. Token ids: pad 0, then the others.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import string
from typing import Iterable, Optional, Sequence

from hybridrl.utils.gguf_tokens import pin_gguf_special_tokens

__all__ = ["load_tokenizer", "build_tiny_tokenizer", "CHATML_TEMPLATE", "DEFAULT_ALPHABET"]

logger = logging.getLogger(__name__)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PAD, UNK, BOS, IM_START, EOS = "<|pad|>", "<|unk|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
ROLE_TOKENS = ("system", "user", "assistant")
DEFAULT_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"


def load_tokenizer(path: str, gguf_file: Optional[str] = None, trust_remote_code: bool = False,
                   require_chat_template: bool = True):
    """A local tokenizer: an HF folder, a folder with `gguf_file` inside, or a path to a .gguf file."""
    from transformers import AutoTokenizer

    path = os.path.expanduser(path)
    if gguf_file is None and path.endswith(".gguf") and os.path.isfile(path):
        path, gguf_file = os.path.dirname(path) or ".", os.path.basename(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer path {path}: not a local folder (nothing is downloaded at run time)")
    kwargs = {"trust_remote_code": trust_remote_code}
    if gguf_file:
        if not os.path.isfile(os.path.join(path, gguf_file)):
            raise FileNotFoundError(f"tokenizer: no GGUF file {gguf_file!r} in {path}")
        if importlib.util.find_spec("gguf") is None:
            raise ImportError(f"tokenizer {os.path.join(path, gguf_file)}: reading GGUF files needs the 'gguf' "
                              "package (pip install gguf)")
        kwargs["gguf_file"] = gguf_file
    tok = AutoTokenizer.from_pretrained(path, **kwargs)
    if gguf_file:
        pin_gguf_special_tokens(tok, os.path.join(path, gguf_file))
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"tokenizer {path}: has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
        logger.info("tokenizer %s: no pad token; using the eos token %r", path, tok.eos_token)
    if require_chat_template and not getattr(tok, "chat_template", None):
        raise ValueError(f"tokenizer {path}{'/' + gguf_file if gguf_file else ''}: has no chat template; prompts are "
                         "rendered with tokenizer.apply_chat_template. Use an instruct model's tokenizer or set "
                         "tokenizer.chat_template")
    return tok


def build_tiny_tokenizer(
    texts: Optional[Iterable[str]] = None,
    *,
    alphabet: Optional[str] = None,
    vocab_size: int = 512,
    model_max_length: int = 4096,
    extra_tokens: Sequence[str] = (),
):
    """A small PreTrainedTokenizerFast with the ChatML template (see the module docstring). extra_tokens
    (alphabet mode): more strings encoded as one token each, e.g. a tool-call wrapper for the agent demo."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if texts is not None and alphabet is not None:
        raise ValueError("build_tiny_tokenizer: give texts (byte-level BPE) or alphabet (characters), not both")
    specials = [PAD, UNK, BOS, IM_START, EOS]
    if texts is None:
        chars = list(dict.fromkeys(alphabet if alphabet is not None else DEFAULT_ALPHABET))
        chars = [c for c in chars if c not in ("\r",)]
        vocab = {t: i for i, t in enumerate(specials + chars)}
        tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Split(_any_char_regex(), behavior="isolated")
        tok.decoder = decoders.Fuse()
    else:
        tok = _train_byte_bpe(list(texts), specials, vocab_size)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if texts is None:
        tok.add_tokens([AddedToken(r, normalized=False) for r in (*ROLE_TOKENS, *extra_tokens)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        chat_template=CHATML_TEMPLATE, clean_up_tokenization_spaces=False, model_max_length=model_max_length,
    )


def _any_char_regex():
    from tokenizers import Regex

    return Regex(r"[\s\S]")  # any character, newlines included


def _train_byte_bpe(texts: Sequence[str], specials: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(specials):
        raise ValueError(f"build_tiny_tokenizer: vocab_size={vocab_size} is below the byte alphabet + specials "
                         f"({len(alphabet) + len(specials)})")
    if not texts:
        raise ValueError("build_tiny_tokenizer: texts is empty")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok
