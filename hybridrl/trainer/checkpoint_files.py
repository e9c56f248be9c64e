"""What a checkpoint step held when it was committed, and whether it still does.

The completion marker (`.complete`, checkpoint_manager.py) records every file of the step with its size and
CRC-32: {"files": {"actor/dist/__0_0.distcp": [size, crc32], ...}}. A file that was truncated, rewritten or
lost since is then named instead of surfacing as a bare EOFError deep inside torch or megatron-core.

CRC-32 (zlib, about 3 GB/s on one core) catches truncation and corruption, not tampering: the manifest sits in
the same folder as the files it describes.
"""
from __future__ import annotations

import json
import os
import zlib
from typing import Optional

SENTINEL = ".complete"
PRUNED = ".pruned"
_CHUNK = 1 << 22
_NOT_DATA = (SENTINEL, PRUNED)


class DamagedCheckpointError(ValueError):
    """A checkpoint file differs from what its save recorded; the message names the file."""


def crc32_of(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def file_manifest(folder: str) -> dict[str, list[int]]:
    """{path relative to folder: [size, crc32]} of every file under folder but the markers and temp files."""
    out = {}
    for sub, _, files in os.walk(folder):
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(sub, name), folder)
            if rel in _NOT_DATA or ".tmp-" in name:
                continue
            path = os.path.join(sub, name)
            out[rel] = [os.path.getsize(path), crc32_of(path)]
    return out


def _crc_unless_known(path: str) -> int:
    """crc32_of, remembered for this process while the file's size, mtime and inode stay the same: the check
    before start-up and the resume itself then read a step's files once."""
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _known_crc:
        _known_crc[key] = crc32_of(path)
    return _known_crc[key]


_known_crc: dict[tuple, int] = {}


def recorded_files(step_dir: str) -> Optional[dict[str, list[int]]]:
    """The manifest in the step's marker; None for a save that predates manifests (nothing to compare)."""
    for name in _NOT_DATA:
        path = os.path.join(step_dir, name)
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    return json.load(f).get("files")
            except (OSError, ValueError, AttributeError) as e:
                raise DamagedCheckpointError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    return None


def first_damage(step_dir: str, under: str = "") -> Optional[str]:
    """None if every recorded file (below `under`, a part such as "actor") is as saved, else what is wrong
    with the first one that is not, naming the file."""
    try:
        files = recorded_files(step_dir)
    except DamagedCheckpointError as e:
        return str(e)
    if files is None:
        return None
    prefix = under.rstrip("/") + "/" if under else ""
    for rel, (size, crc) in sorted(files.items()):
        if not rel.startswith(prefix):
            continue
        path = os.path.join(step_dir, rel)
        if not os.path.isfile(path):
            return f"{path} is missing"
        actual = os.path.getsize(path)
        if actual != size:
            return f"{path} is {actual} bytes, the save wrote {size} (truncated or replaced)"
        if _crc_unless_known(path) != crc:
            return f"{path} has changed since it was saved (checksum differs)"
    return None


def check_part(part_dir: str) -> None:
    """For readers of one role's folder (model_merger, convert): raise naming the damaged file, if any. A
    folder that is not inside a trainer step (e.g. hf-to-mcore's output) has no manifest and passes."""
    part_dir = os.path.abspath(part_dir)
    step_dir, part = os.path.dirname(part_dir), os.path.basename(part_dir)
    problem = first_damage(step_dir, under=part)
    if problem:
        raise DamagedCheckpointError(f"damaged checkpoint: {problem}")
