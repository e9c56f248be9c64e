"""The tools a model may call, written into its prompt.

With data.tool_config_path set (by default it follows actor_rollout_ref.rollout.multi_turn.tool_config_path,
as verl's does), a prompt is rendered with `apply_chat_template(messages, tools=schemas)`. Qwen2.5, Qwen3 and
Hermes templates write the schemas and the <tool_call> format into the system turn. Many templates, among them
SmolLM2's and plain ChatML, ignore `tools`. Under those the model would never be told that a tool exists, and
verl says nothing about it. Here the schemas and the hermes call format (what the loop's parser reads) go into
the system message instead, and a warning says so once.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Optional, Sequence

logger = logging.getLogger(__name__)

_PROBE = [{"role": "user", "content": "U"}]
_warned: set[str] = set()  # sources already warned about (the train and the val dataset share one)


def hermes_tools_text(schemas: Sequence[dict]) -> str:
    """The system-message text that declares `schemas` in the hermes tool-call format."""
    listed = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return ("# Tools\n\nYou may call the functions below. Their JSON schemas are inside <tools></tools>:\n"
            f"<tools>\n{listed}\n</tools>\n\n"
            "To call one, write its name and arguments as JSON inside <tool_call></tool_call> tags:\n"
            '<tool_call>\n{"name": <function name>, "arguments": <arguments as a JSON object>}\n</tool_call>')


class ToolPrompt:
    """Renders prompts that declare `schemas`, through the template when it can, else in the system message."""

    def __init__(self, tokenizer: Any, schemas: Sequence[dict], chat_kwargs: Optional[dict] = None,
                 source: str = "data.tool_config_path") -> None:
        self.tokenizer = tokenizer
        self.schemas = [dict(s) for s in schemas]
        self.kwargs = dict(chat_kwargs or {})
        self.native = self._apply(_PROBE, tools=self.schemas) != self._apply(_PROBE)
        self.system_text = "" if self.native else hermes_tools_text(self.schemas)  # the same for every prompt
        if not self.native and source not in _warned:
            _warned.add(source)
            logger.warning("%s: the tokenizer's chat template does not render `tools`; the %d tool schema(s) and the "
                           "<tool_call> format are written into each prompt's system message instead (set "
                           "data.tool_config_path=null to leave prompts as the data has them)", source, len(schemas))

    def _apply(self, messages: list[dict], **extra: Any) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                  **self.kwargs, **extra)

    def render(self, messages: list[dict]) -> str:
        if self.native:
            return self._apply(messages, tools=self.schemas)
        return self._apply(with_tools_in_system(messages, self.system_text))


def with_tools_in_system(messages: list[dict], text: str) -> list[dict]:
    """`messages` with `text` appended to the system message (one is added first when there is none)."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}".lstrip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def load_tool_prompt(path: Any, tokenizer: Any, chat_kwargs: Optional[dict] = None) -> Optional[ToolPrompt]:
    """A ToolPrompt for the tools of the verl tool file at `path`; None when no path is set. A DataConfig built
    directly (not through the config loader) holds its unresolved link default here, which counts as unset."""
    if not isinstance(path, str) or not path:
        return None
    from .tools.base import load_tools

    schemas = [tool.get_openai_tool_schema() for tool in load_tools(path).values()]
    return ToolPrompt(tokenizer, schemas, chat_kwargs, source=f"data.tool_config_path={path}") if schemas else None
