"""Checkpoint folder: layout, atomic marker, keep-N pruning, resume modes, and kills mid-save."""
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from hybridrl.config.loader import ConfigError
from hybridrl.config.schema import TrainerConfig
from hybridrl.trainer import checkpoint_manager as cm
from hybridrl.trainer.checkpoint_manager import (
    MARKER,
    CheckpointError,
    CheckpointManager,
    TrainerState,
    capture_rng_state,
    find_resume_path,
    load_trainer_state,
    read_marker,
    restore_rng_state,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_part(name):
    def save(folder):
        with open(os.path.join(folder, "model.bin"), "wb") as f:
            f.write(name.encode() * 10)
    return save


PARTS = {"actor": write_part("actor"), "critic": write_part("critic")}


def save_steps(mgr, steps):
    for s in steps:
        mgr.save(s, PARTS, TrainerState(global_step=s))


def trainer_cfg(root, **kw):
    return TrainerConfig(default_local_dir=str(root), **kw)


def test_layout_state_roundtrip_and_redacted_config(tmp_path):
    config = {"trainer": {"save_freq": 5}, "actor_rollout_ref": {"model": {"hf_token": "hf_SECRET123"}}}
    mgr = CheckpointManager(str(tmp_path), config=config)
    loader_state = {"_num_yielded": 7, "sampler": {"generator": torch.arange(5, dtype=torch.uint8)},
                    "order": (3, 1, 2), 4: "int key", "arr": np.arange(3, dtype=np.int64), "raw": b"\x00\x01"}
    rng = capture_rng_state()
    expected_next = (random.random(), np.random.rand(), torch.rand(1).item())
    folder = mgr.save(3, PARTS, TrainerState(global_step=3, dataloader=loader_state, kl_ctrl={"value": 0.002}, rng=rng))

    assert folder == str(tmp_path / "global_step_3")
    assert sorted(os.listdir(folder)) == [".complete", "actor", "config.yaml", "critic", "trainer_state.json",
                                          "trainer_state.safetensors"]
    assert (tmp_path / MARKER).read_text() == "3\n"
    config_text = (tmp_path / "global_step_3" / "config.yaml").read_text()
    assert "hf_SECRET123" not in config_text and "save_freq: 5" in config_text
    json.loads((tmp_path / "global_step_3" / "trainer_state.json").read_text())  # plain JSON, no pickle

    state = load_trainer_state(folder)
    assert state.global_step == 3 and state.kl_ctrl == {"value": 0.002}
    d = state.dataloader
    assert d["_num_yielded"] == 7 and d["order"] == (3, 1, 2) and d[4] == "int key" and d["raw"] == b"\x00\x01"
    assert torch.equal(d["sampler"]["generator"], torch.arange(5, dtype=torch.uint8))
    assert isinstance(d["arr"], np.ndarray) and d["arr"].tolist() == [0, 1, 2]
    random.random(), np.random.rand(), torch.rand(1)  # move the generators on
    restore_rng_state(state.rng)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected_next


def test_unstorable_state_is_refused(tmp_path):
    with pytest.raises(TypeError, match="never pickle"):
        CheckpointManager(str(tmp_path)).save(1, {}, TrainerState(1, extra={"obj": object()}))
    assert read_marker(str(tmp_path)) is None


@pytest.mark.parametrize("failure", ["raise", "false"])
def test_failed_part_commits_nothing(tmp_path, failure):
    mgr = CheckpointManager(str(tmp_path))
    save_steps(mgr, [1])

    def bad(folder):
        if failure == "raise":
            raise OSError("disk full")
        return False

    with pytest.raises(CheckpointError, match="saving critic"):
        mgr.save(2, {"actor": write_part("a"), "critic": bad}, TrainerState(2))
    assert read_marker(str(tmp_path)) == 1
    assert not (tmp_path / "global_step_2" / ".complete").exists()
    assert find_resume_path(trainer_cfg(tmp_path)) == str(tmp_path / "global_step_1")


def test_marker_write_is_atomic(tmp_path, monkeypatch):
    mgr = CheckpointManager(str(tmp_path))
    save_steps(mgr, [1])
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).endswith(MARKER):
            raise OSError("crash during rename")
        return real_replace(src, dst)

    monkeypatch.setattr(cm.os, "replace", failing_replace)
    with pytest.raises(OSError, match="crash during rename"):
        save_steps(mgr, [2])
    assert (tmp_path / MARKER).read_text() == "1\n"
    assert [n for n in os.listdir(tmp_path) if "tmp" in n] == []  # no temporary left behind


def test_prune_keeps_newest_per_part(tmp_path):
    mgr = CheckpointManager(str(tmp_path), keep_actor=2, keep_critic=3)
    save_steps(mgr, [1, 2, 3, 4, 5])
    kept = {s: sorted(os.listdir(tmp_path / f"global_step_{s}")) for s in (3, 4, 5)}
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("global_step")) == [
        "global_step_3", "global_step_4", "global_step_5"]
    assert "actor" in kept[5] and "actor" in kept[4] and "critic" in kept[4]
    assert "actor" not in kept[3] and "critic" in kept[3]
    assert ".complete" not in kept[3] and ".pruned" in kept[3]  # lost its actor: not resumable
    assert find_resume_path(trainer_cfg(tmp_path)) == str(tmp_path / "global_step_5")


