"""What several end-to-end modules train on, made once per session: a trainer launch costs ~25 s of start-up on CPU.

`demo_prepared`: the demo's data and its warmed-up tiny model (demo.prepare, 20 supervised steps, seed 0).
`one_node_reference`: the uninterrupted 4-step demo job on it (Ray started by the job, 2 worker processes, checkpoints
at steps 2 and 4). test_faults.py compares its resumed runs against it and test_two_nodes.py its two-node layouts:
the same command in both modules, so it runs once.
"""
from __future__ import annotations

import time

import pytest


@pytest.fixture(scope="session")
def demo_prepared(tmp_path_factory) -> dict:
    from hybridrl.trainer.demo import prepare

    model, train, test = prepare(str(tmp_path_factory.mktemp("prepared")), sft_steps=20, seed=0)
    return {"model": model, "train": train, "test": test}


@pytest.fixture(scope="session")
def one_node_reference(demo_prepared, tmp_path_factory) -> dict:
    from tests.e2e.test_faults import metrics_by_step, run_to_end, shard_bytes, trainer_args

    out = tmp_path_factory.mktemp("reference")
    start = time.monotonic()
    t = run_to_end("reference", out, trainer_args(demo_prepared, out / "ckpt"))
    rows = metrics_by_step(out / "ckpt")
    return {"rows": rows, "out": out / "ckpt", "trainer": t, "seconds": time.monotonic() - start,
            "shards": shard_bytes(str(out / "ckpt" / "global_step_4"))}
