"""Issue 43's node's death on GPUs (NOT RUN YET): the two-node job of two_nodes.py (its two_nodes_socket layout)
loses its worker node mid-run, must fail fast naming it, and resumes from its last checkpoint on a new worker node.

    python benchmarks/two_nodes_kill.py [--gpus 2|4] --out-dir $OUT/two_nodes     # -> OUT_DIR/node_death/run.json
    python benchmarks/two_nodes_kill.py --cpu --gpus 2 --out-dir DIR   # the dry path: the CPU demo job on gloo

The GPU counterpart of tests/e2e/test_two_nodes.py's lost node, which pauses the CPU job inside step 3 to kill there;
here the job saves every step (trainer.save_freq=1 into node_death/ckpt, STEPS steps, the last KEEP checkpoints
kept) and the worker node is killed once the checkpoint of step KILL_AFTER is committed
(latest_checkpointed_iteration.txt, polled): SIGKILL to every process of its session (`ray start --block`, its
raylet, the workers on it). The 1.5B's checkpoints, with the optimizer state, are some 20 GB each (an estimate):
keep OUT_DIR off the device call's $OUT; they are deleted at the end (--keep-checkpoints keeps them).
Recorded in run.json (two_nodes.py's report takes the NODE_DEATH_KEYS):
- node_death_fail_s: seconds from the kill to the job's exit (the CPU test's bound: FAIL_BOUND_S), job_rc;
- node_death_message: the job's line naming the lost node, " on node K (host, ip, Ray node ID)" with ID the lost
  raylet's (ray_backend's message for a dead rank or a peer that did not finish); error_lines: the job's last errors;
- a new worker node takes the lost node's GPUs and the same command (trainer.resume_mode=auto) runs again:
  resumed_from_step (its "resumed from ... (step N)" line), resumed_rc, last_step (metrics.jsonl's last).
The kill lands while a step after KILL_AFTER runs, so the resume is from KILL_AFTER or a later step the job
committed before the kill (killed_after_step says which was committed when the kill was sent). Exit status 0 when
the job failed within FAIL_BOUND_S naming the node and the resumed job finished every step.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import two_nodes  # noqa: E402  (benchmarks/: this script's folder)
from procs import kill_session, raylet_node_id  # noqa: E402

STEPS = 5
KILL_AFTER = 2  # the worker node dies once this step's checkpoint is committed
KEEP = 1  # checkpoints kept: the newest complete one is all a resume needs (the disk: 128 GiB on the 2-GPU host)
FAIL_BOUND_S = 60  # tests/e2e/test_two_nodes.py's bound on CPU
FAIL_WAIT_S = 180  # the job still running this long after the kill counts as hung: its session is killed
CKPT_ARGS = (f"trainer.total_training_steps={STEPS}", "trainer.save_freq=1", "trainer.resume_mode=auto",
             f"trainer.max_actor_ckpt_to_keep={KEEP}")
RESUMED = re.compile(r"resumed from \S+ \(step (\d+)\)")


def committed_step(ckpt: str) -> int:
    """The newest complete checkpoint's step (the trainer's commit marker), 0 before the first."""
    path = os.path.join(ckpt, "latest_checkpointed_iteration.txt")
    try:
        return int(open(path).read().strip())
    except (OSError, ValueError):
        return 0


def wait_for_checkpoint(ckpt: str, step: int, job: subprocess.Popen, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while (done := committed_step(ckpt)) < step:
        if job.poll() is not None:
            raise RuntimeError(f"the job exited (rc {job.returncode}) before its checkpoint of step {step}: "
                               "see job.log")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no checkpoint of step {step} after {timeout:.0f} s (committed: {done}): see job.log")
        time.sleep(0.2)
    return done


def named_line(text: str, node_id: str) -> str | None:
    """The first line naming the lost node as ray_backend names a failed rank's node (the placement log line,
    "node K (...) x N", does not say "on node")."""
    pattern = re.compile(rf" on node \d+ \([^)]*Ray node {re.escape(node_id[:12])}")
    return next((ln.strip()[:600] for ln in text.splitlines() if pattern.search(ln)), None)


def error_lines(text: str, n: int = 8) -> list[str]:
    lines = [ln.strip()[:400] for ln in text.splitlines() if re.search(r"Error\b|error:|died|DEAD", ln)]
    return lines[-n:]


def last_step(ckpt: str) -> int | None:
    path = os.path.join(ckpt, "logs", "metrics.jsonl")
    if not os.path.exists(path):
        return None
    return max((json.loads(line)["step"] for line in open(path) if line.strip()), default=None)


def start_job(cluster: two_nodes.Cluster, args: list[str], log_name: str) -> subprocess.Popen:
    with open(os.path.join(cluster.out_dir, log_name), "w") as log:
        return subprocess.Popen(two_nodes.job_command(args), env=two_nodes.job_env(cluster), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=two_nodes.ROOT)


def read(cluster: two_nodes.Cluster, log_name: str) -> str:
    return open(os.path.join(cluster.out_dir, log_name), errors="replace").read()


def failure(cluster: two_nodes.Cluster, job: subprocess.Popen, lost_id: str) -> dict:
    """Kill the worker node (slot 1) and time the job's exit; what the job said of it."""
    killed = time.monotonic()
    kill_session(cluster.nodes[1].pid)
    try:
        rc, fail_s = job.wait(timeout=FAIL_WAIT_S), time.monotonic() - killed
    except subprocess.TimeoutExpired:  # hung: stopped here, so that the resumed job gets the GPUs
        kill_session(job.pid)
        rc, fail_s = None, None
    text = read(cluster, "job.log")
    return {"job_rc": rc, "node_death_fail_s": fail_s, "node_death_message": named_line(text, lost_id),
            "error_lines": error_lines(text)}


