"""A driver killed with SIGKILL (or by the out-of-memory killer) cannot remove the temp folder init_ray made for its
run (Ray's session folder, the workers' TMPDIR: on this machine twelve such folders were found in /tmp after one
day). The next init_ray removes the folders whose owner.json names a driver that no longer runs, and nothing else."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from hybridrl.controller import runtime_env

pytestmark = pytest.mark.timeout(60)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MAKE_AND_HANG = textwrap.dedent("""\
    import sys, time
    from hybridrl.controller.runtime_env import _new_run_temp_dir
    path = _new_run_temp_dir(sys.argv[1])
    open(path + "/tmp/tmpabcwandb-media", "w").close()  # what a worker leaves in its TMPDIR
    print(path, flush=True)
    time.sleep(60)
    """)


def killed_driver_folder(base) -> str:
    proc = subprocess.Popen([sys.executable, "-c", MAKE_AND_HANG, str(base)], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    path = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert os.path.isdir(path) and os.listdir(os.path.join(path, "tmp"))  # left behind, as a killed run leaves it
    return path


def test_the_next_run_removes_the_folder_of_a_killed_driver_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime_env, "_RUN_TEMP_DIRS", [])
    stale = killed_driver_folder(tmp_path)
    untouched = {
        "hybridrl-nomarker": None,  # made by someone else, or before markers: not proven ours
        "hybridrl-live": {"pid": os.getpid(), "start": runtime_env._process_start(os.getpid()),
                          "pid_ns": runtime_env._pid_namespace()},  # a driver still running
        "hybridrl-otherns": {"pid": 1 << 22, "start": "1", "pid_ns": "pid:[1]"},  # another container's pids
        "someone-else": {"pid": 1 << 22, "start": "1", "pid_ns": runtime_env._pid_namespace()},  # not our prefix
    }
    for name, owner in untouched.items():
        (tmp_path / name).mkdir()
        if owner:
            (tmp_path / name / "owner.json").write_text(json.dumps(owner))
    reused = tmp_path / "hybridrl-reused"  # our pid, but recorded with another start time: the pid was reused
    reused.mkdir()
    (reused / "owner.json").write_text(json.dumps({"pid": os.getpid(), "start": "0", "pid_ns": runtime_env._pid_namespace()}))

    new = runtime_env._new_run_temp_dir(str(tmp_path))
    assert not os.path.exists(stale) and not reused.exists()
    assert sorted(os.listdir(tmp_path)) == sorted([*untouched, os.path.basename(new)])
    runtime_env.remove_run_temp_dirs()
    assert not os.path.exists(new)


def test_a_run_folder_records_its_driver(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime_env, "_RUN_TEMP_DIRS", [])
    path = runtime_env._new_run_temp_dir(str(tmp_path))
    owner = json.load(open(os.path.join(path, "owner.json")))
    assert owner["pid"] == os.getpid() and owner["start"] == open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]
    assert runtime_env.remove_stale_run_temp_dirs(str(tmp_path)) == []  # its driver (this process) still runs
    runtime_env.remove_run_temp_dirs()
