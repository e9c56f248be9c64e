"""What the reward model reads: the policy's own tokens, or the conversation re-rendered in the reward model's
chat template when its tokenizer differs from the policy's (verl's reward_model.model.input_tokenizer).

Re-rendering (verl's behaviour): each sample's prompt messages (non-tensor `raw_prompt`, kept by
data.return_raw_chat=true) plus an assistant turn holding the response, decoded with the policy's tokenizer up to
its last valid token and with its EOS text removed, go through the reward model's chat template (no generation
prompt) and its tokenizer (no added special tokens); the ids are right-padded and cut on the right at
reward_model.max_length (null: the batch's own width). Cut rows are counted (reward_model/truncated).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from hybridrl.protocol import DataProto
from hybridrl.reward.managers import last_valid_positions, response_mask_of


def tokenizers_differ(a: Any, b: Any) -> bool:
    """Whether two tokenizers would turn the same conversation into different ids (vocabulary, chat template or
    special tokens differ)."""
    if a is b:
        return False
    if getattr(a, "chat_template", None) != getattr(b, "chat_template", None):
        return True
    if (a.eos_token, a.bos_token, a.pad_token) != (b.eos_token, b.bos_token, b.pad_token):
        return True
    return a.get_vocab() != b.get_vocab()


class RewardInputs:
    """DataProto of policy samples -> DataProto(input_ids, attention_mask [B, T']) for the reward model.

    `rm_tokenizer` None: the policy's tokens as they are (the tokenizers agree, or input_tokenizer is null)."""

    def __init__(self, policy_tokenizer: Any, rm_tokenizer: Optional[Any] = None, max_length: Optional[int] = None,
                 chat_kwargs: Optional[dict] = None) -> None:
        self.policy = policy_tokenizer
        self.rm = rm_tokenizer
        self.max_length = max_length
        self.chat_kwargs = dict(chat_kwargs or {})
        self.truncated = 0  # rows cut at max_length by the last call

    @property
    def rerenders(self) -> bool:
        return self.rm is not None

    def __call__(self, data: DataProto) -> DataProto:
        if self.rm is None:
            return DataProto.from_dict({"input_ids": data.batch["input_ids"],
                                        "attention_mask": data.batch["attention_mask"]})
        return self._rerender(data)

    def texts(self, data: DataProto) -> list[str]:
        """The conversations in the reward model's chat template (one string per sample)."""
        if "raw_prompt" not in data.non_tensor_batch:
            raise KeyError("reward_model: the reward model's tokenizer differs from the policy's, so prompts are "
                           "re-rendered with its chat template from the prompt messages; set data.return_raw_chat=true "
                           "(or reward_model.model.input_tokenizer=null to score the policy's tokens as they are)")
        mask = response_mask_of(data)
        last = last_valid_positions(mask)
        has_any = (mask != 0).any(-1)
        responses = data.batch["responses"]
        eos = self.policy.eos_token or ""
        out = []
        for i, messages in enumerate(data.non_tensor_batch["raw_prompt"]):
            ids = responses[i, : int(last[i]) + 1].tolist() if has_any[i] else []
            text = self.policy.decode(ids)
            if eos:
                text = text.replace(eos, "")
            chat = [dict(m) for m in messages] + [{"role": "assistant", "content": text}]
            out.append(self.rm.apply_chat_template(chat, add_generation_prompt=False, tokenize=False, **self.chat_kwargs))
        return out

    def _rerender(self, data: DataProto) -> DataProto:
        width = self.max_length or data.batch["input_ids"].shape[1]
        pad = self.rm.pad_token_id if self.rm.pad_token_id is not None else (self.rm.eos_token_id or 0)
        rows = [self.rm(text, add_special_tokens=False)["input_ids"] for text in self.texts(data)]
        self.truncated = sum(len(r) > width for r in rows)
        longest = min(max((len(r) for r in rows), default=1), width)
        ids = torch.full((len(rows), max(longest, 1)), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            r = r[:width]
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        return DataProto.from_dict({"input_ids": ids, "attention_mask": mask})
