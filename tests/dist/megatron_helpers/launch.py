"""Launching megatron test scripts under torchrun from pytest, with a hard timeout."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return e


def run(cmd: list[str], timeout: float, cwd: str = ROOT) -> subprocess.CompletedProcess:
    """Run a command; on failure or timeout raise with the tail of its output."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")[-6000:] if isinstance(e.stdout, bytes) else (e.stdout or "")[-6000:]
        raise AssertionError(f"timed out after {timeout}s: {' '.join(cmd)}\n{out}") from None
    if proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {' '.join(cmd)}\n--- stdout\n{proc.stdout[-4000:]}"
                             f"\n--- stderr\n{_errors(proc.stderr)}")
    return proc


def torchrun(script: str, nproc: int, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           os.path.join(HERE, script), *args]
    return run(cmd, timeout)


def rank_results(out_dir: str) -> list[dict]:
    files = sorted(glob.glob(os.path.join(out_dir, "rank*.json")), key=lambda f: int(f.split("rank")[-1][:-5]))
    return [json.load(open(f)) for f in files]


def _errors(stderr: str) -> str:
    """The traceback part of a noisy stderr (megatron warns a lot on CPU)."""
    lines = [ln for ln in stderr.splitlines() if "Warning" not in ln and "warnings.warn" not in ln]
    return "\n".join(lines[-80:])
