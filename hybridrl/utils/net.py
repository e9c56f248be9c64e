"""A TCP port for a process group's rendezvous that stays free until the group binds it.

A port from bind(("", 0)) comes from the kernel's ephemeral range, the same range every outgoing connection
takes its local port from: between picking it and the group's bind, any connection of this node (Ray's gRPC
clients make many) can take it, and init_process_group fails with EADDRINUSE (seen in make test,
2026-11-25). Ports below the ephemeral range are only taken by servers that ask for them, so they are picked
from there, at random, and checked free; Ray's own ports (6379, 8265, the worker range 10002-19999) are
left out.
"""
from __future__ import annotations

import random
import socket

LOW, HIGH = 20000, 32767  # above Ray's default worker ports, below Linux's default ephemeral range (32768-60999)
TRIES = 64
_RNG = random.SystemRandom()  # not the global generator: seeded jobs would all draw the same ports


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    try:
        with open(path) as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "") -> int:
    """A port free on `host` now, outside the ephemeral range when one is left below it (else the kernel's pick)."""
    eph_low, eph_high = ephemeral_range()
    candidates = [p for p in range(LOW, HIGH + 1) if not eph_low <= p <= eph_high]
    for port in _RNG.sample(candidates, min(TRIES, len(candidates))):
        if _bindable(host, port):
            return port
    with socket.socket() as s:  # the whole range is taken or ephemeral: the old way
        s.bind((host, 0))
        return s.getsockname()[1]


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
