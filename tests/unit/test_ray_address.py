"""A driver told to join a Ray cluster that does not answer (RAY_ADDRESS, ray_kwargs.ray_init.address) stops within
ray_kwargs.connect_timeout_s with a message naming the address, where it came from and what to do; ray.init alone
retries for ~14 minutes (20 tries of ~40 s each in Ray 2.60)."""
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from hybridrl.controller.ray_address import RayAddressUnreachable, check_ray_address, join_address
from hybridrl.utils.net import free_port

pytestmark = pytest.mark.timeout(90)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DRIVER = textwrap.dedent("""\
    from hybridrl.controller import init_ray
    init_ray(num_cpus=1, connect_timeout_s=3)
    """)


def test_a_driver_with_an_unreachable_ray_address_fails_within_the_timeout():
    port = free_port()  # nothing listens there: connections are refused
    env = dict(os.environ, PYTHONPATH=ROOT, RAY_ADDRESS=f"127.0.0.1:{port}")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", DRIVER], env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert proc.returncode != 0 and "RayAddressUnreachable" in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert f"RAY_ADDRESS=127.0.0.1:{port}" in last and "ray_kwargs.connect_timeout_s=3s" in last
    assert "launch/ray_start.sh head" in last and "unset RAY_ADDRESS" in last
    assert took < 30, took  # 3 s of retries plus Python and Ray imports


def test_a_port_that_is_not_a_ray_gcs_is_named_with_the_key_it_came_from(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with socket.create_server(("", 0)) as silent:  # accepts connections (the kernel does), never speaks gRPC
        port = silent.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(RayAddressUnreachable) as err:
            check_ray_address(f"127.0.0.1:{port}", timeout_s=2)
    assert time.monotonic() - start < 10
    msg = str(err.value)
    assert f"127.0.0.1:{port} (ray_kwargs.ray_init.address)" in msg and "does not answer as a Ray GCS" in msg
    assert "drop ray_kwargs.ray_init.address (or set it to local)" in msg


def test_a_job_server_url_is_refused_at_once(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    with pytest.raises(RayAddressUnreachable, match=r"RAY_ADDRESS=http://127.0.0.1:8265 is a job server"):
        check_ray_address(None, timeout_s=30)


def test_only_a_given_address_is_checked(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert join_address(None) is None and join_address("local") is None and join_address("auto") is None
    assert join_address("10.0.0.1:6379") == ("10.0.0.1:6379", "ray_kwargs.ray_init.address")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")  # Ray's order: the variable wins over unset or "auto" ...
    assert join_address(None) == join_address("auto") == ("10.0.0.2:6379", "the environment variable RAY_ADDRESS")
    assert join_address("local") is None  # ... never over "local"
    check_ray_address("local", timeout_s=1)  # starts Ray here: nothing to reach
    with pytest.raises(ValueError, match="ray_kwargs.connect_timeout_s=0 must be > 0"):
        check_ray_address("10.0.0.1:6379", timeout_s=0)
