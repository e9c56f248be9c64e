"""A conversation -> token ids and the loss mask of SFT, through the model's own chat template.

The text is the template applied to the whole conversation (with the row's tools). What is trained is each
assistant message as the model writes it at RL time: the text after the template's assistant header (the
generation prompt) up to and including the end-of-turn token (the tokenizer's eos, e.g. ChatML's <|im_end|>).
The header, whatever the template writes after the end-of-turn token (ChatML's "\\n"), the system prompt (also
one the template inserts by itself), user turns and tool outputs are not trained. verl's multi-turn SFT also
trains the template's text after the end-of-turn token; the rollout stops at that token and never writes it, so
it is left out here.

Each assistant span is found by rendering the conversation up to the message before it with the generation
prompt (the header) and up to the message itself: the first must be a prefix of the second, and both of the
whole (a template that rewrites earlier turns, as some thinking templates do, is refused unless
data.ignore_input_ids_mismatch). The text is tokenized piece by piece, trained and untrained pieces apart, so an
assistant turn's ids are those the model produces after the prompt's ids, as in a rollout.

Tools: templates that render `tools` (Qwen2.5, Hermes) get them; for the others (SmolLM2's, plain ChatML) the
schemas go into the system message exactly as RL's prompts write them (hybridrl.agent.tool_prompt). Likewise an
assistant message's `tool_calls` are rendered by the template when it knows them, else written into the
message's text in the hermes format that the agent loop parses (<tool_call>{"name", "arguments"}</tool_call>).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from hybridrl.agent.tool_prompt import hermes_tools_text, with_tools_in_system

logger = logging.getLogger(__name__)

_PROBE_NAME = "hybridrl_probe_fn"
_PROBE_TOOL = {"type": "function", "function": {"name": _PROBE_NAME, "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}
_PROBE_CALL = [{"role": "user", "content": "U"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"type": "function", "function": {"name": _PROBE_NAME, "arguments": {"x": 1}}}]}]


class TemplateMismatch(ValueError):
    """Rendering a conversation's prefix did not give a prefix of the whole conversation's text."""


@dataclass(frozen=True)
class Encoded:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on the tokens trained (assistant turns up to their end-of-turn token)


def hermes_call_text(calls: Sequence[dict]) -> str:
    """OpenAI-style tool_calls as hermes text: one <tool_call>{"name": ..., "arguments": {...}}</tool_call> each."""
    parts = []
    for call in calls:
        fn = call.get("function") or call
        args = fn.get("arguments") or {}
        if isinstance(args, str):
            args = json.loads(args)
        parts.append("<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False)
                     + "\n</tool_call>")
    return "\n".join(parts)


def clean_message(message: dict) -> dict:
    """A message as read from parquet/jsonl: None-valued fields dropped (a table fills absent ones with None),
    content None as "", tool_calls' string arguments parsed."""
    out = {k: v for k, v in message.items() if v is not None}
    out["content"] = out.get("content") or ""
    if out.get("tool_calls"):
        calls = []
        for call in out["tool_calls"]:
            fn = dict(call.get("function") or {})
            if isinstance(fn.get("arguments"), str):
                fn["arguments"] = json.loads(fn["arguments"])
            calls.append({**{k: v for k, v in call.items() if v is not None}, "type": "function", "function": fn})
        out["tool_calls"] = calls
    else:
        out.pop("tool_calls", None)
    return out


class ChatEncoder:
    """Renders and tokenizes conversations for one tokenizer (and an optional template replacing its own)."""

    def __init__(self, tokenizer: Any, chat_kwargs: Optional[dict] = None, chat_template: Optional[str] = None,
                 ignore_mismatch: bool = False) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_kwargs or {})
        if chat_template:
            self.kwargs["chat_template"] = chat_template
        self.ignore_mismatch = ignore_mismatch
        self.eos = tokenizer.eos_token or ""
        probe = [{"role": "user", "content": "U"}]
        self.native_tools = self._probe(lambda: self._apply(probe, True, tools=[_PROBE_TOOL]) != self._apply(probe, True))
        self.native_calls = self._probe(lambda: _PROBE_NAME in self._apply(_PROBE_CALL, False))
        if not self.native_calls:
            logger.info("chat template: assistant tool_calls are not rendered by the template; they are written into "
                        "the message text in the hermes format the agent loop parses")

    @staticmethod
    def _probe(check: Any) -> bool:
        """A template that fails on the probe conversation does not render what it probes."""
        try:
            return bool(check())
        except Exception:  # jinja raises its own errors (raise_exception in templates): any of them means no
            return False

    def _apply(self, messages: list[dict], generation_prompt: bool, **extra: Any) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False,
                                                  **self.kwargs, **extra)

    def prepare(self, messages: Sequence[dict], tools: Optional[Sequence[dict]] = None) -> tuple[list[dict], dict]:
        """(the messages as the template will get them, extra template arguments)."""
        msgs = [clean_message(dict(m)) for m in messages]
        if not self.native_calls:
            for m in msgs:
                if m.get("tool_calls"):
                    text = hermes_call_text(m.pop("tool_calls"))
                    m["content"] = f"{m['content']}\n{text}" if m["content"] else text
        extra: dict = {}
        if tools:
            tools = [dict(t) for t in tools]
            if self.native_tools:
                extra["tools"] = tools
            else:
                msgs = with_tools_in_system(msgs, hermes_tools_text(tools))
        return msgs, extra

    def spans(self, messages: Sequence[dict], tools: Optional[Sequence[dict]] = None,
              enable_thinking: Optional[bool] = None) -> tuple[str, list[tuple[int, int]]]:
        """(the whole conversation's text, the [start, end) character spans trained)."""
        msgs, extra = self.prepare(messages, tools)
        if enable_thinking is not None:
            extra["enable_thinking"] = bool(enable_thinking)
        full = self._apply(msgs, False, **extra)
        out = []
        for k, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            head = self._apply(msgs[:k], True, **extra) if k else ""
            upto = self._apply(msgs[:k + 1], False, **extra)
            if not (upto.startswith(head) and full.startswith(upto)):
                if self.ignore_mismatch:
                    continue
                raise TemplateMismatch(
                    f"the chat template renders message {k} (assistant) differently inside the whole conversation "
                    "than after its prefix (a template that rewrites earlier turns?); set "
                    "data.ignore_input_ids_mismatch=true to skip such turns")
            turn = upto[len(head):]
            stop = turn.find(self.eos) if self.eos else -1
            end = len(head) + (stop + len(self.eos) if stop >= 0 else len(turn))
            out.append((len(head), end))
        return full, out

    def encode(self, messages: Sequence[dict], tools: Optional[Sequence[dict]] = None,
               enable_thinking: Optional[bool] = None) -> Encoded:
        text, spans = self.spans(messages, tools, enable_thinking)
        ids: list[int] = []
        mask: list[int] = []
        at = 0
        for start, end in [*spans, (len(text), len(text))]:
            for piece, trained in ((text[at:start], 0), (text[start:end], 1)):
                if piece:
                    piece_ids = self.tokenizer(piece, add_special_tokens=False)["input_ids"]
                    ids += piece_ids
                    mask += [trained] * len(piece_ids)
            at = end
        return Encoded(ids, mask)
