"""Virtual pipeline stages (pp=2 x vpp=2) never train on exactly pp micro-batches, on which megatron-core 0.16.1's
interleaved schedule deadlocks (seen on gloo; the rule holds on every device: adapters/megatron/engine.py,
check_interleaved_count):
mini-batches that fit one micro-batch train on 2*pp instead (they hung before), a direct training pass on pp is
refused at once, and forward passes still run on pp. interleaved_run.py does the work in one torchrun launch."""
from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "megatron_helpers"))

import launch  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.timeout(150)]


def test_the_interleaved_schedule_never_trains_on_exactly_pp_micro_batches(tmp_path):
    models, out = str(tmp_path / "models"), str(tmp_path / "out")
    launch.torchrun("interleaved_run.py", 2, ["--models", models, "--out", out], timeout=120)
    results = launch.rank_results(out)
    assert len(results) == 2
    for r in results:
        for way in ("fixed", "dynamic"):  # three 4-sample mini-batches, each in 2*pp = 4 micro-batches
            assert r[way] == {"train_micro_batches": [4, 4, 4], "pg_loss_finite": True}, (way, r[way])
        assert "2 micro-batches cannot train with pipeline_model_parallel_size=2" in r["refused"]
        assert r["forward"] == {"micro_batches": [2], "rows": 12}
