"""Tool calls in an assistant turn's text, by actor_rollout_ref.rollout.multi_turn.format.

`hermes` (verl's default; Qwen2.5/Qwen3, Hermes and SmolLM2 chat templates write it): each call is
<tool_call>{"name": ..., "arguments": {...}}</tool_call>. A call whose JSON does not parse, or lacks a
string name or a dict of arguments, is not dropped silently: it comes back as a ToolCall with `error`
set, and the loop answers it with an error observation (the model learns from it, the step goes on).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hybridrl.utils.registry import Registry

TOOL_CALL_FORMATS: Registry = Registry("tool-call format", key="actor_rollout_ref.rollout.multi_turn.format")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None  # the call could not be parsed; `name` may be empty


Parser = Callable[[str], tuple[str, list[ToolCall]]]

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@TOOL_CALL_FORMATS.register("hermes")
def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    """(the text outside tool calls, the calls in order)."""
    calls = [_hermes_call(m.group(1)) for m in _HERMES.finditer(text)]
    return _HERMES.sub("", text).strip(), calls


def _hermes_call(body: str) -> ToolCall:
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as e:
        return ToolCall("", {}, f"tool call is not valid JSON ({e.msg} at character {e.pos})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", {}, 'tool call needs {"name": <string>, "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCall(obj["name"], {}, "tool call arguments are a string that is not JSON")
    if not isinstance(args, dict):
        return ToolCall(obj["name"], {}, "tool call arguments must be a JSON object")
    return ToolCall(obj["name"], args)


def get_parser(name: str) -> Parser:
    return TOOL_CALL_FORMATS.get(name)
