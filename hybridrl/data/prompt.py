"""Prompt-level helpers: chat messages checks, truncation to max_prompt_length, left padding.

Semantics follow verl's dataset so the same data gives the same token ids:
  * truncation `left` keeps the LAST max_len tokens, `right` the FIRST max_len, `middle` the first
    max_len // 2 and the last max_len - max_len // 2; `error` refuses (the caller names the row).
  * prompts are LEFT-padded to max_len with pad_token_id (attention 0 on the padding), and
    position_ids = clamp(cumsum(attention_mask) - 1, min=0), so padding sits at position 0.

A prompt is either a list of {"role": str, "content": str} messages (verl's format) or a plain
string, which is taken as ONE user message (the chat template still applies, so every prompt goes
through the same path). Anything else is a type error naming the row.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

__all__ = ["TRUNCATION_MODES", "prompt_type_problem", "to_messages", "truncate_ids", "left_pad", "position_ids_from_mask"]

TRUNCATION_MODES = ("error", "left", "right", "middle")


def prompt_type_problem(prompt: Any) -> Optional[str]:
    """None when `prompt` is a valid prompt, else what is wrong with it."""
    if isinstance(prompt, str):
        return None if prompt else "empty string prompt"
    if prompt is None:
        return "missing (null); expected a list of {'role', 'content'} messages or a string"
    if not isinstance(prompt, (list, tuple)):
        return (f"expected a list of {{'role', 'content'}} messages or a string, got {type(prompt).__name__}"
                f" {_short(prompt)}")
    if not prompt:
        return "empty message list"
    for j, m in enumerate(prompt):
        if not isinstance(m, dict):
            return f"message {j} is a {type(m).__name__} {_short(m)}, expected a dict with 'role' and 'content'"
        for k in ("role", "content"):
            if not isinstance(m.get(k), str):
                got = "missing" if m.get(k) is None else f"a {type(m.get(k)).__name__}"
                return f"message {j}: {k!r} is {got}, expected a string (message: {_short(m)})"
    return None


def to_messages(prompt: Any) -> list[dict[str, str]]:
    """Chat messages for the template (a string prompt becomes one user message)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    # Keep only role/content: parquet structs add None-valued fields a template might print.
    return [{k: v for k, v in m.items() if v is not None} for m in prompt]


def truncate_ids(ids: Sequence[int], max_len: int, mode: str) -> list[int]:
    """`ids` cut to max_len per `mode`; mode 'error' raises ValueError (callers add the row)."""
    ids = list(ids)
    if len(ids) <= max_len:
        return ids
    if mode == "left":
        return ids[-max_len:]
    if mode == "right":
        return ids[:max_len]
    if mode == "middle":
        head = max_len // 2
        tail = max_len - head
        return ids[:head] + (ids[-tail:] if tail else [])
    if mode == "error":
        raise ValueError(f"prompt is {len(ids)} tokens, over max_prompt_length={max_len}")
    raise ValueError(f"data.truncation={mode!r}: expected one of {', '.join(TRUNCATION_MODES)}")


def left_pad(ids: Sequence[int], max_len: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [max_len], attention_mask [max_len]) with the tokens right-aligned."""
    n = len(ids)
    if n > max_len:
        raise ValueError(f"left_pad: {n} tokens do not fit max_len={max_len}; truncate first")
    input_ids = torch.full((max_len,), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(max_len, dtype=torch.long)
    if n:
        input_ids[max_len - n:] = torch.as_tensor(list(ids), dtype=torch.long)
        attention_mask[max_len - n:] = 1
    return input_ids, attention_mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the attended tokens; padding gets 0 (verl's compute_position_id_with_mask)."""
    return torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0)


def _short(x: Any, n: int = 80) -> str:
    r = repr(x)
    return r if len(r) <= n else r[: n - 3] + "..."
