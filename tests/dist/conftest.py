"""What modules of this folder share, made once per session.

`hybrid_reports`: test_cross_copy.py's and test_hybrid_reshard.py's drivers in one torchrun launch of 4 ranks
(hybrid_helpers/hybrid_run.py): on 2 cores, 4 ranks starting up (torch, transformers, megatron-core each) cost about as
much as the cross copy's checks themselves. The cross copy runs on the reshard test's tiny Qwen2, the folder it
built the same way before (save_tiny, the same config and seed).

`one_rank_megatron`: the one-rank drivers of test_megatron_overlap_update.py, test_megatron_master_init.py and
test_megatron_memory_knobs.py (overlap_run, master_init_run, knobs_run) in one torchrun process
(megatron_helpers/one_rank_run.py), each with the folders its module gave it before.
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
ONE_RANK_LAUNCH_TIMEOUT_S = 240  # what each of the three launches had, under their tests' 300 s


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


@pytest.fixture(scope="session")
def one_rank_megatron(tmp_path_factory) -> dict[str, dict]:
    """{"overlap": overlap_run's rank0.json, "master_init": master_init_run's, "knobs": knobs_run's}."""
    sys.path.insert(0, str(Path(__file__).parent / "megatron_helpers"))
    import tiny

    import launch

    root = tmp_path_factory.mktemp("one_rank")
    folders = {k: (str(root / f"{k}_models"), str(root / f"{k}_out")) for k in ("overlap", "master_init", "knobs")}
    tiny.make_model("qwen2", folders["knobs"][0])  # the others make their own models
    argv: list[str] = []
    for key, driver in (("overlap", "overlap_run"), ("master_init", "master_init_run"), ("knobs", "knobs_run")):
        models, out = folders[key]
        argv += [*(["--next"] if argv else []), driver, "--models", models, "--out", out]  # knobs_run last: see there
    launch.torchrun("one_rank_run.py", 1, argv, ONE_RANK_LAUNCH_TIMEOUT_S)
    return {k: launch.rank_results(out)[0] for k, (_, out) in folders.items()}