def test_prune_never_touches_the_marker_step(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    save_steps(mgr, [1, 2, 3])
    (tmp_path / MARKER).write_text("1\n")  # e.g. a newer save lost its marker update
    (tmp_path / "global_step_0").mkdir()  # an interrupted save older than the marker
    deleted = mgr.prune(keep_actor=1, keep_critic=1)
    assert (tmp_path / "global_step_1" / "actor").is_dir() and (tmp_path / "global_step_1" / ".complete").exists()
    assert not (tmp_path / "global_step_2").exists() and (tmp_path / "global_step_3" / "actor").is_dir()
    assert str(tmp_path / "global_step_0") in deleted
    mgr.prune(None, None)  # keep everything
    assert (tmp_path / "global_step_3" / ".complete").exists()


def test_resume_modes(tmp_path, caplog):
    assert find_resume_path(trainer_cfg(tmp_path, resume_mode="auto")) is None  # nothing saved yet
    mgr = CheckpointManager(str(tmp_path))
    save_steps(mgr, [2, 4])
    (tmp_path / "global_step_6" / "actor").mkdir(parents=True)  # interrupted, newer than the marker
    assert find_resume_path(trainer_cfg(tmp_path, resume_mode="disable")) is None
    assert find_resume_path(trainer_cfg(tmp_path, resume_mode="auto")) == str(tmp_path / "global_step_4")

    (tmp_path / "global_step_4" / ".complete").unlink()  # the marker now names an incomplete folder
    with caplog.at_level("WARNING", logger="hybridrl.checkpoint"):
        assert find_resume_path(trainer_cfg(tmp_path)) == str(tmp_path / "global_step_2")
    [line] = [r.getMessage() for r in caplog.records]
    assert "names step 4, which is incomplete" in line and line.endswith("global_step_2, the newest intact checkpoint")

    explicit = trainer_cfg(tmp_path, resume_mode="resume_path", resume_from_path=str(tmp_path / "global_step_2"))
    assert find_resume_path(explicit) == str(tmp_path / "global_step_2")
    for path, message in [(None, "needs trainer.resume_from_path"), (str(tmp_path / "nope"), "no such folder"),
                          (str(tmp_path / "global_step_4"), "not a complete checkpoint")]:
        with pytest.raises(ConfigError, match=message) as err:
            find_resume_path(trainer_cfg(tmp_path, resume_mode="resume_path", resume_from_path=path))
        assert "trainer.resume_from_path" in str(err.value)
    with pytest.raises(ConfigError, match="trainer.resume_mode='latest'"):
        find_resume_path(trainer_cfg(tmp_path, resume_mode="latest"))
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_trainer_state(str(tmp_path / "global_step_6"))


SAVER = textwrap.dedent("""
    import os, sys, time
    from hybridrl.trainer.checkpoint_manager import CheckpointManager, TrainerState, find_resume_path, load_trainer_state
    from hybridrl.config.schema import TrainerConfig
    root, mode, flag = sys.argv[1], sys.argv[2], sys.argv[3]

    def part(name, slow):
        def save(folder):
            with open(os.path.join(folder, "weights"), "wb") as f:
                f.write(os.urandom(1 << 16))
            if slow:
                open(flag, "w").close()  # tell the test we are mid-save
                time.sleep(60)
        return save

    mgr = CheckpointManager(root, keep_actor=2, keep_critic=2)
    if mode == "slow":   # step 1 completes; step 2 hangs inside its critic part
        mgr.save(1, {"actor": part("a", False), "critic": part("c", False)}, TrainerState(1))
        mgr.save(2, {"actor": part("a", False), "critic": part("c", True)}, TrainerState(2))
    else:                # save step after step as fast as possible, resuming from what is there
        path = find_resume_path(TrainerConfig(default_local_dir=root))
        step = load_trainer_state(path).global_step if path else 0
        open(flag, "w").close()
        while True:
            step += 1
            mgr.save(step, {"actor": part("a", False), "critic": part("c", False)}, TrainerState(step))
""")


def start_saver(tmp_path, mode):
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    flag = tmp_path / f"flag-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ckpt"), mode, str(flag)], env=env)
    deadline = time.monotonic() + 60
    while not flag.exists():
        assert proc.poll() is None, "saver exited early"
        assert time.monotonic() < deadline, "saver never started"
        time.sleep(0.02)
    return proc


def assert_marker_loads(root):
    marker = read_marker(root)
    path = find_resume_path(TrainerConfig(default_local_dir=root))
    assert path == os.path.join(root, f"global_step_{marker}")
    assert load_trainer_state(path).global_step == marker
    return marker


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_kill_during_slow_save_keeps_previous_marker(tmp_path, sig):
    proc = start_saver(tmp_path, "slow")
    proc.send_signal(sig)
    proc.wait(timeout=30)
    root = str(tmp_path / "ckpt")
    assert assert_marker_loads(root) == 1
    assert (tmp_path / "ckpt" / "global_step_2" / "actor" / "weights").exists()  # it was mid-save ...
    assert not (tmp_path / "ckpt" / "global_step_2" / ".complete").exists()  # ... and is not complete


def test_kill_at_random_instants_never_breaks_the_marker(tmp_path):
    rng = random.Random(0)
    root = str(tmp_path / "ckpt")
    markers = []
    for _ in range(3):
        proc = start_saver(tmp_path, "loop")  # resumes from the last good checkpoint each time
        time.sleep(rng.uniform(0.2, 0.6))
        proc.kill()
        proc.wait(timeout=30)
        markers.append(assert_marker_loads(root))
    assert markers == sorted(markers) and markers[-1] > 1  # progress was made and never went back
