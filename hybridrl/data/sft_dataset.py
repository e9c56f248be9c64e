"""SFTDataset: verl-format SFT rows -> token ids + loss mask, and the batches the Megatron engine trains on.

Rows are either single-turn (data.prompt_key + data.response_key: the prompt a string or a list of chat
messages, the response the assistant's text) or conversations (data.messages_key: OpenAI-style messages, with
assistant `tool_calls` and `tool` turns, plus data.tools_key schemas per row), as verl's SFTDataset and
MultiTurnSFTDataset read them. data.multiturn.enable=null picks conversations when the files have the messages
column. Every row is rendered through the model's chat template and checked at construction (hybridrl.data.
sft_chat), so a bad row or an overlong one (data.truncation=error) fails at start-up, naming its file and row.

Batches (`collate_sft`) use RL's layout so the RL engine trains them unchanged: the sequence's first token is the
"prompt" (it is never a target), the rest the "response", right-padded; response_mask is the loss mask of the
response tokens. Hence `responses` [B, L-1], `response_mask` [B, L-1], input_ids / attention_mask /
position_ids [B, L], L the batch's longest sequence.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence, Union

import torch

from hybridrl.protocol import DataProto

from .prompt import to_messages
from .readers import DataFileError, read_files
from .sft_chat import ChatEncoder, TemplateMismatch

__all__ = ["SFTDataset", "collate_sft", "create_sft_dataset"]

logger = logging.getLogger(__name__)


class SFTDataset:
    """Map-style: item i is {"input_ids": list[int], "loss_mask": list[int]}."""

    def __init__(self, data_files: Union[str, Sequence[str]], tokenizer: Any, config: Any, max_samples: int = -1) -> None:
        self.config = config
        self.max_length = config.max_length
        self.truncation = config.truncation
        self.encoder = ChatEncoder(tokenizer, config.apply_chat_template_kwargs, config.chat_template,
                                   config.ignore_input_ids_mismatch)
        rows = read_files(data_files, max_rows=max_samples)
        mt = config.multiturn
        self.multiturn = mt.enable if mt.enable is not None else mt.messages_key in rows.columns
        need = [mt.messages_key] if self.multiturn else [config.prompt_key, config.response_key]
        for col in need:
            if col not in rows.columns:
                key = ("data.messages_key" if self.multiturn else
                       "data.prompt_key" if col == config.prompt_key else "data.response_key")
                raise DataFileError(rows.sources[0][0], f"missing column (the files have {rows.columns}); set {key} "
                                    "to the column to read" + ("" if self.multiturn else
                                                               " (or data.multiturn.enable=true for conversations)"),
                                    column=col)
        self.items: list[dict[str, list[int]]] = []
        self.sources = rows.sources
        self.truncated = 0
        for rec, (path, row) in zip(rows.records, rows.sources):
            self.items.append(self._encode(rec, path, row))
        if self.truncated:
            logger.warning("data.truncation=%s: %d of %d rows were longer than data.max_length=%d and were cut",
                           self.truncation, self.truncated, len(self.items), self.max_length)

    # ----------------------------------------------------------------- rows
    def messages_of(self, rec: dict, path: str, row: int) -> tuple[list[dict], Optional[list], Optional[bool]]:
        """(messages, tools, enable_thinking) of one row."""
        c = self.config
        if self.multiturn:
            messages = rec.get(c.multiturn.messages_key)
            if not isinstance(messages, (list, tuple)) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
                raise DataFileError(path, f"expected a non-empty list of messages with a 'role', got {messages!r:.100}",
                                    row=row, column=c.multiturn.messages_key)
            tools = rec.get(c.multiturn.tools_key) or None
            thinking = rec.get(c.multiturn.enable_thinking_key)
            return list(messages), list(tools) if tools else None, thinking
        prompt = _nested(rec[c.prompt_key], c.prompt_dict_keys, path, row, c.prompt_key)
        response = _nested(rec[c.response_key], c.response_dict_keys, path, row, c.response_key)
        if not isinstance(response, str):
            raise DataFileError(path, f"expected the response text (a string), got {type(response).__name__}",
                                row=row, column=c.response_key)
        return to_messages(prompt) + [{"role": "assistant", "content": response}], None, None

    def _encode(self, rec: dict, path: str, row: int) -> dict[str, list[int]]:
        messages, tools, thinking = self.messages_of(rec, path, row)
        if not any(m.get("role") == "assistant" for m in messages):
            raise DataFileError(path, "no assistant message: nothing to train", row=row,
                                column=self.config.multiturn.messages_key if self.multiturn else None)
        try:
            enc = self.encoder.encode(messages, tools, thinking)
        except (TemplateMismatch, ValueError, TypeError, KeyError) as e:
            raise DataFileError(path, f"cannot be rendered with the chat template: {e}", row=row) from e
        ids, mask = enc.input_ids, enc.loss_mask
        if len(ids) > self.max_length:
            if self.truncation == "error":
                raise DataFileError(path, f"{len(ids)} tokens after the chat template, over data.max_length="
                                    f"{self.max_length} (data.truncation=error); raise data.max_length or set "
                                    "data.truncation=left|right", row=row)
            self.truncated += 1
            keep = slice(-self.max_length, None) if self.truncation == "left" else slice(0, self.max_length)
            ids, mask = ids[keep], mask[keep]
        return {"input_ids": list(ids), "loss_mask": list(mask)}

    # ----------------------------------------------------------------- items
    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.items[i]

    def trained_tokens(self) -> int:
        return sum(sum(it["loss_mask"][1:]) for it in self.items)


def _nested(value: Any, keys: Optional[Sequence[str]], path: str, row: int, column: str) -> Any:
    for k in keys or ():
        if not isinstance(value, dict) or k not in value:
            raise DataFileError(path, f"no key {k!r} in {value!r:.80} (data.*_dict_keys)", row=row, column=column)
        value = value[k]
    return value


def collate_sft(items: Sequence[dict[str, Any]], pad_token_id: int) -> DataProto:
    """Items -> one batch in RL's layout (see the module docstring)."""
    width = max(len(it["input_ids"]) for it in items)
    ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(items), width), dtype=torch.long)
    loss_mask = torch.zeros((len(items), width), dtype=torch.long)
    for i, it in enumerate(items):
        n = len(it["input_ids"])
        ids[i, :n] = torch.tensor(it["input_ids"], dtype=torch.long)
        attention[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(it["loss_mask"], dtype=torch.long)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    batch = {"input_ids": ids, "attention_mask": attention, "position_ids": positions, "responses": ids[:, 1:],
             "response_mask": loss_mask[:, 1:] * attention[:, 1:]}
    return DataProto.from_dict(batch)


def create_sft_dataset(data_files: Union[str, Sequence[str]], config: Any, tokenizer: Any, max_samples: int = -1) -> Any:
    """SFTDataset, or data.custom_cls (constructed as verl does: cls(data_files, tokenizer, config, max_samples))."""
    custom = config.custom_cls
    if not custom.path:
        return SFTDataset(data_files, tokenizer, config, max_samples)
    from hybridrl.utils.imports import load_object

    cls = load_object(custom.path, custom.name, key="data.custom_cls.path", name_key="data.custom_cls.name")
    return cls(data_files, tokenizer, config, max_samples=max_samples)
