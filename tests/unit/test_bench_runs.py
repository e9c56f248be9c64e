"""Every GPU run the documents name is reachable by name through benchmarks/runs.py (issue 36): each command of the
README, DEVELOPERS.md, docs/*.md, benchmarks/results/*.md and benchmarks/peer_verl/README.md that runs on the GPU
host (a mode of the old shell runners, a row of a runner's own table, a benchmark script) has a row of the run table.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import runs  # noqa: E402

DOCS = ["README.md", "DEVELOPERS.md", *glob.glob("docs/*.md", root_dir=ROOT), *glob.glob("benchmarks/results/*.md",
        root_dir=ROOT), "benchmarks/peer_verl/README.md"]
STAGING = {"stage", "stage_megatron"}  # shell: gpu_run.sh stage, peer_verl/run.sh stage|stage_megatron
# benchmark scripts that are not GPU runs of their own: CPU tools, a row's steps or a runner's helpers
NOT_ROWS = {"plan_at_scale", "plan_calibration", "cross_copy_cpu", "sandbox_overhead", "grpo_sync_summary", "bench_common", "runner",
            "standalone_vllm",  # the peers hybrid_bench (the row bench) starts
            "runs", "rows_one_gpu", "rows_two_gpu", "rows_moe"}


def documents() -> str:
    """The code of the documents: fenced blocks and inline `code` spans (commands are written there; prose that
    mentions a script is not a command)."""
    text = "\n".join(open(os.path.join(ROOT, d), encoding="utf-8").read() for d in DOCS)
    return "\n".join(re.findall(r"```.*?```|`[^`]+`", text, flags=re.S))


def named_runs(code: str) -> set[str]:
    """The row each documented command names, as the old shell runners forward their modes (a mode followed by an
    upper-case placeholder, such as `scale SHAPE` or `verl_megatron_JOB`, names a family, not a row)."""
    rows = set()
    for modes, arg in re.findall(r"(?<!multi_)gpu_run\.sh ([a-z0-9_|]+)(?:\s+([0-9.]+b)\b)?", code):
        rows.update(f"scale_{arg}" if m == "scale" and arg else m for m in modes.split("|") if m != "scale" or arg)
    for modes in re.findall(r"multi_gpu_run\.sh ([a-z0-9_|]+)", code):
        rows.update(m if m == "parity" else f"multi_{m}" for m in modes.split("|"))
    for modes in re.findall(r"(?<![a-z_])run\.sh\s+([a-z0-9_|]+)", code):
        rows.update(f"peer_{m}" for m in modes.split("|"))
    for names in re.findall(r"four_gpu\.py run ((?:[a-z0-9_]+ )+)", code):
        rows.update(f"four_gpu_{n}" for n in names.split())
    rows.update(re.findall(r"runs\.py (?:run|dry|show) ([a-z0-9_.]+)", code))
    return {r for r in rows if not r.endswith("_") and r not in STAGING and r.removeprefix("peer_") not in STAGING}


def test_every_documented_run_has_a_row():
    named = named_runs(documents())
    assert {"grpo", "scale_0.5b", "multi_grpo", "peer_verl_megatron_1p5b", "four_gpu_7b_tp4", "moe"} <= named
    missing = sorted(n for n in named if n not in runs.RUNS)
    assert not missing, f"documented runs without a row in benchmarks/runs.py: {missing}"


def test_every_benchmark_script_the_documents_name_is_run_by_a_row(tmp_path):
    scripts = set(re.findall(r"benchmarks/((?:probes/|peer_verl/)?[a-z0-9_]+)\.py", documents()))
    listed = " ".join(" ".join(argv) for name, run in runs.RUNS.items()
                      for a in runs.actions(name, str(tmp_path), False, *_needs(name)) for argv in a.commands())
    missing = sorted(s for s in scripts if os.path.basename(s) not in NOT_ROWS and f"{s}.py" not in listed
                     and not s.startswith("peer_verl/"))  # peer_verl's scripts: run.sh's staging and rows.py
    assert not missing, f"benchmark scripts the documents name that no row runs: {missing}"


def _needs(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    args = {"multi_grpo": ("x", "1"), "scalemodel": ("7b",)}.get(name, ())
    return args, tuple("SEED=2" for k in runs.RUNS[name].knobs if k == "SEED")


def test_show_and_list(capsys):
    assert runs.main(["show", "grpo_one_step_off"]) == 0
    shown = capsys.readouterr().out
    assert "trainer.one_step_off_policy=true" in shown and "knobs: MODEL=" in shown
    assert runs.main(["list", "--gpus", "1"]) == 0
    listed = capsys.readouterr().out
    assert "scale_7b" in listed and "grpo_2gpu_tp " not in listed
    assert runs.main(["dry", "moetest"]) == 2  # a vLLM-only row has no CPU dry run


def test_the_old_entry_points_forward_to_the_table(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PY": sys.executable}
    for argv, expect in ((["bash", "benchmarks/gpu_run.sh", "moetest"], "moetest has no CPU dry run"),
                         (["bash", "benchmarks/multi_gpu_run.sh", "grpo"], "multi_grpo needs NAME NGPUS"),
                         (["bash", "benchmarks/gpu_run.sh", "scale", "9b"], "invalid choice: 'scale_9b'")):
        proc = subprocess.run(argv, cwd=ROOT, env={**env, "CPU": "1"}, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and expect in proc.stderr + proc.stdout, (argv, proc.stdout, proc.stderr)
