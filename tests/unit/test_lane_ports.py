"""Fixed TCP ports two lease lanes would both take: a lone process's torch.distributed rendezvous (DistContext.from_env:
`python -m hybridrl.trainer.main_sft` without torchrun, row agent_tools_sft, bound 127.0.0.1:29500 and failed with
EADDRINUSE while anything else held it) and peer_verl/check_megatron_engine.py's (row peer_stage_megatron, 29531)."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys

import pytest

from hybridrl.controller.worker import DistContext

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TORCHRUN_VARS = ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@contextlib.contextmanager
def held(port: int):
    """The port taken by another process's listener, as another lane's run would hold it (or already taken)."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        s.listen()
    except OSError:
        pass  # something on this machine holds it already: as good
    try:
        yield
    finally:
        s.close()


def _clean(monkeypatch):
    for key in TORCHRUN_VARS:  # set then delete: monkeypatch puts back what was there, and removes what we add
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_lone_process_takes_a_free_port_and_keeps_it(monkeypatch):
    _clean(monkeypatch)
    with held(29500):
        ctx = DistContext.from_env(use_gpu=False)
        assert ctx.world_size == 1 and ctx.master_port != 29500 and _free(ctx.master_port)
    assert os.environ["MASTER_PORT"] == str(ctx.master_port)  # published: the process's later contexts agree
    assert DistContext.from_env(use_gpu=False).master_port == ctx.master_port


def test_ranks_of_a_launch_keep_the_port_they_are_given(monkeypatch):
    _clean(monkeypatch)
    monkeypatch.setenv("MASTER_PORT", "29123")
    assert DistContext.from_env(use_gpu=False).master_port == 29123
    monkeypatch.delenv("MASTER_PORT")
    monkeypatch.setenv("WORLD_SIZE", "2")  # several ranks must agree on one port: not one each
    assert DistContext.from_env(use_gpu=False).master_port == 29500 and "MASTER_PORT" not in os.environ


@pytest.mark.timeout(120)
def test_a_lone_local_backend_process_joins_its_group_while_29500_is_held():
    """What main_sft does without torchrun (trainer.backend=local): spawn_local_host's DistContext.from_env, then
    init_process_group (gloo here)."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env["PYTHONPATH"] = ROOT
    code = ("from hybridrl.controller.worker import DistContext, init_process_group_once; "
            "import torch.distributed as dist; ctx = DistContext.from_env(use_gpu=False); "
            "init_process_group_once(ctx); print('joined on', ctx.master_port); dist.destroy_process_group()")
    with held(29500):
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0 and "joined on" in proc.stdout, proc.stderr[-3000:]


def test_the_peer_engine_check_picks_a_free_port(monkeypatch):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "peer_verl"))
    import check_megatron_engine as engine

    _clean(monkeypatch)
    with held(29531):
        engine._dist_env()
        port = int(os.environ["MASTER_PORT"])
        assert port != 29531 and _free(port)
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("0", "1", "0")
    monkeypatch.setenv("MASTER_PORT", "12345")
    engine._dist_env()
    assert os.environ["MASTER_PORT"] == "12345"  # the caller's, when given
