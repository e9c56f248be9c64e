"""Output folders a command makes for itself, proven by a marker file, so that it never deletes one it did not make.

`claim(path, owner, entries, fresh)`: a missing or empty folder becomes `owner`'s (the marker is written first);
a folder holding `owner`'s marker is reused, and with fresh=True only `entries` (the names the command writes
there) are removed; any other non-empty folder, or a file, is refused with a message naming the way out.
"""
from __future__ import annotations

import json
import os
import shutil
import time

MARKER = ".hybridrl-output"


class OutputDirError(ValueError):
    """The folder is not this command's to write into; the message says what to do instead."""


def owner_of(path: str) -> str | None:
    try:
        with open(os.path.join(path, MARKER)) as f:
            return json.load(f).get("owner")
    except (OSError, ValueError, AttributeError):
        return None


def claim(path: str, owner: str, entries: tuple[str, ...], fresh: bool, flag: str = "--out") -> str:
    """Make `path` ready for `owner`; returns its absolute path. Nothing is deleted unless the marker proves
    that `owner` made the folder, and then only `entries`."""
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputDirError(f"{flag} {path} is a file; give a folder")
    if os.path.isdir(path) and os.listdir(path):
        found = owner_of(path)
        if found != owner:
            made_by = f"it was made by {found}" if found else f"it has no {MARKER} marker, so {owner} did not make it"
            raise OutputDirError(f"{flag} {path} is not empty and {made_by}; give a new or empty folder "
                                 f"(nothing in it was changed)")
        if fresh:
            for name in entries:
                target = os.path.join(path, name)
                if os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target)
                elif os.path.lexists(target):
                    os.unlink(target)
        return path
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, MARKER), "w") as f:
        json.dump({"owner": owner, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f)
    return path
