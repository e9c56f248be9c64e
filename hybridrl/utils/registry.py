"""A named registry for extension points (advantage estimators, losses, reward managers, engines, ...).

    LOSSES = Registry("policy loss", key="actor_rollout_ref.actor.policy_loss.loss_mode")

    @LOSSES.register("vanilla")
    def vanilla(...): ...

`get` on an unknown name raises ValueError naming the config key, the valid names and a did-you-mean.
"""
from __future__ import annotations

import difflib
from typing import Any, Callable, Iterator, Optional


class Registry:
    def __init__(self, what: str, key: Optional[str] = None) -> None:
        self.what = what
        self.key = key
        self._items: dict[str, Any] = {}

    def register(self, name: str, obj: Any = None, *, override: bool = False) -> Callable:
        """Decorator (or direct call with `obj`) adding `name`; re-registering needs override=True."""

        def add(o: Any) -> Any:
            if name in self._items and not override and self._items[name] is not o:
                raise ValueError(f"{self.what} {name!r} is already registered; pass override=True to replace it")
            self._items[name] = o
            return o

        return add(obj) if obj is not None else add

    def get(self, name: str) -> Any:
        if name not in self._items:
            close = difflib.get_close_matches(name, list(self._items), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            where = f"{self.key}={name!r}" if self.key else repr(name)
            raise ValueError(f"{where}: unknown {self.what}; known: {', '.join(sorted(self._items))}{hint}")
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
