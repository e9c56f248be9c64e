"""Joining a Ray cluster: check, in bounded time, that its address answers before `ray.init` tries it.

`ray.init(address=HOST:PORT)` (or RAY_ADDRESS) retries its GCS connection NUM_REDIS_GET_RETRIES (20) times,
each try waiting gcs_rpc_server_connect_timeout_s (5 s) + the pubsub connection (5 s) + py_gcs_connect_timeout_s
(30 s), one second apart: about 14 minutes for an address where nothing answers (Ray 2.60's node.py
`_init_gcs_client`). Those are Ray config values read once, when `ray` is imported (RAY_<name> variables), so
a driver cannot shorten them at run time. The driver checks the address itself first instead: a TCP connection,
then the HTTP/2 handshake that Ray's GCS and its Ray Client server (ray://) both answer as gRPC servers, all
within `timeout_s`, and fails with a message that says where the address came from and what to do.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Optional

__all__ = ["RayAddressUnreachable", "check_ray_address", "join_address"]

ADDRESS_KEY, TIMEOUT_KEY = "ray_kwargs.ray_init.address", "ray_kwargs.connect_timeout_s"


class RayAddressUnreachable(ConnectionError):
    """The Ray cluster this driver was told to join did not answer within the connect timeout."""


def join_address(address: Optional[str]) -> Optional[tuple[str, str]]:
    """(address, where it came from) when `ray.init(address=address)` joins a cluster at a given address; None
    when it starts one here ("local", or nothing set) or looks for one on this machine ("auto" alone).
    Ray's own order: RAY_ADDRESS wins over an unset or "auto" address."""
    env = os.environ.get("RAY_ADDRESS")
    if address in (None, "auto") and env:
        return env, "the environment variable RAY_ADDRESS"
    if address not in (None, "auto", "local"):
        return address, ADDRESS_KEY
    return None


def check_ray_address(address: Optional[str], timeout_s: float) -> None:
    """Raise RayAddressUnreachable (after `timeout_s` at most, plus a second for the handshake) unless the
    cluster that `ray.init(address=address)` would join answers; return at once when it would start one."""
    if not timeout_s > 0:
        raise ValueError(f"{TIMEOUT_KEY}={timeout_s} must be > 0")
    found = join_address(address)
    if found is None:
        return
    given, source = found
    scheme, _, rest = given.rpartition("://")
    if scheme in ("http", "https"):
        raise RayAddressUnreachable(
            f"{_where(given, source)} is a job server (dashboard) URL, which `ray job submit` takes "
            "(launch/ray_start.sh submit); a driver joins the head's GCS at HOST:PORT (ray start --head --port, "
            f"default 6379). {_fix(source)}")
    target = _target(given, scheme) if scheme in ("", "ray") else None
    if target is None:  # not HOST:PORT, or another scheme: ray.init's to judge
        return
    reason = _probe(*target, timeout_s=timeout_s, grpc_handshake=os.environ.get("RAY_USE_TLS", "0").lower()
                    not in ("1", "true"))
    if reason:
        raise RayAddressUnreachable(
            f"cannot reach the Ray cluster at {_where(given, source)} within {TIMEOUT_KEY}={timeout_s:g}s: "
            f"{reason}. {_fix(source)}")


def _where(given: str, source: str) -> str:
    return f"RAY_ADDRESS={given}" if "RAY_ADDRESS" in source else f"{given} ({source})"


def _fix(source: str) -> str:
    start = ("Start the Ray head there first (launch/ray_start.sh head; launch/slurm/ray_job.sbatch starts one and "
             "sets RAY_ADDRESS), ")
    if "RAY_ADDRESS" in source:
        return start + "or unset RAY_ADDRESS to start Ray on this machine."
    return start + f"or drop {ADDRESS_KEY} (or set it to local) to start Ray on this machine."


def _target(given: str, scheme: str) -> Optional[tuple[str, int]]:
    """The (host, port) ray.init connects to: the GCS address as Ray canonicalizes it (localhost becomes this
    node's IP, where `ray start --head` listens), or a Ray Client server's address as given."""
    host, _, port = given.split("://")[-1].rpartition(":")
    if not host or not port.isdigit():
        return None
    if not scheme:
        try:
            from ray._private.services import canonicalize_bootstrap_address

            host, _, port = canonicalize_bootstrap_address(given).rpartition(":")
        except Exception:  # noqa: BLE001 - a bad address is ray.init's to report
            return None
    return host.strip("[]"), int(port)


def _probe(host: str, port: int, *, timeout_s: float, grpc_handshake: bool) -> str:
    """Why (host, port) does not answer, or "" when it does. Refused connections are retried until the deadline:
    a head started just before this driver may not listen yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.1)).close()
            break
        except OSError as e:
            reason = f"{type(e).__name__}: {e}"
            if isinstance(e, socket.gaierror) or time.monotonic() + 0.5 >= deadline:
                return reason
            time.sleep(0.5)
    if not grpc_handshake:  # TLS: Ray's gRPC servers want a certificate this check does not have
        return ""
    import grpc

    channel = grpc.insecure_channel(f"{host}:{port}" if ":" not in host else f"[{host}]:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=max(deadline - time.monotonic(), 1.0))
        return ""
    except grpc.FutureTimeoutError:
        return ("the port accepts connections but does not answer as a Ray GCS (a gRPC server); is it another "
                "service, e.g. the dashboard (8265)? The GCS port is the head's `ray start --port` (default 6379)")
    finally:
        channel.close()
