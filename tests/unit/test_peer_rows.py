"""benchmarks/peer_verl/rows.py: a peer run stays on the GPUs it is given and, when it ends, stops only what it
started. On 2026-11-28 two lanes of one lease (a pair on GPU 0, another on GPU 1) both ran on GPU 0, because the rows
set CUDA_VISIBLE_DEVICES to the machine's first GPUs, and each run's clean-up (`ray stop --force`) ended the other
lane's run."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import procs  # noqa: E402
from peer_verl import rows  # noqa: E402


@pytest.mark.parametrize("visible, n, want", [(None, 1, "0"), (None, 4, "0,1,2,3"), ("1", 1, "1"),
                                              ("2,3", 1, "2"), ("3, 2,1,0", 4, "3,2,1,0"), ("", 2, "0,1")])
def test_a_run_takes_the_first_gpus_it_is_given(monkeypatch, visible, n, want):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert rows.run_gpus(n) == want


def test_too_few_visible_gpus_is_an_error_that_names_them(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(SystemExit, match="needs 4 GPUs; CUDA_VISIBLE_DEVICES=1 shows 1"):
        rows.run_gpus(4)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_the_clean_up_kills_what_the_run_started_and_nothing_else(tmp_path):
    marker = ("HYBRIDRL_PEER_RUN", f"test-{os.getpid()}-{time.time()}")
    # the run: a driver that left a grandchild behind in a session of its own (as Ray's raylet outlives its driver)
    ours = subprocess.Popen(["sh", "-c", "setsid sleep 60 & echo $! > child; sleep 60"], cwd=tmp_path,
                            env={**os.environ, marker[0]: marker[1]})
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, marker[0]: marker[1] + "-another"})
    try:
        deadline = time.time() + 10
        while not (tmp_path / "child").exists() or not (tmp_path / "child").read_text().strip():
            assert time.time() < deadline, "the test's grandchild did not start"
            time.sleep(0.05)
        grandchild = int((tmp_path / "child").read_text())
        while not _cmdline(grandchild).startswith(b"sleep"):  # its exec done: mid-exec, its environment reads empty
            assert time.time() < deadline, "the test's grandchild did not start"
            time.sleep(0.05)
        found = procs.run_processes("=".join(marker))
        assert ours.pid in found and grandchild in found and other.pid not in found
        train = rows.Train("t", str(tmp_path), ("true",), str(tmp_path / "m"), gpus="0")
        train._clear_gpus("=".join(marker))  # nvidia-smi absent here: only the kill, no wait
        assert ours.wait(timeout=10) == -9
        deadline = time.time() + 10
        while procs.alive(grandchild):
            assert time.time() < deadline, "the run's grandchild survived its clean-up"
            time.sleep(0.05)
        assert other.poll() is None, "the clean-up killed another run's process"
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
