"""One row of the run table for real on CPU (issue 36): scale_0.5b's dry run, through runs.py as on the GPU host, with
the tiny model, gloo and the torch engine: the model built, `hybridrl plan --json`, run.json, three GRPO steps of
the real trainer and scale_report.py (about 35 s). tests/unit/test_run_table.py checks every row's commands."""
from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import runs  # noqa: E402


def test_scale_dry_run(tmp_path, capsys):
    out = tmp_path / "out"
    rc = runs.main(["--out", str(out), "--set", f"SCALE_MODELS={tmp_path}", "dry", "scale_0.5b"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "== scale_0.5b rc=0" in printed and "plan rc=0" in printed
    run = json.loads((out / "scale_0.5b" / "run.json").read_text())
    assert run["shape"] == "0.5b" and run["model_shape"] == "tiny" and run["device"] == "cpu"
    assert json.loads((out / "scale_0.5b" / "plan.json").read_text())["ok"] is not False
    report = json.loads((out / "results" / "megatron_scale.json").read_text())
    assert report["metrics"], report
