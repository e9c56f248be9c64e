"""Issue 43 on GPUs: a 4-GPU machine as two 2-GPU "nodes", against one node of the same 4 GPUs (NOT RUN YET).

    python benchmarks/two_nodes.py list
    python benchmarks/two_nodes.py run NAME... --out-dir $OUT/two_nodes      # one device call per run or two
    python benchmarks/two_nodes.py report --in-dir DIR --out benchmarks/results/two_nodes.json  (+ .md beside it)
    python benchmarks/two_nodes.py --cpu run NAME...   # the dry path: the same launches on gloo, the tiny CPU demo

Each "node" is a Ray node started by launch/ray_start.sh with its own CUDA_VISIBLE_DEVICES (0,1 and 2,3), temp dir
and ports; the job runs through `launch/ray_start.sh run` with trainer.nnodes=2 trainer.n_gpus_per_node=2. The
one-node row is the same job with both halves in one Ray node (trainer.nnodes=1, 4 GPUs).

The path between the nodes: NCCL must not use NVLink or shared memory between the halves, as between hosts. Each node
gets its own NCCL_HOSTID (NCCL then treats the halves as two hosts: P2P/NVLink inside a half, its network transport
between them) with NCCL_NET=Socket and NCCL_IB_DISABLE=1 (TCP sockets, the slowest network). The `_nop2p` rows
instead set NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 for every process (sockets between every pair, inside a half too):
the bound if NCCL_HOSTID is not honoured. NCCL_DEBUG=INFO logs are kept; the report checks that they show NET/Socket.

Must show (report -> two_nodes.json metrics): metrics_equal (the two-node run's per-step metrics against the
one-node run's within bf16 noise: rel 2e-2 on losses and scores, the same samples at temperature 0 aside), and
sync_s / step_s of each layout and their ratio two-node / one-node. The node's death (kill the worker node mid-run,
fail fast with its name, resume) is tests/e2e/test_two_nodes.py on CPU; no row runs it on GPUs yet.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAY_START = os.path.join(ROOT, "launch", "ray_start.sh")
# The GRPO job: the 1.5B shape of four_gpu.py (random weights, built on the host by four_gpu's models), dp over 4 GPUs.
GPU_JOB = ["--config-name", "grpo_trainer", "data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
           "actor_rollout_ref.rollout.n=8", "data.max_prompt_length=64", "data.max_response_length=256",
           "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
           "actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.actor.use_dynamic_bsz=true",
           "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192", "trainer.total_training_steps=5",
           "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[jsonl]"]
CPU_JOB = ["--config-name", "demo", "trainer.total_training_steps=2", "trainer.save_freq=-1", "trainer.test_freq=-1",
           "trainer.val_before_train=false", "trainer.logger=[jsonl]", "trainer.plot=false"]
SOCKET_NET = {"NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
NO_P2P = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}


@dataclass(frozen=True)
class Run:
    name: str
    nodes: int  # Ray nodes the 4 GPUs are split into
    env: dict = field(default_factory=dict)  # for every node and the driver
    per_node_hostid: bool = False


RUNS = {r.name: r for r in [
    Run("one_node", 1),
    Run("two_nodes_socket", 2, SOCKET_NET, per_node_hostid=True),
    Run("two_nodes_nop2p", 2, {**SOCKET_NET, **NO_P2P}),
    Run("one_node_nop2p", 1, {**SOCKET_NET, **NO_P2P}),
]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _signal_session(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _stop_nodes(nodes: list, grace_s: float = 5.0) -> None:
    """SIGTERM every node's session at once, then SIGKILL what is left of them after `grace_s`. The job has ended
    when this runs; a `ray start --block` node given SIGTERM drains for up to 30 s before it stops its processes,
    which added 30 s a node to every run (the nodes were stopped one after the other)."""
    for p in nodes:
        _signal_session(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in nodes:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in nodes:  # the raylet and the workers of a node whose `ray start` already exited, too
        _signal_session(p, signal.SIGKILL)
        p.wait()


def _wait_for_nodes(env: dict, port: int, n: int, nodes: list, timeout: float = 120) -> None:
    """Until `ray status` counts n live nodes; fails when a node's process has exited or after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in nodes):
            raise RuntimeError("a Ray node exited while starting: see ray_node*.log")
        try:
            out = subprocess.run(["ray", "status", f"--address=127.0.0.1:{port}"], env=env, capture_output=True,
                                 text=True, timeout=20).stdout
        except subprocess.TimeoutExpired:
            continue
        if out.count(" node_") >= n:
            return
        time.sleep(1)
    raise RuntimeError(f"fewer than {n} Ray node(s) up after {timeout} s")


