"""RLHFDataset: verl-format prompt rows -> left-padded prompt tensors, plus `collate_to_dataproto`.

A verl row is {prompt: [{role, content}, ...], data_source, ability, reward_model: {style,
ground_truth}, extra_info: {split, index, ...}}. Each item carries, like verl's:
  tensors      input_ids, attention_mask, position_ids   [max_prompt_length], left-padded
  non-tensors  raw_prompt_ids (list[int], truncated, unpadded), index, every other column of the
               row (data_source, ability, reward_model, extra_info, ...), raw_prompt (the messages)
               when data.return_raw_chat, full_prompts (the templated text) when data.return_full_prompt
`index` is extra_info["index"] when the row has one, else the item's position in the dataset.

At construction every row's prompt is type-checked, and (when data.filter_overlong_prompts or
data.truncation=error) every prompt is templated and tokenized once to know its length, so a bad row
fails at start-up, not hours in. Filtered rows are counted (`num_filtered_overlong`, logged).
Order: the first max_samples rows are kept first, then overlong ones are filtered (verl's order).
Multimodal inputs (a processor) are not supported yet. Keys of data.* read here: prompt_key,
max_prompt_length, truncation, filter_overlong_prompts, return_raw_chat, return_full_prompt,
apply_chat_template_kwargs, tool_config_path (the tools' schemas rendered into every prompt:
hybridrl.agent.tool_prompt); the length pre-scan runs in-process (filter_overlong_prompts_workers and
dataloader_num_workers are not used), and return_raw_input_ids has no effect (verl's current dataset
ignores it too).
"""
from __future__ import annotations

import logging
from typing import Any, Sequence, Union

import numpy as np
import torch

from hybridrl.protocol import DataProto

from .prompt import TRUNCATION_MODES, left_pad, position_ids_from_mask, prompt_type_problem, to_messages, truncate_ids
from .readers import DataFileError, read_files

__all__ = ["RLHFDataset", "collate_to_dataproto", "PromptTooLongError", "TENSOR_KEYS"]

logger = logging.getLogger(__name__)

TENSOR_KEYS = ("input_ids", "attention_mask", "position_ids")
_PRODUCED_KEYS = TENSOR_KEYS + ("raw_prompt_ids", "index", "raw_prompt", "full_prompts")


class PromptTooLongError(DataFileError):
    """A prompt over max_prompt_length with data.truncation=error."""


