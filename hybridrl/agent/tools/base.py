"""The tool interface (verl's BaseTool shape) and the tool config file.

A tool file (actor_rollout_ref.rollout.multi_turn.tool_config_path) lists tools as verl does:

    tools:
      - class_name: hybridrl.agent.tools.calculator.CalculatorTool   # dotted path, or FILE.py:Class
        config: {type: native, timeout_s: 5}
        tool_schema:                                                # OpenAI function format
          type: function
          function: {name: calculator, description: ..., parameters: {type: object, properties: {...}, required: [...]}}

Each sample gets its own instance of each tool (`create` -> instance id), the loop calls `execute` per call,
`calc_reward` at the end and `release` always (also when the sample failed). A tool returns text; raising
or running past the timeout is turned into an error observation by the loop (hybridrl.agent.loop), so a
tool's bug costs its call, not the step.
"""
from __future__ import annotations

import importlib
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from hybridrl.utils.imports import load_object

KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"


@dataclass(frozen=True)
class ToolSchema:
    """An OpenAI function tool schema (what chat templates render into the prompt)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    @classmethod
    def from_openai(cls, schema: Any, where: str) -> "ToolSchema":
        fn = schema.get("function") if isinstance(schema, dict) else None
        if not (isinstance(schema, dict) and schema.get("type", "function") == "function" and isinstance(fn, dict)
                and isinstance(fn.get("name"), str) and fn["name"]):
            raise ValueError(f"{where}.tool_schema: expected OpenAI function format {{type: function, function: "
                             f"{{name: ..., description: ..., parameters: {{...}}}}}}, got {schema!r:.120}")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise ValueError(f"{where}.tool_schema.function.parameters must be a JSON-schema object")
        return cls(fn["name"], str(fn.get("description", "")), params)


class BaseTool:
    """Subclass and override `execute` (and, if the tool keeps per-sample state, create/release)."""

    def __init__(self, config: dict[str, Any], tool_schema: ToolSchema) -> None:
        self.config = dict(config or {})
        self.tool_schema = tool_schema
        self.name = tool_schema.name

    def get_openai_tool_schema(self) -> dict[str, Any]:
        return self.tool_schema.to_openai()

    async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> str:
        """Start one sample's instance (kwargs: the sample's extra_info.tools_kwargs[name].create_kwargs)."""
        return instance_id or uuid.uuid4().hex

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        """(observation text, step reward, metrics) for one call."""
        raise NotImplementedError

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None


def load_tools(path: str) -> dict[str, BaseTool]:
    """The tools of a verl tool file, by schema name. Errors name the file, the entry and the key."""
    entries = _read_list(path, "tools", KEY)
    tools: dict[str, BaseTool] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: tools[{i}]"
        if not isinstance(entry, dict) or not entry.get("class_name"):
            raise ValueError(f"{where}: each tool needs class_name (and tool_schema, config)")
        cls = load_class(entry["class_name"], where + ".class_name")
        if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
            raise TypeError(f"{where}.class_name={entry['class_name']}: must subclass hybridrl.agent.tools.BaseTool")
        schema = ToolSchema.from_openai(entry.get("tool_schema"), where)
        if schema.name in tools:
            raise ValueError(f"{where}: a second tool named {schema.name!r}")
        tools[schema.name] = cls(entry.get("config") or {}, schema)
    return tools


def load_class(spec: str, where: str) -> Any:
    """A class by dotted path (`pkg.module.Class`, as verl's tool files write it) or `FILE.py:Class`."""
    if ":" in spec:
        path, name = spec.rsplit(":", 1)
        return load_object(path, name, where, where)
    module, _, name = spec.rpartition(".")
    if not module:
        raise ValueError(f"{where}={spec!r}: expected a dotted path pkg.module.Class or FILE.py:Class")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"{where}={spec!r}: cannot import it ({type(e).__name__}: {e})") from e


def _read_list(path: str, section: str, key: str) -> list:
    full = os.path.expanduser(path)
    if not os.path.isfile(full):
        raise FileNotFoundError(f"{key}={path}: no such file")
    with open(full) as f:
        data = yaml.safe_load(f) or {}
    items = data.get(section) if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(f"{key}={path}: expected a top-level '{section}:' list with at least one entry")
    return items
