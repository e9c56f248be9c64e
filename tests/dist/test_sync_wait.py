"""A peer that reaches the weight sync late, or whose engine wakes late, is counted as wait, not as sync or copy
time (2 gloo ranks).

Rank 1 offloads (or wakes its engine) LATE_S seconds after rank 0. Rank 0's `timing_s/reshard_wait` must hold that delay and
its `timing_s/reshard` must not (without the barrier, a delay like this lands inside the sync's first
collective).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HELPER = Path(__file__).parent / "hybrid_helpers" / "sync_wait_run.py"
LATE_S = 1.0
TIMEOUT_S = 120

pytestmark = pytest.mark.dist


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_a_late_peer_is_counted_as_wait_not_as_sync(tmp_path):
    first, late = _run(tmp_path, "offload")
    assert first["timing_s/reshard_wait"] >= 0.8 * LATE_S, first
    assert first["timing_s/reshard"] < 0.5 * LATE_S, first
    assert late["timing_s/reshard_wait"] < 0.5 * LATE_S, late
    assert first["sync_check/tensors_checked"] == late["sync_check/tensors_checked"] == 4


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_a_peer_whose_engine_wakes_late_is_counted_as_wait_not_as_copy(tmp_path):
    first, late = _run(tmp_path, "wake")
    assert first["timing_s/reshard_wait_wake"] >= 0.8 * LATE_S, first
    # the copy (collective, as megatron's export and the cross-GPU copy are) and its check wait for no one
    assert first["timing_s/reshard_stream"] + first["timing_s/sync_check"] < 0.5 * LATE_S, first
    assert late["timing_s/engine_wake_weights"] >= 0.8 * LATE_S and late["timing_s/reshard_wait_wake"] < 0.5 * LATE_S
    assert first["sync_check/tensors_checked"] == late["sync_check/tensors_checked"] == 4


def _run(tmp_path, where: str) -> tuple[dict, dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(HELPER),
           str(tmp_path), str(LATE_S), where]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    first, late = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    return first, late
