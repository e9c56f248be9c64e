"""global_profiler: the per-process window (hybridrl.utils.profiling), the driver's StepProfile and the keys' checks."""
from __future__ import annotations

import gzip
import json
import os

import pytest
import torch

from hybridrl.config import load_config, validate
from hybridrl.utils import profiling
from hybridrl.utils.errors import ConfigError


def _work() -> None:
    a = torch.randn(64, 64)
    for _ in range(3):
        a = torch.mm(a, a).tanh()


def test_a_window_writes_the_ops_and_a_chrome_trace(tmp_path):
    assert profiling.start(3)
    assert not profiling.start(3)  # a colocated role's call: the window is open already
    _work()
    assert profiling.stop(2, str(tmp_path), "actor_rank0") is None  # not the open step
    table = profiling.stop(3, str(tmp_path), "actor_rank0")
    assert table == os.path.join(str(tmp_path), "step_3", "actor_rank0.txt")
    text = open(table).read()
    assert text.startswith("step 3:") and "aten::mm" in text
    with gzip.open(table[:-len(".txt")] + ".trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)
    assert profiling.stop(3, str(tmp_path), "actor_rank0") is None  # closed: the next role's call writes nothing


def test_files_already_there_are_kept(tmp_path):
    step_dir = tmp_path / "step_1"
    step_dir.mkdir()
    (step_dir / "actor_rank0.txt").write_text("an earlier run's table")
    profiling.start(1)
    _work()
    table = profiling.stop(1, str(tmp_path), "actor_rank0")
    assert table.endswith("actor_rank0.1.txt")
    assert (step_dir / "actor_rank0.txt").read_text() == "an earlier run's table"


class _Group:
    """A worker group whose one process runs the real window (as colocated roles share one)."""

    def __init__(self, log: list) -> None:
        self.log = log

    def profile_start(self, step):
        self.log.append(("start", step))
        return [profiling.start(step)]

    def profile_stop(self, step, folder):
        self.log.append(("stop", step))
        return [profiling.stop(step, folder, "actor_rank0")]


def test_the_driver_opens_only_the_chosen_steps_and_marks_them(tmp_path, capsys):
    from hybridrl.trainer.profiling import StepProfile

    log: list = []
    group = _Group(log)
    prof = StepProfile([group], [2], str(tmp_path))
    for step in (1, 2, 3):
        prof.open(step)
        _work()
        metrics = prof.close(step)
        assert bool(metrics) == (step == 2)
    assert log == [("start", 2), ("stop", 2)]
    assert metrics == {} and sorted(os.listdir(tmp_path / "step_2")) == [
        "actor_rank0.trace.json.gz", "actor_rank0.txt"]  # the driver shares the worker's process here
    assert "profile of step 2: 1 tables" in capsys.readouterr().out


@pytest.mark.parametrize("overrides, message", [
    (["global_profiler.tool=torch"], "needs global_profiler.steps"),
    (["global_profiler.steps=[2]"], "without global_profiler.tool=torch"),
    (["global_profiler.tool=nsys", "global_profiler.steps=[2]"], "is not supported"),
    (["global_profiler.tool=torch", "global_profiler.steps=[0]"], "must be step numbers >= 1"),
])
def test_bad_profiler_keys_name_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(load_config(overrides, config_name="grpo_trainer"), cuda_available=lambda: False)


def test_from_run_defaults_the_folder_under_the_run(tmp_path):
    from hybridrl.trainer.profiling import StepProfile

    ok = ["actor_rollout_ref.actor.use_dynamic_bsz=true", f"trainer.default_local_dir={tmp_path}"]
    run = validate(load_config([*ok, "global_profiler.tool=torch", "global_profiler.steps=[2,4]"],
                               config_name="grpo_trainer"), cuda_available=lambda: False)
    group = _Group([])
    prof = StepProfile.from_run(run, [group, None, group])  # colocated roles' one group counted once
    assert prof.folder == os.path.join(str(tmp_path), "profile") and prof.steps == {2, 4} and prof.groups == [group]
    off = validate(load_config(ok, config_name="grpo_trainer"), cuda_available=lambda: False)
    assert StepProfile.from_run(off, [None]) is None
