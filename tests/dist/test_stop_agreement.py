"""Under torchrun (trainer.backend=local) the ranks agree on the step to stop at (stopping.StopSignals.agreed):
two gloo processes step in lockstep; a SIGTERM reaches rank 1 alone, just before its boundary check at step 3;
both stop after step 3 with the signal's name, rank 0 (which never got it) says so, rank 1 prints nothing."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.timeout(60)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RANK = r'''
import json, os, signal, sys, time
import torch.distributed as dist
from hybridrl.trainer.stopping import StopSignals

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=2)
with StopSignals(grace_s=30, ranks=True) as s:
    s.training = True
    stopped_at = None
    for step in range(1, 8):
        time.sleep(0.05 * (1 - rank))  # rank 0 a little behind, as ranks are
        if rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        if s.agreed():
            stopped_at = step
            break
    signal.setitimer(signal.ITIMER_REAL, 0)
    json.dump({"stopped_at": stopped_at, "signal": s.name}, open(sys.argv[1], "w"))
dist.destroy_process_group()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_signal_on_one_rank_stops_both_after_the_same_step(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
    env = dict(base, PYTHONPATH=ROOT, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / f"rank{r}.json")], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=50) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results == [{"stopped_at": 3, "signal": "SIGTERM"}] * 2
    assert outs[0][0].startswith("hybridrl: SIGTERM received by another rank: stopping after this step and saving it")
    assert outs[1][0] == "" and "Traceback" not in outs[0][1] + outs[1][1]
