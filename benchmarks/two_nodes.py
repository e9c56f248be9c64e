"""Issue 43 on GPUs: one host as two Ray "nodes", against one node of the same GPUs (NOT RUN YET).

    python benchmarks/two_nodes.py list
    python benchmarks/two_nodes.py run NAME... [--gpus 2|4] --out-dir DIR   # one device call per run or two
    python benchmarks/two_nodes.py report [--gpus 2|4] --in-dir DIR   # -> results/two_nodes.json (+ .md beside it)
    python benchmarks/two_nodes.py --cpu run NAME...   # the dry path: the same launches on gloo, the tiny CPU demo
    python benchmarks/two_nodes_kill.py [--cpu] [--gpus 2|4] --out-dir DIR   # the node's death (its own docstring)

--gpus is the machine's GPU count (default 4, the issue's layout: two 2-GPU nodes). With --gpus 2 (the halved
layout, run while only 1- and 2-GPU machines are lent) each node is one GPU (CUDA_VISIBLE_DEVICES 0 and 1) and the
one-node rows hold both; its runs go to their own folder (the rows: OUT/two_nodes_2gpu) and its report to
results/two_nodes_2gpu.json with the same metric names (two_nodes.json stays the issue's 4-GPU file). Every run.json
and the report record the GPUs and the GPUs per node; the report refuses runs of another GPU count.

Each "node" is a Ray node started by launch/ray_start.sh with its own CUDA_VISIBLE_DEVICES, temp dir and ports; the
job runs through `launch/ray_start.sh run` with trainer.nnodes=2 trainer.n_gpus_per_node=GPUS/2. The one-node row is
the same job with both halves in one Ray node (trainer.nnodes=1, all the GPUs). The job: 32 prompts x 8 samples over
dp 2 or 4; the random 1.5B model four_gpu.py builds (/tmp/m_1.5b, its data in the model folder, built when missing).

The path between the nodes: NCCL must not use NVLink or shared memory between the halves, as between hosts. Each node
gets its own NCCL_HOSTID (NCCL then treats the halves as two hosts: P2P/NVLink inside a half, its network transport
between them) with NCCL_NET=Socket and NCCL_IB_DISABLE=1 (TCP sockets, the slowest network). The `_nop2p` rows
instead set NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 for every process (sockets between every pair, inside a half too):
the bound if NCCL_HOSTID is not honoured. NCCL_DEBUG=INFO logs are kept; the report checks that they show NET/Socket.

Must show (report -> two_nodes.json metrics): metrics_equal (the two-node run's per-step metrics against the
one-node run's within bf16 noise: rel 2e-2 on losses and scores, the same samples at temperature 0 aside), and
sync_s / step_s of each layout and their ratio two-node / one-node; and, from two_nodes_kill.py's run (node_death/),
the node's death: node_death_fail_s, node_death_message, resumed_from_step, resumed_rc.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from procs import kill_session
from runner import run_gpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAY_START = os.path.join(ROOT, "launch", "ray_start.sh")
GPUS = (2, 4)  # the machines the runs are for: two 1-GPU nodes (the halved layout) or the two 2-GPU nodes
GPU_SHAPE = "1.5b"  # four_gpu.py's model shape: the random 1.5B, built by four_gpu.model_dir
# The GRPO job: the 1.5B shape of four_gpu.py (random weights), 32 prompts x 8 samples over dp 2 or 4.
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
NODE_DEATH = "node_death"  # two_nodes_kill.py's run folder under the same --out-dir
NODE_DEATH_KEYS = ("node_death_fail_s", "node_death_message", "resumed_from_step", "resumed_rc")


@dataclass(frozen=True)
class Run:
    name: str
    nodes: int  # Ray nodes the machine's GPUs are split into
    env: dict = field(default_factory=dict)  # for every node and the driver
    per_node_hostid: bool = False


RUNS = {r.name: r for r in [
    Run("one_node", 1),
    Run("two_nodes_socket", 2, SOCKET_NET, per_node_hostid=True),
    Run("two_nodes_nop2p", 2, {**SOCKET_NET, **NO_P2P}),
    Run("one_node_nop2p", 1, {**SOCKET_NET, **NO_P2P}),
]}


def gpus_per_node(gpus: int, nodes: int) -> int:
    if gpus < nodes or gpus % nodes:
        raise SystemExit(f"two_nodes: {gpus} GPUs do not split into {nodes} equal node(s); give --gpus one of {GPUS}")
    return gpus // nodes


def node_devices(slot: int, per_node: int) -> str:
    """CUDA_VISIBLE_DEVICES of the node in `slot` (0: the head): its own consecutive GPUs of those the caller gave
    the run (runner.run_gpus: the first of CUDA_VISIBLE_DEVICES, else of the machine)."""
    return ",".join(run_gpus((slot + 1) * per_node, "two_nodes").split(",")[slot * per_node:])


def results_file(gpus: int) -> str:
    """The report's file: the issue's two_nodes.json for its 4 GPUs; a halved run's of its own, same metric names."""
    return "two_nodes.json" if gpus == 4 else f"two_nodes_{gpus}gpu.json"


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


