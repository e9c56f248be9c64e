"""benchmarks/startup_bench.py smol (row startup_smol): the cold run's empty vLLM/Triton caches are a folder of this run.
They were /tmp/startup_bench_cache, emptied first: a second run of the row (another lease lane) emptied the first's
caches under it, between its cold and its warm run."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import startup_bench  # noqa: E402


def test_each_run_has_caches_of_its_own_and_removes_them(tmp_path, monkeypatch):
    shared = tmp_path / "startup_bench_cache"  # what another run of the row holds
    (shared / "triton").mkdir(parents=True)
    (shared / "another_runs_cache").write_text("x")
    monkeypatch.setattr(startup_bench, "CACHE", str(shared), raising=False)  # the old default, where it is read
    seen = []

    def trainer(cmd, stdout, stderr, env, cwd, timeout):
        cache = env["VLLM_CACHE_ROOT"]
        assert env["TRITON_CACHE_DIR"] == os.path.join(cache, "triton")
        seen.append((cache, sorted(os.listdir(cache)) if os.path.isdir(cache) else None))
        os.makedirs(os.path.join(cache, "triton"), exist_ok=True)
        open(os.path.join(cache, "compiled"), "w").close()  # what the cold run leaves for the warm one
        stdout.write("hybridrl: start-up 1.0 s\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(startup_bench.subprocess, "run", trainer)
    monkeypatch.setattr(sys, "argv", ["startup_bench.py", "smol", "--out", str(tmp_path / "out"), "--cpu"])
    os.makedirs(tmp_path / "out")
    assert startup_bench.main() == 0
    (cold, cold_had), (warm, warm_had) = seen
    assert cold == warm != str(shared) and cold_had == [] and warm_had == ["compiled", "triton"]
    assert not os.path.exists(cold)  # the run's own folder, removed after both runs
    assert (shared / "another_runs_cache").read_text() == "x"  # the other run's caches untouched


def test_a_cache_folder_given_is_emptied_first_and_kept(tmp_path, monkeypatch):
    given = tmp_path / "cache"
    given.mkdir()
    (given / "stale").write_text("x")
    seen = []

    def trainer(cmd, stdout, stderr, env, cwd, timeout):
        seen.append(sorted(os.listdir(env["VLLM_CACHE_ROOT"])) if os.path.isdir(env["VLLM_CACHE_ROOT"]) else [])
        os.makedirs(env["VLLM_CACHE_ROOT"], exist_ok=True)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(startup_bench.subprocess, "run", trainer)
    monkeypatch.setattr(sys, "argv", ["startup_bench.py", "smol", "--out", str(tmp_path / "out"), "--cpu",
                                      "--cache", str(given)])
    os.makedirs(tmp_path / "out")
    assert startup_bench.main() == 0
    assert seen[0] == [] and given.is_dir()
