"""What the validation pass collects: every problem found (reported together) and notes, plus the
helpers that phrase a bad choice with its valid values and a did-you-mean."""
from __future__ import annotations

import difflib
from typing import Any, Optional

from .loader import ConfigError


class Problems:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.notes: list[str] = []

    def check(self, ok: bool, message: str) -> bool:
        if not ok:
            self.errors.append(message)
        return ok

    def raise_if_any(self) -> None:
        if self.errors:
            head = "invalid config" if len(self.errors) == 1 else f"invalid config ({len(self.errors)} problems)"
            raise ConfigError(head + ":\n  - " + "\n  - ".join(self.errors))


def did_you_mean(value: Any, names: list[str]) -> str:
    close = difflib.get_close_matches(str(value), names, n=1)
    return f"; did you mean {close[0]}?" if close else ""


def choices(key: str, value: str, names: list[str], p: Problems) -> bool:
    return p.check(value in names, f"{key}={value!r} is not one of {', '.join(sorted(names))}{did_you_mean(value, names)}")


def registry_names(module: str, attr: str) -> Optional[list[str]]:
    try:
        mod = __import__(module, fromlist=[attr])
        return list(getattr(mod, attr).names())
    except (ImportError, AttributeError):
        return None
