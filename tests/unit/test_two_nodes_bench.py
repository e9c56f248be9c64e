"""benchmarks/two_nodes.py and two_nodes_kill.py without Ray: the GPUs each node gets for --gpus 2 and 4, the
report's file and keys on fake run folders (a 2-GPU run never lands in the 4-GPU file), and how the node's death
reads the job's output."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import two_nodes  # noqa: E402
import two_nodes_kill  # noqa: E402


def test_the_gpus_split_into_nodes_of_their_own_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the machine's GPUs (test_lane_gpus: the caller's)
    assert [two_nodes.node_devices(s, two_nodes.gpus_per_node(4, 2)) for s in (0, 1)] == ["0,1", "2,3"]
    assert [two_nodes.node_devices(s, two_nodes.gpus_per_node(2, 2)) for s in (0, 1)] == ["0", "1"]
    assert two_nodes.node_devices(0, two_nodes.gpus_per_node(2, 1)) == "0,1"
    with pytest.raises(SystemExit, match="do not split"):
        two_nodes.gpus_per_node(3, 2)
    assert two_nodes.results_file(4) == "two_nodes.json" and two_nodes.results_file(2) == "two_nodes_2gpu.json"


def test_the_batch_splits_over_dp_on_either_machine():
    job = dict(a.split("=", 1) for a in two_nodes.GPU_JOB if "=" in a)
    samples = int(job["data.train_batch_size"]) * int(job["actor_rollout_ref.rollout.n"])
    for gpus in two_nodes.GPUS:  # dp = every GPU, in either layout
        assert samples % gpus == 0 and int(job["actor_rollout_ref.actor.ppo_mini_batch_size"]) % gpus == 0


def test_job_args_extra_overrides_replace_the_jobs_own():
    args = two_nodes.job_args(True, "/m", ("/d/tr", "/d/te"), "/o/ckpt", two_nodes_kill.CKPT_ARGS)
    keys = [a.split("=", 1)[0] for a in args if "=" in a]
    assert len(keys) == len(set(keys)), keys
    assert "trainer.save_freq=1" in args and f"trainer.total_training_steps={two_nodes_kill.STEPS}" in args


def fake_run(folder, name, gpus, nodes, steps, **extra):
    os.makedirs(os.path.join(folder, name, "ckpt", "logs"))
    with open(os.path.join(folder, name, "run.json"), "w") as f:
        json.dump({"name": name, "nodes": nodes, "gpus": gpus, "gpus_per_node": gpus // nodes, **extra}, f)
    with open(os.path.join(folder, name, "ckpt", "logs", "metrics.jsonl"), "w") as f:
        for row in steps:
            f.write(json.dumps(row) + "\n")


def step(i, step_s, loss):
    return {"step": i, "timing_s/step": step_s, "timing_s/reshard": step_s / 10, "actor/pg_loss": loss,
            "critic/score/mean": 0.5, "actor/entropy": 1.0, "response_length/mean": 100.0}


def test_the_2gpu_report_has_its_own_file_and_the_node_death(tmp_path):
    runs = tmp_path / "two_nodes_2gpu"
    fake_run(runs, "one_node", 2, 1, [step(i, 4.0, 0.1) for i in (1, 2, 3)])
    fake_run(runs, "two_nodes_socket", 2, 2, [step(i, 5.0, 0.101) for i in (1, 2, 3)])
    fake_run(runs, two_nodes.NODE_DEATH, 2, 2, [], node_death_fail_s=3.2, node_death_message="... on node 1 (...)",
             resumed_from_step=2, resumed_rc=0)
    out = tmp_path / "results" / two_nodes.results_file(2)
    out.parent.mkdir()
    result = two_nodes.report(str(runs), str(out), 2)
    assert json.loads(out.read_text()) == result and (tmp_path / "results" / "two_nodes_2gpu.md").exists()
    m = result["metrics"]
    assert result["gpus"] == 2 and result["layouts"]["two_nodes_socket"] == {"nodes": 2, "gpus_per_node": 1}
    assert m["two_nodes_socket_step_s_over_one_node"] == pytest.approx(1.25)
    assert m["two_nodes_socket_metrics_max_rel_diff"] == pytest.approx(0.01)
    assert {k: m[k] for k in two_nodes.NODE_DEATH_KEYS} == {
        "node_death_fail_s": 3.2, "node_death_message": "... on node 1 (...)", "resumed_from_step": 2, "resumed_rc": 0}


def test_the_report_refuses_runs_of_another_gpu_count(tmp_path):
    fake_run(tmp_path, "one_node", 2, 1, [step(1, 4.0, 0.1)])
    with pytest.raises(SystemExit, match="ran on 2 GPUs, not --gpus 4"):
        two_nodes.report(str(tmp_path), str(tmp_path / "two_nodes.json"), 4)


NODE = "0123456789abcdef0123"
LOG = (f"(TaskRunner) pool 'global': node 0 (h, 127.0.0.1, Ray node ffffffffffff) x 1; "  # the placement line
       f"node 1 (h, 127.0.0.1, Ray node {NODE[:12]}) x 1\n"
       "hybridrl.controller.errors.WorkerDiedError: worker 'actor_rollout' rank 1 (pid 77) died during update_actor() "
       f"on node 1 (h, 127.0.0.1, Ray node {NODE[:12]}) (DEAD: Ray lost this node): RayActorError: The actor died\n")


def test_the_kill_reads_the_line_naming_the_lost_node_and_the_resume():
    line = two_nodes_kill.named_line(LOG, NODE)
    assert line and line.startswith("hybridrl.controller.errors.WorkerDiedError") and "DEAD" in line
    assert two_nodes_kill.named_line(LOG, "ffffffffffff0000") is None  # the placement line does not count
    assert two_nodes_kill.error_lines(LOG) == [LOG.splitlines()[1].strip()[:400]]
    m = two_nodes_kill.RESUMED.search("hybridrl: resumed from /o/ckpt/global_step_3 (step 3)\n")
    assert m and m.group(1) == "3"


def test_the_kill_passes_only_on_a_fast_named_failure_and_a_whole_resume(tmp_path):
    good = {"job_rc": 1, "node_death_fail_s": 4.0, "node_death_message": "x", "resumed_rc": 0,
            "resumed_from_step": two_nodes_kill.KILL_AFTER, "last_step": two_nodes_kill.STEPS}
    assert two_nodes_kill.passed(good)
    for bad in ({"job_rc": 0}, {"job_rc": None}, {"node_death_fail_s": 61.0}, {"node_death_message": None},
                {"resumed_rc": 1}, {"resumed_from_step": 1}, {"last_step": two_nodes_kill.STEPS - 1}):
        assert not two_nodes_kill.passed({**good, **bad}), bad
    assert two_nodes_kill.committed_step(str(tmp_path)) == 0
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2\n")
    assert two_nodes_kill.committed_step(str(tmp_path)) == 2


def test_a_job_past_its_timeout_is_killed_with_all_it_started_and_recorded(tmp_path, monkeypatch):
    # the cluster stubbed out: the job is a driver that left a child behind (its Ray driver side, vLLM, ...)
    import time

    import procs

    stopped = []
    monkeypatch.setattr(two_nodes, "start_cluster", lambda run, out_dir, cpu, gpus: "cluster")
    monkeypatch.setattr(two_nodes, "stop_cluster", stopped.append)
    monkeypatch.setattr(two_nodes, "job_env", lambda cluster: dict(os.environ))
    monkeypatch.setattr(two_nodes, "layout", lambda cluster, gpus: {"gpus": gpus})
    pid_file = tmp_path / "child"
    monkeypatch.setattr(two_nodes, "job_command",
                        lambda args: ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; sleep 60"])
    start = time.monotonic()
    res = two_nodes.run_one(two_nodes.RUNS["one_node"], str(tmp_path / "run"), True, 2, "/m", ("/tr", "/te"), 1.0)
    assert time.monotonic() - start < 20
    assert res["rc"] == 124 and res["timed_out"] and stopped == ["cluster"]
    assert json.load(open(tmp_path / "run" / "run.json"))["rc"] == 124
    child = int(pid_file.read_text())
    assert not procs.alive(child), "the job's child survived the timeout"
