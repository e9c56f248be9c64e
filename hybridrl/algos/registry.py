"""A tiny name -> object registry: the extension point for estimators, losses, KL kinds, agg modes.

Users add their own entries with the decorator and select them by name from config, e.g.

    @ADVANTAGE_ESTIMATORS.register("my_estimator")
    def my_estimator(inputs, params): ...

An unknown name raises ValueError that lists the valid choices and the closest matches.
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects of one kind (`kind` is used in error messages only)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, *, override: bool = False) -> Callable[[T], T]:
        """Decorator that registers its target under `name`; returns the target unchanged.

        Registering a different object under a taken name is an error unless `override=True`
        (re-registering the same object, e.g. on module reload, is allowed).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(obj: T) -> T:
            existing = self._entries.get(name)
            if existing is not None and existing is not obj and not override:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered ({existing!r}); pass override=True to replace it"
                )
            self._entries[name] = obj
            return obj

        return decorator

    def unregister(self, name: str) -> None:
        """Remove `name` (raises ValueError if absent)."""
        self.get(name)
        del self._entries[name]

    def get(self, name: str) -> T:
        """The object registered under `name`; ValueError naming the valid choices otherwise."""
        if name in self._entries:
            return self._entries[name]
        choices = self.names()
        close = difflib.get_close_matches(str(name), choices, n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"Unknown {self.kind} {name!r}.{hint} Valid choices: {', '.join(choices)}")

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
