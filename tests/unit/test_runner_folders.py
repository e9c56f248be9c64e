"""A run row's folder: made empty for the run, never emptied when an earlier run left files there."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import runner  # noqa: E402


def test_a_run_folder_is_made_and_an_earlier_runs_folder_is_left_as_it_was(tmp_path):
    new = tmp_path / "scale_0.5b"
    runner.Fresh(str(new)).perform(None)
    assert new.is_dir() and not any(new.iterdir())
    runner.fresh_folder(str(new))  # empty: still usable
    (new / "logs").mkdir()
    (new / "logs" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(SystemExit, match="earlier run's files; run with another --out"):
        runner.Fresh(str(new)).perform(None)
    assert (new / "logs" / "metrics.jsonl").read_text() == '{"step": 1}\n'
