"""trainer.numa_affinity: the cores sysfs lists for a GPU's PCI address, intersected with what the process may use."""
from __future__ import annotations

import os

import pytest

from hybridrl.utils import affinity


@pytest.mark.parametrize("text,cores", [("0-3,8-9\n", {0, 1, 2, 3, 8, 9}), ("5", {5}), ("", set()),
                                        ("0-1,1-2", {0, 1, 2})])
def test_parse_cpulist(text, cores):
    assert affinity.parse_cpulist(text) == cores


def _sysfs(tmp_path, bus_id: str, cpulist: str) -> str:
    folder = tmp_path / bus_id
    folder.mkdir()
    (folder / "local_cpulist").write_text(cpulist)
    return str(tmp_path)


def test_binds_to_the_allowed_cores_near_the_gpu(tmp_path, monkeypatch):
    allowed = sorted(os.sched_getaffinity(0))
    near = allowed[:1] + [max(allowed) + 64]  # one core this process may use, one it may not
    root = _sysfs(tmp_path, "0000:18:00.0", ",".join(map(str, near)))
    monkeypatch.setattr(affinity, "pci_bus_id", lambda index: "0000:18:00.0" if index == 2 else None)
    pinned = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: pinned.append((pid, set(cores))))
    assert affinity.bind_to_device(2, root) == {allowed[0]}
    assert pinned == [(0, {allowed[0]})]
    # no PCI address, or no sysfs entry for it: nothing is pinned
    assert affinity.bind_to_device(0, root) is None
    monkeypatch.setattr(affinity, "pci_bus_id", lambda index: "0000:3b:00.0")
    assert affinity.bind_to_device(2, root) is None and len(pinned) == 1


def test_config_key_defaults_off():
    from hybridrl.config.schema.trainer import TrainerConfig

    assert TrainerConfig().numa_affinity is False
