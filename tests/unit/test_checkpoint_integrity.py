"""Checkpoint integrity: the completion marker lists each file's size and CRC-32, auto resume skips a damaged step
for the newest intact one (one line naming the step and the file), resume_path and the merger name the file."""
import json
import zlib

import pytest

from hybridrl.config.loader import ConfigError
from hybridrl.config.schema import TrainerConfig
from hybridrl.trainer.checkpoint_files import DamagedCheckpointError, check_part, first_damage
from hybridrl.trainer.checkpoint_manager import CheckpointManager, TrainerState, find_resume_path


def write_part(folder):
    with open(f"{folder}/model.bin", "wb") as f:
        f.write(bytes(range(256)) * 64)


@pytest.fixture
def run(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    for step in (1, 2, 3):
        mgr.save(step, {"actor": write_part}, TrainerState(global_step=step))
    return tmp_path


def test_the_marker_records_every_file_with_size_and_crc32(run):
    files = json.loads((run / "global_step_2" / ".complete").read_text())["files"]
    assert set(files) == {"actor/model.bin", "trainer_state.json", "trainer_state.safetensors"}  # RNG tensors
    data = (run / "global_step_2" / "actor" / "model.bin").read_bytes()
    assert files["actor/model.bin"] == [len(data), zlib.crc32(data)]  # zlib's CRC of the bytes, read here
    state = (run / "global_step_2" / "trainer_state.json").read_bytes()
    assert files["trainer_state.json"] == [len(state), zlib.crc32(state)]


@pytest.mark.parametrize("damage,words", [("truncate", "is 100 bytes, the save wrote 16384"),
                                          ("flip", "checksum differs"), ("delete", "is missing")])
def test_auto_resume_falls_back_to_the_newest_intact_step(run, caplog, damage, words):
    target = run / "global_step_3" / "actor" / "model.bin"
    data = target.read_bytes()
    if damage == "truncate":
        target.write_bytes(data[:100])
    elif damage == "flip":
        target.write_bytes(data[:500] + bytes([data[500] ^ 1]) + data[501:])
    else:
        target.unlink()
    with caplog.at_level("WARNING", logger="hybridrl.checkpoint"):
        assert find_resume_path(TrainerConfig(default_local_dir=str(run))) == str(run / "global_step_2")
    [line] = [r.getMessage() for r in caplog.records]
    assert "step 3 is damaged" in line and str(target) in line and words in line and "global_step_2" in line


def test_a_damaged_state_file_is_named_and_two_damaged_steps_are_skipped(run, caplog):
    (run / "global_step_3" / "trainer_state.json").write_text("{")
    (run / "global_step_2" / "actor" / "model.bin").write_bytes(b"")
    with caplog.at_level("WARNING", logger="hybridrl.checkpoint"):
        assert find_resume_path(TrainerConfig(default_local_dir=str(run))) == str(run / "global_step_1")
    [line] = [r.getMessage() for r in caplog.records]
    assert "step 3 is damaged" in line and "trainer_state.json" in line and "step 2 is damaged" in line


def test_no_intact_step_refuses_with_the_ways_out(run):
    for step in (1, 2, 3):
        (run / f"global_step_{step}" / "actor" / "model.bin").write_bytes(b"x")
    with pytest.raises(ConfigError, match="no intact checkpoint.*trainer.resume_mode=resume_path.*default_local_dir"):
        find_resume_path(TrainerConfig(default_local_dir=str(run)))


def test_resume_path_and_the_merger_name_the_damaged_file(run):
    target = run / "global_step_2" / "actor" / "model.bin"
    target.write_bytes(target.read_bytes()[:10])
    cfg = TrainerConfig(default_local_dir=str(run), resume_mode="resume_path",
                        resume_from_path=str(run / "global_step_2"))
    with pytest.raises(ConfigError, match=f"trainer.resume_from_path=.*damaged checkpoint: {target} is 10 bytes"):
        find_resume_path(cfg)
    with pytest.raises(DamagedCheckpointError, match=f"{target} is 10 bytes"):
        check_part(str(run / "global_step_2" / "actor"))
    check_part(str(run / "global_step_3" / "actor"))  # intact: passes
    assert first_damage(str(run / "global_step_1")) is None
