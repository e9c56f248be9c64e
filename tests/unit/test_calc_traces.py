"""benchmarks/data/calc_traces (what agent_tools copies where reasoning_gym is missing) is exactly the generator's
output for agent_tools' default arguments."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(300)
def test_committed_traces_equal_a_fresh_generation(tmp_path):
    pytest.importorskip("reasoning_gym")
    out = tmp_path / "traces"
    subprocess.run([sys.executable, "-m", "hybridrl.data.gen_tool_traces", "--task", "gsm_symbolic", "--out_dir",
                    str(out), "--train", "2000", "--test", "100", "--seed", "7"], cwd=ROOT, check=True,
                   capture_output=True, timeout=240)
    for name in ("train.parquet", "test.parquet"):
        fresh = hashlib.sha256((out / name).read_bytes()).hexdigest()
        committed = hashlib.sha256(open(os.path.join(ROOT, "benchmarks", "data", "calc_traces", name), "rb").read())
        assert fresh == committed.hexdigest(), name
