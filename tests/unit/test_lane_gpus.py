"""A row run in a lease lane (lease.sh phase_rows: CUDA_VISIBLE_DEVICES=GPU) stays on the GPUs the caller gave it:
the first N of CUDA_VISIBLE_DEVICES, else the machine's first N (benchmarks/runner.py run_gpus). On 2026-11-28 the
peer rows ignored the caller's GPUs and both lanes ran on GPU 0 (test_peer_rows.py); these are the other places
that picked GPUs themselves: two_nodes.py's nodes, peer_verl/run.sh's engine check (row peer_stage_megatron) and
tests/gpu's torchrun launches (rows gpu_test_megatron_layouts_gpu, gpu_test_megatron_cp; tests/gpu beside lanes)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import runner  # noqa: E402
import two_nodes  # noqa: E402


@pytest.mark.parametrize("visible, want", [(None, ["0", "1"]), ("2,3", ["2", "3"]), ("3,1,0", ["3", "1"])])
def test_two_nodes_of_one_gpu_take_the_callers_gpus(monkeypatch, visible, want):
    _visible(monkeypatch, visible)
    assert [two_nodes.node_devices(s, two_nodes.gpus_per_node(2, 2)) for s in (0, 1)] == want


def test_two_nodes_of_two_gpus_split_the_callers_four(monkeypatch):
    _visible(monkeypatch, "4,5,6,7")
    assert [two_nodes.node_devices(s, two_nodes.gpus_per_node(4, 2)) for s in (0, 1)] == ["4,5", "6,7"]
    assert two_nodes.node_devices(0, two_nodes.gpus_per_node(2, 1)) == "4,5"
    _visible(monkeypatch, "2")
    with pytest.raises(SystemExit, match="two_nodes needs 2 GPUs; CUDA_VISIBLE_DEVICES=2 shows 1"):
        two_nodes.node_devices(1, 1)


@pytest.mark.parametrize("visible, want", [(None, "0"), ("", "0"), ("1", "1"), ("3,2", "3"), (" 2 , 3", "2")])
def test_the_shell_checks_gpu_is_the_callers_first(visible, want):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    out = subprocess.run(["bash", "-c", "source benchmarks/run_lib.sh && first_gpu"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == want


# a GPU picked without the caller: CUDA_VISIBLE_DEVICES set to a fixed index (shell or Python) or to range(n)
FIXED = re.compile(r"CUDA_VISIBLE_DEVICES=\d|CUDA_VISIBLE_DEVICES\W+[^\n]*\brange\(")


def test_no_row_script_or_gpu_test_picks_fixed_gpus():
    """Only the lease plans (benchmarks/leases/*.sh, which give each lane its GPUs) name GPUs; everything they run
    takes the caller's. Comments and docstrings' examples aside."""
    found = []
    for folder in ("benchmarks", os.path.join("tests", "gpu")):
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d not in ("results", "leases", "__pycache__")]
            for name in files:
                if not name.endswith((".py", ".sh")):
                    continue
                path = os.path.join(dirpath, name)
                for n, line in enumerate(open(path, errors="replace"), 1):
                    code = line.split("#", 1)[0]
                    if FIXED.search(code) and not code.lstrip().startswith(('"', "'")):
                        found.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_runner_run_gpus_names_what_needs_them(monkeypatch):
    _visible(monkeypatch, "1")
    assert runner.run_gpus(1) == "1"
    with pytest.raises(SystemExit, match="this run needs 2 GPUs; CUDA_VISIBLE_DEVICES=1 shows 1"):
        runner.run_gpus(2)


def _visible(monkeypatch, visible):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
