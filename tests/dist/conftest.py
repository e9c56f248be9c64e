"""What two modules of this folder share, made once per session.

`hybrid_reports`: test_cross_copy.py's and test_hybrid_reshard.py's drivers in one torchrun launch of 4 ranks
(hybrid_helpers/hybrid_run.py): on 2 cores, 4 ranks starting up (torch, transformers, megatron-core each) cost about as
much as the cross copy's checks themselves. The cross copy runs on the reshard test's tiny Qwen2, the folder it
built the same way before (save_tiny, the same config and seed).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).parent / "hybrid_helpers"
WORLD = 4
# under the first item's own limit (test_cross_copy.py: 180 + 60 s), with room for building the models
HYBRID_LAUNCH_TIMEOUT_S = 220


@pytest.fixture(scope="session")
def hybrid_reports(tmp_path_factory) -> dict[str, list]:
    """{"cross": per-rank reports of cross_run.py, "reshard": those of reshard_run.py}."""
    from tests.dist.test_hybrid_reshard import tiny_models

    root = tmp_path_factory.mktemp("hybrid")
    dirs = tiny_models(root)
    qwen2 = next(d for d in dirs if os.path.basename(d) == "qwen2")
    outs = {"cross": root / "cross_out", "reshard": root / "reshard_out"}
    for out in outs.values():
        out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}", "--standalone",
           str(HELPERS / "hybrid_run.py"), str(outs["cross"]), qwen2, str(outs["reshard"]), *dirs]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(HELPERS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=HYBRID_LAUNCH_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return {k: [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)] for k, out in outs.items()}

