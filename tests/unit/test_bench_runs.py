"""benchmarks/runs.py names every GPU run: a mode added to a shell runner without a row here fails."""
from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import runs  # noqa: E402

# a mode whose row names differ from the mode: scale SHAPE is one row per shape, grpo NAME N one per documented run
EXPANDED = {"gpu_run.sh": {"scale": "scale_"}, "multi_gpu_run.sh": {"grpo": "grpo_", "stage": "multi_stage",
                                                                    "report": "multi_report"}}


def case_modes(path: str) -> set[str]:
    """The mode patterns of the script's `case "$MODE" in` (alternatives split; `*` is the unknown-mode exit)."""
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    body = text[text.index('case "$MODE" in'):]
    modes = set()
    for pattern in re.findall(r"^  ([a-z0-9_.|*]+)\)", body, flags=re.M):
        modes.update(m for m in pattern.split("|") if m != "*")
    return modes


def covered(mode: str, script: str) -> bool:
    name = EXPANDED.get(script, {}).get(mode, mode)
    if script == "run.sh":
        name = f"peer_{mode}"
    if name.endswith("_*"):  # verl_megatron_*: one row per documented job
        return any(r.startswith(name[:-1]) for r in runs.RUNS)
    return name in runs.RUNS or name.endswith("_") and any(r.startswith(name) for r in runs.RUNS)


def test_every_shell_mode_has_a_row():
    for path in ("benchmarks/gpu_run.sh", "benchmarks/multi_gpu_run.sh", "benchmarks/peer_verl/run.sh"):
        modes = case_modes(path)
        assert modes, path
        missing = sorted(m for m in modes if not covered(m, os.path.basename(path)))
        assert not missing, f"{path}: modes without a row in benchmarks/runs.py: {missing}"


def test_rows_name_scripts_that_exist_and_modes_the_scripts_accept():
    for run in runs.RUNS.values():
        script = run.command[1]
        assert os.path.exists(os.path.join(ROOT, script)), f"{run.name}: {script}"
        if run.command[0] == "bash":
            assert run.command[2] in case_modes(script) or any(
                m.endswith("*") and run.command[2].startswith(m[:-1]) for m in case_modes(script)), run.name


def test_show_and_list(capsys):
    assert runs.main(["show", "grpo_one_step_off"]) == 0
    assert "trainer.one_step_off_policy=true" in capsys.readouterr().out
    assert runs.main(["list", "--gpus", "1"]) == 0
    listed = capsys.readouterr().out
    assert "scale_7b" in listed and "grpo_2gpu_tp " not in listed
    assert runs.main(["dry", "moetest"]) == 2  # a vLLM-only row has no CPU dry run