class RLHFDataset:
    """Prompts of verl-format files (parquet, Arrow, jsonl), tokenized through the chat template."""

    def __init__(
        self,
        data_files: Union[str, Sequence[str]],
        tokenizer: Any,
        config: Any,
        processor: Any = None,
        *,
        max_samples: int = -1,
    ) -> None:
        if processor is not None:
            raise NotImplementedError("RLHFDataset: multimodal prompts (a processor) are not supported yet")
        if config.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={config.truncation!r}: expected one of {', '.join(TRUNCATION_MODES)}")
        if config.max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length={config.max_prompt_length}: must be positive")
        if tokenizer.pad_token_id is None:
            raise ValueError("RLHFDataset: the tokenizer has no pad token (load it with hybridrl.data.load_tokenizer, "
                             "which falls back to the eos token)")
        self.tokenizer = tokenizer
        self.config = config
        self.processor = processor
        self.prompt_key = config.prompt_key
        self.max_prompt_length = config.max_prompt_length
        self.truncation = config.truncation
        self.chat_kwargs = dict(config.apply_chat_template_kwargs or {})
        from hybridrl.agent.tool_prompt import load_tool_prompt

        self.tool_prompt = load_tool_prompt(getattr(config, "tool_config_path", None), tokenizer, self.chat_kwargs)

        rows = read_files(data_files, required_columns=[self.prompt_key], max_rows=max_samples)
        clash = [c for c in rows.columns if c in _PRODUCED_KEYS]
        if clash:
            raise DataFileError(rows.sources[0][0], f"column name(s) {clash} collide with keys the dataset produces",
                                column=clash[0])
        for rec, (path, row) in zip(rows.records, rows.sources):
            self._check_row(rec, path, row)
        self.columns = rows.columns
        self.records, self.sources = rows.records, rows.sources
        self.num_rows_read = len(self.records)
        self.filtered_overlong: list[tuple[str, int, int]] = []  # (file, row, token length)
        if config.filter_overlong_prompts or self.truncation == "error":
            self._check_lengths(bool(config.filter_overlong_prompts))

    # ----------------------------------------------------------------- loading checks
    def _check_row(self, rec: dict, path: str, row: int) -> None:
        problem = prompt_type_problem(rec.get(self.prompt_key))
        if problem:
            raise DataFileError(path, f"wrong type: {problem}", row=row, column=self.prompt_key)
        rm = rec.get("reward_model", None)
        if "reward_model" in rec and rm is not None and not (isinstance(rm, dict) and "ground_truth" in rm):
            raise DataFileError(path, f"wrong type: expected a dict with 'ground_truth', got {rm!r:.80}",
                                row=row, column="reward_model")
        ei = rec.get("extra_info", None)
        if ei is not None and not isinstance(ei, dict):
            raise DataFileError(path, f"wrong type: expected a dict or null, got {type(ei).__name__}",
                                row=row, column="extra_info")

    def _check_lengths(self, drop: bool) -> None:
        texts = [self._render(to_messages(r[self.prompt_key])) for r in self.records]
        lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        over = [i for i, n in enumerate(lengths) if n > self.max_prompt_length]
        if not over:
            return
        if not drop:
            path, row = self.sources[over[0]]
            raise PromptTooLongError(
                path,
                f"prompt is {lengths[over[0]]} tokens after the chat template, over data.max_prompt_length="
                f"{self.max_prompt_length} (data.truncation=error); {len(over)} of {len(lengths)} prompts are over. "
                "Set data.filter_overlong_prompts=True to drop them, or data.truncation=left|right|middle",
                row=row, column=self.prompt_key)
        drop_set = set(over)
        self.filtered_overlong = [(*self.sources[i], lengths[i]) for i in over]
        self.records = [r for i, r in enumerate(self.records) if i not in drop_set]
        self.sources = [s for i, s in enumerate(self.sources) if i not in drop_set]
        logger.warning("filter_overlong_prompts: dropped %d of %d prompts longer than max_prompt_length=%d "
                       "(first: %s row %d, %d tokens)", len(over), len(lengths), self.max_prompt_length,
                       *self.filtered_overlong[0])
        if not self.records:
            raise ValueError(f"filter_overlong_prompts: all {len(lengths)} prompts are longer than "
                             f"data.max_prompt_length={self.max_prompt_length}")

    @property
    def num_filtered_overlong(self) -> int:
        """Rows dropped by filter_overlong_prompts."""
        return len(self.filtered_overlong)

    # ----------------------------------------------------------------- items
    def _render(self, messages: list[dict]) -> str:
        if self.tool_prompt is not None:  # the tools' schemas in the prompt (lengths above count them too)
            return self.tool_prompt.render(messages)
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **self.chat_kwargs)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        rec = self.records[i]
        messages = to_messages(rec[self.prompt_key])
        text = self._render(messages)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        try:
            ids = truncate_ids(ids, self.max_prompt_length, self.truncation)
        except ValueError as e:
            path, row = self.sources[i]
            raise PromptTooLongError(path, f"{e} (data.truncation={self.truncation})", row=row, column=self.prompt_key) from e
        input_ids, attention_mask = left_pad(ids, self.max_prompt_length, self.tokenizer.pad_token_id)
        item = {k: v for k, v in rec.items() if k != self.prompt_key}
        item.update(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids_from_mask(attention_mask), raw_prompt_ids=ids)
        extra = rec.get("extra_info")
        item["index"] = extra["index"] if isinstance(extra, dict) and extra.get("index") is not None else i
        if self.config.return_raw_chat:
            item["raw_prompt"] = messages
        if self.config.return_full_prompt:
            item["full_prompts"] = text
        return item

    def source_of(self, i: int) -> tuple[str, int]:
        """(file, 0-based row) of item i."""
        return self.sources[i]


def collate_to_dataproto(items: Sequence[dict[str, Any]]) -> DataProto:
    """Items -> DataProto: tensors stacked into `batch`, every other value into `non_tensor_batch`."""
    if not items:
        raise ValueError("collate_to_dataproto: no items")
    keys = list(items[0])
    for j, it in enumerate(items):
        if set(it) != set(keys):
            raise ValueError(f"collate_to_dataproto: item {j} has keys {sorted(it)}, item 0 has {sorted(keys)}")
    tensors: dict[str, torch.Tensor] = {}
    non_tensors: dict[str, np.ndarray] = {}
    for k in keys:
        values = [it[k] for it in items]
        if isinstance(values[0], torch.Tensor):
            tensors[k] = torch.stack(values)
        else:
            arr = np.empty(len(values), dtype=object)
            for j, v in enumerate(values):
                arr[j] = v
            non_tensors[k] = arr
    return DataProto(tensors, non_tensors)