def resume(cluster: two_nodes.Cluster, args: list[str], ckpt: str, timeout: float) -> dict:
    """A new worker node in the lost one's slot; the same command again, resuming from the last checkpoint."""
    two_nodes.add_node(cluster, 1)
    job = start_job(cluster, args, "resumed.log")
    try:
        rc = job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        if job.poll() is None:
            kill_session(job.pid)
    m = RESUMED.search(read(cluster, "resumed.log"))
    return {"resumed_rc": rc, "resumed_from_step": int(m.group(1)) if m else None, "last_step": last_step(ckpt)}


def drop_checkpoints(ckpt: str) -> None:
    """The run's global_step_* folders (its own, in a folder it made fresh); its logs and marker stay."""
    for entry in os.listdir(ckpt) if os.path.isdir(ckpt) else []:
        if re.fullmatch(r"global_step_\d+", entry):
            shutil.rmtree(os.path.join(ckpt, entry))


def passed(result: dict) -> bool:
    fail_s, step = result.get("node_death_fail_s"), result.get("resumed_from_step")
    return (result.get("job_rc") not in (0, None) and fail_s is not None and fail_s < FAIL_BOUND_S
            and result.get("node_death_message") is not None and result.get("resumed_rc") == 0
            and step is not None and step >= KILL_AFTER and result.get("last_step") == STEPS)


def node_death(out_dir: str, cpu: bool, gpus: int, model: str, data: tuple[str, str], timeout: float,
               keep_checkpoints: bool = False) -> dict:
    os.makedirs(out_dir, exist_ok=False)  # a run's folder is made fresh, never reused
    ckpt = os.path.join(out_dir, "ckpt")
    cluster = two_nodes.start_cluster(two_nodes.RUNS["two_nodes_socket"], out_dir, cpu, gpus)
    result = {"name": two_nodes.NODE_DEATH, **two_nodes.layout(cluster, gpus), "steps": STEPS, "kill_after": KILL_AFTER}
    job = None
    try:
        result["lost_ray_node"] = lost_id = raylet_node_id(cluster.nodes[1].pid)
        args = two_nodes.job_args(cpu, model, data, ckpt, CKPT_ARGS)
        result["command"] = " ".join(two_nodes.job_command(args))
        job = start_job(cluster, args, "job.log")
        result["killed_after_step"] = wait_for_checkpoint(ckpt, KILL_AFTER, job, timeout)
        result.update(failure(cluster, job, lost_id))
        result.update(resume(cluster, args, ckpt, timeout))
    except RuntimeError as e:  # the run could not get to its kill or its resume: said in run.json
        result["error"] = str(e)
    finally:
        if job is not None and job.poll() is None:  # hung after the kill, or an error before it
            kill_session(job.pid)
        two_nodes.stop_cluster(cluster)
        if not keep_checkpoints:
            drop_checkpoints(ckpt)
    result["ok"] = passed(result)
    with open(os.path.join(out_dir, "run.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="the dry path: gloo, the CPU demo's tiny model")
    p.add_argument("--gpus", type=int, choices=two_nodes.GPUS, default=4,
                   help="the machine's GPUs: 4 = two 2-GPU nodes (the issue's), 2 = two 1-GPU nodes")
    p.add_argument("--out-dir", default="/tmp/two_nodes", help="the run goes to OUT_DIR/node_death")
    p.add_argument("--model", default="", help="GPU: as two_nodes.py's --model")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds each job gets: the first to commit step KILL_AFTER, the resumed one to finish")
    p.add_argument("--keep-checkpoints", action="store_true", help="leave the run's checkpoints in OUT_DIR")
    args = p.parse_args(argv)
    model, data = two_nodes.model_and_data(args.cpu, args.model)
    result = node_death(os.path.join(args.out_dir, two_nodes.NODE_DEATH), args.cpu, args.gpus, model, data,
                        args.timeout, args.keep_checkpoints)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.path.insert(0, two_nodes.ROOT)
    sys.exit(main())
