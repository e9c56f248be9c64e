"""The processes a benchmark or test started, found through /proc and stopped without touching anything else:
a session's (a trainer or a Ray node started with start_new_session: Ray puts its workers in process groups of
their own, but they stay in the session), or those whose environment carries a run's marker (they outlive their
driver, in sessions of their own: Ray's raylet, vLLM's engines). Linux only. Used by two_nodes_kill.py,
peer_verl/rows.py and tests/e2e (test_faults, test_two_nodes)."""
from __future__ import annotations

import os
import re
import signal
import time
from typing import Callable


def session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] not in "ZX":
            pids.append(int(entry))
    return pids


def kill_until_gone(find: Callable[[], list[int]], timeout: float) -> list[int]:
    """SIGKILL every process `find` returns (SIGCONT first: a stopped process is killed too), in rounds until it
    returns none (one may fork meanwhile, or be caught mid-exec) or `timeout` passes; returns the survivors."""
    deadline = time.monotonic() + timeout
    while (pids := find()) and time.monotonic() < deadline:
        for pid in pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        time.sleep(0.1)
    return find()


def kill_session(sid: int, timeout: float = 10) -> None:
    """Every process of session `sid` killed; RuntimeError naming the survivors after `timeout`."""
    if left := kill_until_gone(lambda: session_pids(sid), timeout):
        raise RuntimeError(f"processes of session {sid} survive SIGKILL: {left}")


def kill_run(marker: str, timeout: float = 5) -> list[int]:
    """Every process carrying the run's `marker` (run_processes) killed; returns the survivors after `timeout`."""
    return kill_until_gone(lambda: run_processes(marker), timeout)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")


def raylet_node_id(sid: int) -> str:
    """The Ray node id of the node whose `ray start` leads session `sid` (its raylet's --node_id)."""
    for pid in session_pids(sid):
        try:
            m = re.search(r"--node_id=([0-9a-f]+)", cmdline(pid))
        except OSError:
            continue
        if m:
            return m.group(1)
    raise RuntimeError(f"no raylet in the session of Ray node process {sid}")


def run_processes(marker: str) -> list[int]:
    """The processes whose environment holds `marker` (NAME=VALUE): a run's driver and all it started, even after
    the driver has gone (they inherit its environment). A process caught mid-exec reads an empty environment:
    callers that kill scan again until none is found."""
    needle, found = marker.encode(), []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone, or another user's
            continue
    return found