@dataclass
class Cluster:
    """One run's Ray nodes on this host, each `launch/ray_start.sh head|worker` in the foreground in a session of
    its own, with its own temp dir under `ray_tmp`, worker ports and log (OUT_DIR/ray_nodeK.log)."""

    run: Run
    out_dir: str
    cpu: bool
    per_node: int  # GPUs a node holds (the dry path: CPUs, one worker process each)
    env: dict  # every node's and the job's: the run's NCCL settings, Ray's port and token
    port: int
    ray_tmp: str
    nodes: list = field(default_factory=list)  # every node started, a lost one too

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def _ray_cli(folder: str) -> str:
    """A `ray` command for this Python in folder/bin (returned): the GPU host's Ray is the bundle's unpacked wheel,
    without the console script ray_start.sh and `ray status` call."""
    bin_dir = os.path.join(folder, "bin")
    os.makedirs(bin_dir)
    with open(os.path.join(bin_dir, "ray"), "w") as f:
        f.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c 'import sys; from ray.scripts.scripts import main; "
                f"sys.argv[0] = \"ray\"; sys.exit(main())' \"$@\"\n")
    os.chmod(os.path.join(bin_dir, "ray"), 0o755)
    return bin_dir


def start_cluster(run: Run, out_dir: str, cpu: bool, gpus: int) -> Cluster:
    ray_tmp = tempfile.mkdtemp(prefix="hrl2n", dir="/tmp")  # Ray's socket paths must stay short
    port = _free_port()
    token = os.path.join(ray_tmp, "token")  # Ray 2.60's token authentication: one token for the nodes and the job
    with open(token, "w") as f:
        f.write(os.urandom(32).hex())
    path = os.pathsep.join([_ray_cli(ray_tmp), os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = {**os.environ, **run.env, "RAY_PORT": str(port), "NODE_IP": "127.0.0.1", "RAY_BLOCK": "1",
           "PYTHON": sys.executable, "PATH": path,
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token}
    cluster = Cluster(run, out_dir, cpu, gpus_per_node(gpus, run.nodes), env, port, ray_tmp)
    try:
        for slot in range(run.nodes):
            add_node(cluster, slot)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def add_node(cluster: Cluster, slot: int) -> subprocess.Popen:
    """A Ray node holding the GPUs of node `slot` (0: the head), once the cluster counts it. A replacement for a lost
    node takes its slot (its GPUs) with a temp dir, worker ports and log of its own."""
    k = len(cluster.nodes)
    env = {**cluster.env, "RAY_TEMP_DIR": os.path.join(cluster.ray_tmp, f"r{k}"),
           "RAY_START_ARGS": f"--min-worker-port={21000 + 1000 * k} --max-worker-port={21999 + 1000 * k} "
                             f"--dashboard-agent-listen-port={_free_port()}"}
    if cluster.cpu:
        env.update(NUM_CPUS=str(cluster.per_node), NUM_GPUS="0")
    else:
        env.update(NUM_GPUS=str(cluster.per_node), CUDA_VISIBLE_DEVICES=node_devices(slot, cluster.per_node))
    if cluster.run.per_node_hostid:
        env["NCCL_HOSTID"] = f"hybridrl-node{slot}"
    if slot:
        env["RAY_ADDRESS"] = cluster.address
    with open(os.path.join(cluster.out_dir, f"ray_node{k}.log"), "w") as log:
        node = subprocess.Popen(["bash", RAY_START, "worker" if slot else "head"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    cluster.nodes.append(node)
    _wait_for_nodes(cluster, sum(p.poll() is None for p in cluster.nodes))
    return node


def _cluster_total(cluster: Cluster, resource: str) -> float | None:
    """The live nodes' total of `resource` as `ray status` gives it (a dead node is listed among its "Recent
    failures", so counting node lines would count it; its resources are gone)."""
    try:
        out = subprocess.run(["ray", "status", f"--address={cluster.address}"], env=cluster.env, capture_output=True,
                             text=True, timeout=20).stdout
    except subprocess.TimeoutExpired:  # the head is not up yet
        return None
    m = re.search(rf"[\d.]+/([\d.]+) {resource}\b", out)
    return float(m.group(1)) if m else None


def _wait_for_nodes(cluster: Cluster, n: int, timeout: float = 120) -> None:
    """Until the cluster holds n nodes' worth of GPUs (the dry path: CPUs); fails when the node started last has
    exited or after `timeout`."""
    resource, want = ("CPU" if cluster.cpu else "GPU"), n * cluster.per_node
    log = os.path.join(cluster.out_dir, f"ray_node{len(cluster.nodes) - 1}.log")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster.nodes[-1].poll() is not None:
            raise RuntimeError(f"a Ray node exited while starting: see {log}")
        if _cluster_total(cluster, resource) == want:
            return
        time.sleep(1)
    raise RuntimeError(f"the cluster did not reach {want} {resource} ({n} node(s)) in {timeout} s: see {log}")


def stop_cluster(cluster: Cluster) -> None:
    _stop_nodes(cluster.nodes)
    shutil.rmtree(cluster.ray_tmp, ignore_errors=True)


def job_args(cpu: bool, model: str, data: tuple[str, str], ckpt: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The trainer's arguments (after ray_start.sh's trainer.nnodes/n_gpus_per_node); `extra` overrides replace the
    job's own of the same key."""
    keys = {o.split("=", 1)[0] for o in extra}
    job = [a for a in (CPU_JOB if cpu else GPU_JOB) if a.split("=", 1)[0] not in keys]
    return [*job, f"data.train_files={data[0]}", f"data.val_files={data[1]}", f"actor_rollout_ref.model.path={model}",
            f"trainer.default_local_dir={ckpt}", *([] if cpu else ["trainer.device=cuda"]), *extra]


def job_env(cluster: Cluster) -> dict:
    return {**cluster.env, "RAY_ADDRESS": cluster.address, "NNODES": str(cluster.run.nodes),
            "GPUS_PER_NODE": str(cluster.per_node)}


def job_command(args: list[str]) -> list[str]:
    return ["bash", RAY_START, "run", *args]


def layout(cluster: Cluster, gpus: int) -> dict:
    """What run.json records of where the run was."""
    devices = [None if cluster.cpu else node_devices(s, cluster.per_node) for s in range(cluster.run.nodes)]
    return {"nodes": cluster.run.nodes, "gpus": gpus, "gpus_per_node": cluster.per_node,
            "cuda_visible_devices": devices, "env": cluster.run.env, "per_node_hostid": cluster.run.per_node_hostid}


def run_one(run: Run, out_dir: str, cpu: bool, gpus: int, model: str, data: tuple[str, str], timeout: float) -> dict:
    os.makedirs(out_dir, exist_ok=False)  # a run's folder is made fresh, never reused
    cluster = start_cluster(run, out_dir, cpu, gpus)
    try:
        args = job_args(cpu, model, data, os.path.join(out_dir, "ckpt"))
        start = time.monotonic()
        with open(os.path.join(out_dir, "job.log"), "w") as log:
            job = subprocess.Popen(job_command(args), env=job_env(cluster), stdout=log, stderr=subprocess.STDOUT,
                                   cwd=ROOT, start_new_session=True)
            try:
                rc = job.wait(timeout=timeout)
            except subprocess.TimeoutExpired:  # the driver and all it started, recorded as timeout(1) would
                kill_session(job.pid)
                job.wait()
                rc = 124
        result = {"name": run.name, **layout(cluster, gpus), "rc": rc, "timed_out": rc == 124,
                  "wall_s": time.monotonic() - start}
    finally:
        stop_cluster(cluster)
    with open(os.path.join(out_dir, "run.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def model_and_data(cpu: bool, model: str = "") -> tuple[str, tuple[str, str]]:
    """The model folder and (train, test) files: the CPU demo's, made here; else `model` or four_gpu.py's random 1.5B
    (built when missing), with the data it holds in MODEL/data."""
    if cpu:
        from hybridrl.trainer.demo import prepare

        folder = tempfile.mkdtemp(prefix="two_nodes_demo")
        atexit.register(shutil.rmtree, folder, True)  # this process's folder: gone when it ends
        model, train, test = prepare(folder, sft_steps=20, seed=0)
        return model, (train, test)
    if not model:
        import four_gpu  # benchmarks/: this script's folder

        model = four_gpu.model_dir(GPU_SHAPE, "/tmp")
    return model, (os.path.join(model, "data", "train.parquet"), os.path.join(model, "data", "test.parquet"))


def _rows(folder: str) -> list[dict]:
    path = os.path.join(folder, "ckpt", "logs", "metrics.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows[1:] if key in r]  # step 1 holds start-up work
    return statistics.median(vals) if vals else None


def _run_json(folder: str, gpus: int) -> dict:
    """The run's run.json; a run of another GPU count stops the report (two layouts' numbers must not mix)."""
    path = os.path.join(folder, "run.json")
    info = json.load(open(path)) if os.path.exists(path) else {}
    if info.get("gpus", gpus) != gpus:
        raise SystemExit(f"two_nodes report: {folder} ran on {info['gpus']} GPUs, not --gpus {gpus}: give its "
                         f"--gpus or an --in-dir holding only {gpus}-GPU runs")
    return info


def node_death_metrics(in_dir: str, gpus: int) -> dict:
    folder = os.path.join(in_dir, NODE_DEATH)
    if not os.path.isdir(folder):
        return {}
    info = _run_json(folder, gpus)
    return {k: info.get(k) for k in NODE_DEATH_KEYS}


def report(in_dir: str, out: str, gpus: int) -> dict:
    folders = {n: os.path.join(in_dir, n) for n in RUNS if os.path.isdir(os.path.join(in_dir, n))}
    infos = {n: _run_json(f, gpus) for n, f in folders.items()}
    runs = {n: _rows(f) for n, f in folders.items()}
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
    metrics.update(node_death_metrics(in_dir, gpus))
    layouts = {n: {"nodes": RUNS[n].nodes, "gpus_per_node": infos[n].get("gpus_per_node", gpus // RUNS[n].nodes)}
               for n in folders}
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "gpus": gpus, "layouts": layouts,
              "metrics": metrics}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    with open(out[:-5] + ".md", "w") as f:
        f.write(f"# two_nodes: a {gpus}-GPU host as two {gpus // 2}-GPU nodes (benchmarks/two_nodes.py)\n\n"
                + "\n".join(f"- {k}: {v}" for k, v in metrics.items()) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="the dry path: gloo, the CPU demo's tiny model")
    p.add_argument("what", choices=["list", "run", "report"])
    p.add_argument("names", nargs="*")
    p.add_argument("--gpus", type=int, choices=GPUS, default=4,
                   help="the machine's GPUs: 4 = two 2-GPU nodes (the issue's), 2 = two 1-GPU nodes")
    p.add_argument("--out-dir", default="/tmp/two_nodes")
    p.add_argument("--in-dir", default="/tmp/two_nodes")
    p.add_argument("--out", default="", help="report: default benchmarks/results/two_nodes.json (4 GPUs), "
                                              "two_nodes_2gpu.json (2)")
    p.add_argument("--model", default="", help="GPU: the model folder, its data in MODEL/data (default: four_gpu's "
                                               "random 1.5B, /tmp/m_1.5b, built when missing)")
    p.add_argument("--timeout", type=float, default=540)
    args = p.parse_args(argv)
    if args.what == "list":
        for r in RUNS.values():
            print(f"{r.name}: {r.nodes} node(s) of {gpus_per_node(args.gpus, r.nodes)} GPU(s), "
                  f"{' '.join(f'{k}={v}' for k, v in r.env.items()) or 'NCCL defaults'}"
                  f"{', NCCL_HOSTID per node' if r.per_node_hostid else ''}")
        return 0
    if args.what == "report":
        out = args.out or os.path.join(ROOT, "benchmarks", "results", results_file(args.gpus))
        print(json.dumps(report(args.in_dir, out, args.gpus), indent=1))
        return 0
    unknown = [n for n in args.names if n not in RUNS]
    if unknown:
        p.error(f"no run {unknown}; the runs: {', '.join(RUNS)}")
    model, data = model_and_data(args.cpu, args.model)
    rc = 0
    for name in args.names or list(RUNS):
        res = run_one(RUNS[name], os.path.join(args.out_dir, name), args.cpu, args.gpus, model, data, args.timeout)
        print(json.dumps(res))
        rc = rc or res["rc"]
    return rc


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
