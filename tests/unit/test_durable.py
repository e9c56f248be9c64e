"""hybridrl/utils/durable.py: whole-or-absent files for checkpoints (atomic_write) and async spills (write_new)."""
from __future__ import annotations

import os

import pytest

from hybridrl.utils import durable


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(durable, "fsync_dir", lambda p: synced.append(p))
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    durable.atomic_write(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["state.json"]
    assert synced == [str(tmp_path)]  # the rename is made durable in its folder


def test_write_new_never_replaces_and_syncs_the_folder_after_the_link(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(durable, "fsync_dir", lambda p: synced.append((p, sorted(os.listdir(p)))))
    (tmp_path / "s.safetensors").write_bytes(b"the user's")
    path = durable.write_new(str(tmp_path), "s", ".safetensors", b"mine")
    assert path == str(tmp_path / "s_1.safetensors") and open(path, "rb").read() == b"mine"
    assert (tmp_path / "s.safetensors").read_bytes() == b"the user's"
    assert synced == [(str(tmp_path), ["s.safetensors", "s_1.safetensors"])]  # after the link, no temporary left


def test_a_failed_write_leaves_neither_target_nor_temporary(tmp_path, monkeypatch):
    def broken_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(durable.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk gone"):
        durable.atomic_write(str(tmp_path / "x"), b"data")
    assert os.listdir(tmp_path) == []


def test_write_new_names_the_folder_when_every_name_is_taken(tmp_path):
    for n in range(3):
        (tmp_path / (f"s_{n}.bin" if n else "s.bin")).write_bytes(b"")
    with pytest.raises(FileExistsError, match="up to _2"):
        durable.write_new(str(tmp_path), "s", ".bin", b"x", limit=3)
    assert sorted(os.listdir(tmp_path)) == ["s.bin", "s_1.bin", "s_2.bin"]
