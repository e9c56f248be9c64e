"""utils.net.free_port: a port below the kernel's ephemeral range (where outgoing connections never land), free, and
the kernel's own pick when no port below that range is left."""
from __future__ import annotations

import socket

from hybridrl.utils import net


def test_free_ports_avoid_the_ephemeral_range_and_bind():
    low, high = net.ephemeral_range()
    ports = {net.free_port("127.0.0.1") for _ in range(20)}
    assert all(net.LOW <= p <= net.HIGH and not low <= p <= high for p in ports)
    assert len(ports) > 1  # drawn at random: two jobs starting together rarely draw the same
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_taken_ports_are_skipped_and_a_full_range_falls_back_to_the_kernel(monkeypatch):
    low = next(p for p in range(21000, 32000, 2) if net._bindable("127.0.0.1", p) and net._bindable("127.0.0.1", p + 1))
    monkeypatch.setattr(net, "LOW", low)
    monkeypatch.setattr(net, "HIGH", low + 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", low))
        s.listen()
        assert net.free_port("127.0.0.1") == low + 1
    monkeypatch.setattr(net, "ephemeral_range", lambda: (low, 60999))  # every candidate is ephemeral
    port = net.free_port("127.0.0.1")
    assert not low <= port <= low + 1 and port > 0


def test_ephemeral_range_is_read_from_the_kernel_file(tmp_path):
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert net.ephemeral_range(str(f)) == (40000, 50000)
    assert net.ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
