"""User-side turns (verl's BaseInteraction shape) and the interaction config file.

When an assistant turn calls no tool and the sample has an interaction, the interaction answers as the
user: `generate_response(instance_id, messages)` -> (should_terminate, reply, score, metadata). Its reply
is appended as a user message with response_mask 0; `score` is recorded per turn.

Interaction file (actor_rollout_ref.rollout.multi_turn.interaction_config_path), as verl's:

    interaction:
      - name: gsm8k                       # a sample picks one by extra_info.interaction_kwargs.name
        class_name: my_pkg.my_module.MyInteraction   # or FILE.py:Class
        config: {}
"""
from __future__ import annotations

import uuid
from typing import Any, Optional

from .tools.base import _read_list, load_class

KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


class BaseInteraction:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config or {})
        self.name = self.config.get("name", type(self).__name__)

    async def start_interaction(self, instance_id: Optional[str] = None, **kwargs: Any) -> str:
        return instance_id or uuid.uuid4().hex

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs: Any) -> tuple[bool, str, float, dict[str, Any]]:
        raise NotImplementedError

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        return None


def load_interactions(path: str) -> dict[str, BaseInteraction]:
    entries = _read_list(path, "interaction", KEY)
    out: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: interaction[{i}]"
        if not isinstance(entry, dict) or not entry.get("class_name"):
            raise ValueError(f"{where}: each interaction needs class_name (and name, config)")
        cls = load_class(entry["class_name"], where + ".class_name")
        if not (isinstance(cls, type) and issubclass(cls, BaseInteraction)):
            raise TypeError(f"{where}.class_name={entry['class_name']}: must subclass "
                            "hybridrl.agent.interaction.BaseInteraction")
        name = entry.get("name") or cls.__name__
        if name in out:
            raise ValueError(f"{where}: a second interaction named {name!r}")
        out[name] = cls({**(entry.get("config") or {}), "name": name})
    return out
