"""Files that are whole or absent after a crash: the one home of the write-to-temporary, fsync, rename/link dance.

Both writers put the bytes in a temporary file of the same folder and fsync it; `atomic_write` then replaces the
target (readers see the old or the new file), `write_new` links it under a name no file has (a link never replaces
one). Either way the folder is fsynced last, since on POSIX the new name lives in the directory, not the file.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Iterator


def fsync_dir(path: str) -> None:
    """Make a rename, link or creation inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str) -> None:
    """fsync every file and folder under root (part writers such as torch.save close but do not fsync)."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)


@contextmanager
def _synced_tmp(folder: str, stem: str, data: bytes) -> Iterator[str]:
    """`data` in a fresh hidden temporary file of `folder`, fsynced; removed on the way out whatever happened."""
    tmp = os.path.join(folder, f".{stem}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        yield tmp
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write(path: str, data: bytes) -> None:
    """`path` holds `data` whole, replacing what it held: readers see the old or the new file, never half."""
    folder = os.path.dirname(os.path.abspath(path))
    with _synced_tmp(folder, os.path.basename(path), data) as tmp:
        os.replace(tmp, path)
    fsync_dir(folder)


def write_new(folder: str, stem: str, suffix: str, data: bytes, limit: int = 1000) -> str:
    """`data` as folder/stem[_N]suffix under the first name no file has; returns the path. Nothing is replaced."""
    os.makedirs(folder, exist_ok=True)
    path = None
    with _synced_tmp(folder, stem, data) as tmp:
        for n in range(limit):
            candidate = os.path.join(folder, f"{stem}{f'_{n}' if n else ''}{suffix}")
            try:
                os.link(tmp, candidate)
            except FileExistsError:
                continue
            path = candidate
            break
    if path is None:
        raise FileExistsError(f"{folder}: {stem}_*{suffix} up to _{limit - 1} exist already")
    fsync_dir(folder)  # the link and the temporary's removal
    return path