def run_one(run: Run, out_dir: str, cpu: bool, model: str, data: tuple[str, str], timeout: float) -> dict:
    os.makedirs(out_dir, exist_ok=False)  # a run's folder is made fresh, never reused
    ray_tmp = tempfile.mkdtemp(prefix="hrl2n", dir="/tmp")  # Ray's socket paths must stay short
    gpus, per_node = 4, 4 // run.nodes
    port = _free_port()
    token = os.path.join(ray_tmp, "token")  # Ray 2.60's token authentication: one token for the nodes and the job
    with open(token, "w") as f:
        f.write(os.urandom(32).hex())
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, **run.env, "RAY_PORT": str(port), "NODE_IP": "127.0.0.1", "RAY_BLOCK": "1",
           "PYTHON": sys.executable, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token}
    nodes = []
    try:
        for i in range(run.nodes):
            node_env = {**env, "RAY_TEMP_DIR": os.path.join(ray_tmp, f"r{i}"),
                        "RAY_START_ARGS": f"--min-worker-port={21000 + 1000 * i} --max-worker-port={21999 + 1000 * i} "
                                          f"--dashboard-agent-listen-port={_free_port()}"}
            if cpu:
                node_env.update(NUM_CPUS=str(per_node), NUM_GPUS="0")
            else:
                node_env.update(NUM_GPUS=str(per_node),
                                CUDA_VISIBLE_DEVICES=",".join(str(g) for g in range(i * per_node, (i + 1) * per_node)))
            if run.per_node_hostid:
                node_env["NCCL_HOSTID"] = f"hybridrl-node{i}"
            if i:
                node_env["RAY_ADDRESS"] = f"127.0.0.1:{port}"
            log = open(os.path.join(out_dir, f"ray_node{i}.log"), "w")
            nodes.append(subprocess.Popen(["bash", RAY_START, "worker" if i else "head"], env=node_env, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT))
            _wait_for_nodes(env, port, i + 1, nodes)
        job = CPU_JOB if cpu else GPU_JOB
        args = [*job, f"data.train_files={data[0]}", f"data.val_files={data[1]}", f"actor_rollout_ref.model.path={model}",
                f"trainer.default_local_dir={os.path.join(out_dir, 'ckpt')}"]
        if not cpu:
            args.append("trainer.device=cuda")
        job_env = {**env, "RAY_ADDRESS": f"127.0.0.1:{port}", "NNODES": str(run.nodes), "GPUS_PER_NODE": str(per_node)}
        start = time.monotonic()
        with open(os.path.join(out_dir, "job.log"), "w") as log:
            rc = subprocess.run(["bash", RAY_START, "run", *args], env=job_env, stdout=log, stderr=subprocess.STDOUT,
                                timeout=timeout, cwd=ROOT).returncode
        result = {"name": run.name, "nodes": run.nodes, "gpus": gpus, "rc": rc, "wall_s": time.monotonic() - start,
                  "env": run.env, "per_node_hostid": run.per_node_hostid}
    finally:
        _stop_nodes(nodes)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    json.dump(result, open(os.path.join(out_dir, "run.json"), "w"), indent=1)
    return result


def _rows(folder: str) -> list[dict]:
    path = os.path.join(folder, "ckpt", "logs", "metrics.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows[1:] if key in r]  # step 1 holds start-up work
    return statistics.median(vals) if vals else None


def report(in_dir: str, out: str) -> dict:
    runs = {n: _rows(os.path.join(in_dir, n)) for n in RUNS if os.path.isdir(os.path.join(in_dir, n))}
    base = runs.get("one_node") or []
    metrics: dict = {}
    for name, rows in runs.items():
        metrics[f"{name}_step_s"] = _median(rows, "timing_s/step")
        metrics[f"{name}_sync_s"] = _median(rows, "timing_s/reshard")  # the weights into the engine
        log = os.path.join(in_dir, name, "job.log")
        metrics[f"{name}_nccl_socket_seen"] = os.path.exists(log) and "NET/Socket" in open(log, errors="replace").read()
    for name in ("two_nodes_socket", "two_nodes_nop2p"):
        rows = runs.get(name)
        if rows and base:
            keys = ("actor/pg_loss", "critic/score/mean", "actor/entropy", "response_length/mean")
            metrics[f"{name}_metrics_max_rel_diff"] = max(
                abs(a[k] - b[k]) / max(abs(b[k]), 1e-6) for a, b in zip(rows, base) for k in keys if k in a and k in b)
            for what in ("step_s", "sync_s"):
                one, two = metrics.get(f"one_node_{what}"), metrics.get(f"{name}_{what}")
                metrics[f"{name}_{what}_over_one_node"] = two / one if one and two else None
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "metrics": metrics}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    with open(out[:-5] + ".md", "w") as f:
        f.write("# two_nodes: a 4-GPU host as two 2-GPU nodes (benchmarks/two_nodes.py)\n\n"
                + "\n".join(f"- {k}: {v}" for k, v in metrics.items()) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="the dry path: gloo, the CPU demo's tiny model")
    p.add_argument("what", choices=["list", "run", "report"])
    p.add_argument("names", nargs="*")
    p.add_argument("--out-dir", default="/tmp/two_nodes")
    p.add_argument("--in-dir", default="/tmp/two_nodes")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "two_nodes.json"))
    p.add_argument("--model", default="", help="GPU: the model folder (default: four_gpu's 1.5B under /tmp/models)")
    p.add_argument("--timeout", type=float, default=540)
    args = p.parse_args(argv)
    if args.what == "list":
        for r in RUNS.values():
            print(f"{r.name}: {r.nodes} node(s), {' '.join(f'{k}={v}' for k, v in r.env.items()) or 'NCCL defaults'}"
                  f"{', NCCL_HOSTID per node' if r.per_node_hostid else ''}")
        return 0
    if args.what == "report":
        print(json.dumps(report(args.in_dir, args.out), indent=1))
        return 0
    if args.cpu:
        from hybridrl.trainer.demo import prepare

        model, train, test = prepare(tempfile.mkdtemp(prefix="two_nodes_demo"), sft_steps=20, seed=0)
        data = (train, test)
    else:
        model = args.model or "/tmp/models/1p5b"
        data = ("/tmp/data/gsm8k/train.parquet", "/tmp/data/gsm8k/test.parquet")
    rc = 0
    for name in args.names or list(RUNS):
        res = run_one(RUNS[name], os.path.join(args.out_dir, name), args.cpu, model, data, args.timeout)
        print(json.dumps(res))
        rc = rc or res["rc"]
    return rc


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
