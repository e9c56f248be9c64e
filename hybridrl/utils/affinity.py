"""CPU affinity for a GPU worker: the cores of its GPU's NUMA node (trainer.numa_affinity).

Four colocated engines on one host decode up to 40% slower than one alone, unevenly by GPU (four_gpu.md,
4 x H200), and the driver waits for the slowest replica. A decode step is short and CPU-bound between kernels, so
a worker that the scheduler moves to the far socket pays for it every step. The kernel lists the cores nearest each
PCI device in sysfs; this pins the process there, and leaves it alone where sysfs says nothing.
"""
from __future__ import annotations

import os
from typing import Optional

SYSFS_PCI = "/sys/bus/pci/devices"


def parse_cpulist(text: str) -> set[int]:
    """The kernel's cpulist format ("0-15,32-47", "3", ""): the set of core ids."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def pci_bus_id(device_index: int) -> Optional[str]:
    """The sysfs name of a CUDA device ("0000:18:00.0"), or None where torch does not report its PCI address."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    domain, bus, dev = (getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if bus is None or dev is None:
        return None
    return f"{domain or 0:04x}:{bus:02x}:{dev:02x}.0"


def local_cores(bus_id: str, root: str = SYSFS_PCI) -> set[int]:
    """The cores the kernel lists as nearest the device (empty: unknown)."""
    try:
        with open(os.path.join(root, bus_id.lower(), "local_cpulist")) as f:
            return parse_cpulist(f.read())
    except OSError:
        return set()


def bind_to_device(device_index: int, root: str = SYSFS_PCI) -> Optional[set[int]]:
    """Pin this process to the cores nearest CUDA device `device_index` that it may already use; returns them,
    or None where nothing was changed (no PCI address, no sysfs entry, or none of those cores allowed here)."""
    bus_id = pci_bus_id(device_index)
    cores = local_cores(bus_id, root) if bus_id else set()
    allowed = cores & os.sched_getaffinity(0)
    if not allowed:
        return None
    os.sched_setaffinity(0, allowed)
    return allowed
