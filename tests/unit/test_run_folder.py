"""Nothing is destroyed that the command did not make: demo output folders need their marker, resume_mode=disable
refuses a folder holding a run (or deletes exactly that run when told to), and a finished run says so in one line
before anything starts. All before start-up, so each case takes seconds."""
import os

import pytest

from hybridrl.config.loader import ConfigError
from hybridrl.config.schema import TrainerConfig
from hybridrl.trainer.checkpoint_manager import CheckpointManager, TrainerState
from hybridrl.trainer.run_folder import check_run_folder, clear_earlier_run
from hybridrl.utils.out_dir import MARKER, OutputDirError, claim


def snapshot(root):
    return sorted((os.path.relpath(os.path.join(d, f), root), open(os.path.join(d, f), "rb").read())
                  for d, _, files in os.walk(root) for f in files)


def saved_run(root, steps=(1, 2), extra=None):
    mgr = CheckpointManager(str(root))
    for s in steps:
        mgr.save(s, {"actor": lambda d: open(os.path.join(d, "w.bin"), "wb").write(b"w")},
                 TrainerState(global_step=s, extra=extra or {}))
    (root / "logs").mkdir()
    (root / "logs" / "metrics.jsonl").write_text('{"step": 1}\n')


# ---- output folders ------------------------------------------------------------------------------------------
def test_claim_refuses_a_folder_it_did_not_make_and_changes_nothing(tmp_path):
    (tmp_path / "mine.txt").write_text("user data")
    (tmp_path / "checkpoints").mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(OutputDirError, match=f"--out {tmp_path} is not empty.*no {MARKER} marker.*new or empty"):
        claim(str(tmp_path), "hybridrl.trainer.demo", ("checkpoints",), fresh=True)
    assert snapshot(tmp_path) == before
    with pytest.raises(OutputDirError, match="is a file"):
        claim(str(tmp_path / "mine.txt"), "hybridrl.trainer.demo", (), fresh=True)


def test_claim_reuses_its_own_folder_replacing_only_its_entries(tmp_path):
    out = tmp_path / "out"
    claim(str(out), "demo-a", ("data", "model"), fresh=True)
    (out / "data").mkdir()
    (out / "data" / "x").write_text("old")
    (out / "notes.txt").write_text("the user's")
    claim(str(out), "demo-a", ("data", "model"), fresh=True)
    assert not (out / "data").exists() and (out / "notes.txt").read_text() == "the user's"
    with pytest.raises(OutputDirError, match="made by demo-a"):
        claim(str(out), "demo-b", ("notes.txt",), fresh=True)
    assert (out / "notes.txt").exists()


@pytest.mark.parametrize("demo", ["demo", "agent_demo"])
def test_demo_refuses_bad_overrides_and_foreign_folders_before_writing(tmp_path, capsys, demo):
    import importlib

    main = importlib.import_module(f"hybridrl.trainer.{demo}").main
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(SystemExit) as err:
        main(["--out", str(tmp_path / "new"), "--sft-steps", "1", "trainer.no_such_key=1"])
    assert err.value.code == 2 and not (tmp_path / "new").exists()
    assert main(["--out", str(tmp_path), "--sft-steps", "1"]) == 2
    assert "is not empty" in capsys.readouterr().err and sorted(os.listdir(tmp_path)) == ["keep.txt"]


# ---- runs in trainer.default_local_dir ----------------------------------------------------------------------
def test_disable_into_a_folder_holding_a_run_refuses_naming_both_ways_out(tmp_path):
    saved_run(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError) as err:
        check_run_folder(TrainerConfig(default_local_dir=str(tmp_path), resume_mode="disable"))
    msg = str(err.value)
    assert "already holds a run (global_step_1, global_step_2, latest_checkpointed_iteration.txt, logs)" in msg
    assert "give a new trainer.default_local_dir" in msg and "trainer.overwrite_existing_run=true" in msg
    assert "\n" not in msg and snapshot(tmp_path) == before


def test_overwrite_existing_run_deletes_that_run_and_nothing_else(tmp_path):
    saved_run(tmp_path)
    (tmp_path / "README.txt").write_text("mine")
    cfg = TrainerConfig(default_local_dir=str(tmp_path), resume_mode="disable", overwrite_existing_run=True)
    assert check_run_folder(cfg) is None and len(os.listdir(tmp_path)) == 5  # checking deletes nothing
    clear_earlier_run(cfg)
    assert os.listdir(tmp_path) == ["README.txt"]
    assert check_run_folder(TrainerConfig(default_local_dir=str(tmp_path / "new"), resume_mode="disable")) is None


@pytest.mark.parametrize("total,extra,finished", [(2, {}, True), (3, {}, False), (None, {}, False),
                                                  (None, {"total_steps": 2, "total_epochs": 30}, True),
                                                  (None, {"total_steps": 2, "total_epochs": 5}, False)])
def test_a_finished_run_is_named_in_one_line(tmp_path, total, extra, finished):
    saved_run(tmp_path, extra=extra)
    msg = check_run_folder(TrainerConfig(default_local_dir=str(tmp_path), total_training_steps=total))
    assert (msg is not None) == finished
    if finished:
        assert "is finished" in msg and "step 2 of 2" in msg and "trainer.total_training_steps" in msg
        assert "\n" not in msg


def test_main_ppo_prints_refusals_and_finished_runs_in_one_line_before_start_up(tmp_path, capsys):
    from hybridrl.trainer.main_ppo import main

    saved_run(tmp_path)
    base = ["--config-name", "demo", "data.train_files=x.parquet", "actor_rollout_ref.model.path=m",
            f"trainer.default_local_dir={tmp_path}"]
    with pytest.raises(SystemExit) as err:
        main(base + ["trainer.resume_mode=disable"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert err.value.code == 2 and len(lines) == 1 and lines[0].startswith("hybridrl: trainer.default_local_dir=")
    main(base + ["trainer.total_training_steps=2"])  # returns: nothing was started (no model "m" exists)
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith(f"hybridrl: the run in {tmp_path} is finished")
