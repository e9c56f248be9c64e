"""Token ids of the turns the agent loop appends, through the tokenizer's chat template.

The loop keeps one token sequence per sample: the prompt, then generated assistant turns and appended
turns (tool results, user replies). An appended turn's ids are what the chat template writes after an
assistant message that ended with the model's stop token: the rest of the template's assistant suffix
(e.g. ChatML's "\\n" after <|im_end|>), the new messages, and the generation prompt of the next assistant
turn. They are rendered against a fixed two-message context and cut off after it, so the cost does not
grow with the conversation, and the ids equal the template applied to the whole conversation wherever
the template renders each message independently of the others (ChatML and its kin; checked in tests).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

_USER, _REPLY = "U", "A"  # placeholders of the fixed context


class ChatTurns:
    def __init__(self, tokenizer: Any, chat_kwargs: Optional[dict] = None) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_kwargs or {})
        context = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _REPLY}]
        self._context = context
        rendered = self._render(context, add_generation_prompt=False)
        cut = rendered.rfind(_REPLY)
        if cut < 0:
            raise ValueError("chat template: an assistant message's content does not appear in the rendered text; "
                             "the agent loop cannot find where a turn ends")
        self._context_text = rendered
        eos = tokenizer.eos_token or ""
        suffix = rendered[cut + len(_REPLY):]
        # The model's turn ends with its stop token; what the template writes after that is appended for it.
        self.after_stop = suffix[len(eos):] if eos and suffix.startswith(eos) else suffix

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False, **self.kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def appended_ids(self, messages: Sequence[dict], ended_with_stop: bool = True) -> list[int]:
        """Ids that follow an assistant turn: the template's suffix after its stop token (only when the turn
        ended with one), `messages` (tool / user), then the next assistant turn's generation prompt."""
        full = self._render([*self._context, *messages], add_generation_prompt=True)
        if not full.startswith(self._context_text):
            raise ValueError("chat template: rendering more messages changed the text of the earlier ones; the agent "
                             "loop needs a template that renders each message on its own (as ChatML does)")
        added = full[len(self._context_text):]
        head = self.after_stop if ended_with_stop else ""
        return self.encode(head + added)  # one piece, as it sits in the whole conversation's text
