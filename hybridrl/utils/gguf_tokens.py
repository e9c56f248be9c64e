"""GGUF tokenizers' special tokens as the file gives them (llama.cpp's metadata keys), whatever transformers read.

transformers 5.17 (the GPU host's) reads SmolLM2-135M-Instruct's GGUF with eos <|im_start|> (id 1) and no pad, where
the file says eos 2 (<|im_end|>) and pad 2; 5.24 reads it right. The wrong eos went into every SmolLM2 run's
tokenizer on the GPU host and into the SFT exports made from it (2026-11-28). Here, below hybridrl.data, because the
dequantized HF folder (utils/hf_model.py) writes its tokenizer through it as data/tokenizer.py loads one.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# the GGUF's own special-token ids (llama.cpp's keys), which the tokenizer must carry
GGUF_SPECIAL_TOKENS = {"bos_token": "tokenizer.ggml.bos_token_id", "eos_token": "tokenizer.ggml.eos_token_id",
                       "unk_token": "tokenizer.ggml.unknown_token_id", "pad_token": "tokenizer.ggml.padding_token_id"}


def gguf_special_token_ids(file: str) -> dict[str, int]:
    """{"eos_token": id, ...} as the GGUF file's metadata gives them (the keys it has)."""
    import gguf

    fields = gguf.GGUFReader(file).fields
    return {attr: int(fields[key].parts[fields[key].data[0]][0])
            for attr, key in GGUF_SPECIAL_TOKENS.items() if key in fields and fields[key].data}


def pin_gguf_special_tokens(tok, file: str) -> dict[str, tuple]:
    """Set the tokenizer's bos/eos/unk/pad to the GGUF's own ids where transformers read them otherwise; returns
    {attr: (was, now)}."""
    fixed = {}
    for attr, index in gguf_special_token_ids(file).items():
        want = tok.convert_ids_to_tokens(index) if 0 <= index < len(tok) else None
        if want is not None and getattr(tok, attr) != want:
            fixed[attr] = (getattr(tok, attr), want)
            setattr(tok, attr, want)
    if fixed:
        log.warning("tokenizer %s: special tokens as the GGUF file gives them, not as transformers read them: %s",
                    file, ", ".join(f"{a} {was!r} -> {now!r}" for a, (was, now) in fixed.items()))
    return fixed
