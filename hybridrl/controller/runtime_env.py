"""Ray runtime env and start-up: ship code, not weights; forward the knobs workers need; no secrets.

`build_runtime_env(working_dir)` excludes weights, checkpoints, virtualenvs, logs and any other file
above `max_file_mb`, so a job started from a folder holding a model never fails with Ray's
"Request Entity Too Large" (its package size limit). Environment variables that tune NCCL/gloo/CUDA/HF
are copied from the driver to every worker; names that look like credentials are never copied
automatically (pass them through `extra_env` on purpose) and values are never logged.
"""
from __future__ import annotations

import atexit
import contextlib
import fnmatch
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Any, Iterable, Iterator, Mapping

from hybridrl.config.placement import joins_cluster  # noqa: F401  (the trainer and the plan ask it too)
from hybridrl.utils import logs

from .ray_address import check_ray_address

__all__ = ["DEFAULT_EXCLUDES", "build_runtime_env", "forwarded_env", "init_ray", "describe_runtime_env"]

logger = logging.getLogger(__name__)

# gitignore-style patterns (Ray's `excludes`): a trailing "/" matches a directory at any depth.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    "*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.ckpt", "*.distcp", "*.onnx", "*.h5", "*.msgpack",
    "*.npy", "*.npz", "*.parquet", "*.arrow", "*.tar", "*.tar.gz", "*.tgz", "*.zip", "*.whl",
    "checkpoints/", "ckpt/", "outputs/", "wandb/", "runs/", "demo_out/", "tensorboard_log/", "mlruns/",
    ".git", ".venv", "venv/", ".gpu/", "__pycache__/", ".pytest_cache/", ".ruff_cache/", "*.egg-info/",
    ".hf_cache/", "hf_cache/",
)
DEFAULT_MAX_FILE_MB = 32.0

_FORWARD_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "HF_HUB_", "VLLM_", "HYBRIDRL_")
_FORWARD_NAMES = frozenset({
    "PYTHONUNBUFFERED", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME",
    "TOKENIZERS_PARALLELISM", "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_LAUNCH_BLOCKING", "NCCL_NVLS_ENABLE",
    "PYTORCH_CUDA_ALLOC_CONF", "TORCH_CUDA_ARCH_LIST", "NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN",
})
_SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "CREDENTIAL", "PRIVATE_KEY", "AUTH")


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(m in upper for m in _SECRET_MARKERS)


def forwarded_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's variables that workers should see (allow-list; credential-like names never)."""
    environ = os.environ if environ is None else environ
    # Named variables are known to be harmless (TOKENIZERS_PARALLELISM is no token); prefix matches are
    # screened, since e.g. HF_HUB_TOKEN shares a prefix with harmless ones.
    return {k: v for k, v in environ.items()
            if k in _FORWARD_NAMES or (k.startswith(_FORWARD_PREFIXES) and not looks_secret(k))}


def _matches(rel: str, is_dir: bool, patterns: Iterable[str]) -> bool:
    """gitignore-like matching for the pattern shapes used here: `*.ext`, `name`, `dir/`, `a/b`."""
    name = rel.rsplit("/", 1)[-1]
    for p in patterns:
        anchored = p.strip("/")
        if p.endswith("/") and not is_dir:
            continue
        if fnmatch.fnmatch(name, anchored) or ("/" in anchored and fnmatch.fnmatch(rel, anchored)):
            return True
    return False


def find_large_files(working_dir: str, excludes: Iterable[str], max_file_mb: float) -> list[str]:
    """Files (relative paths) above `max_file_mb` that `excludes` does not already leave out."""
    excludes = list(excludes)
    limit = max_file_mb * 1024 * 1024
    large = []
    for root, dirs, files in os.walk(working_dir):
        rel_root = os.path.relpath(root, working_dir).replace(os.sep, "/")
        rel_root = "" if rel_root == "." else rel_root + "/"
        dirs[:] = [d for d in dirs if not _matches(rel_root + d, True, excludes)]
        for f in files:
            rel = rel_root + f
            path = os.path.join(root, f)
            if not _matches(rel, False, excludes) and not os.path.islink(path) and os.path.getsize(path) > limit:
                large.append(rel)
    return sorted(large)


def build_runtime_env(working_dir: str | None = None, extra_env: Mapping[str, str] | None = None, *,
                      excludes: Iterable[str] = (), max_file_mb: float = DEFAULT_MAX_FILE_MB,
                      environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A runtime_env for `ray.init`: `working_dir` (optional) minus weights/checkpoints/large files,
    and `env_vars` = forwarded driver variables + `extra_env` (given explicitly, so forwarded as is)."""
    env: dict[str, Any] = {}
    env_vars = {**forwarded_env(environ), **{str(k): str(v) for k, v in (extra_env or {}).items()}}
    if env_vars:
        env["env_vars"] = env_vars
    if working_dir is not None:
        if not os.path.isdir(working_dir):
            raise ValueError(f"build_runtime_env: working_dir {working_dir!r} is not a directory")
        patterns = [*DEFAULT_EXCLUDES, *excludes]
        large = find_large_files(working_dir, patterns, max_file_mb)
        if large:
            logger.warning("runtime_env: leaving %d file(s) over %.0f MB out of the upload: %s", len(large),
                           max_file_mb, ", ".join(large[:10]) + (" ..." if len(large) > 10 else ""))
        env["working_dir"] = os.path.abspath(working_dir)
        env["excludes"] = patterns + ["/" + p for p in large]
    return env


def describe_runtime_env(env: Mapping[str, Any]) -> str:
    """A loggable summary: variable names only (values can hold secrets), exclude count."""
    names = sorted(env.get("env_vars", {}))
    wd = env.get("working_dir")
    return f"runtime_env(working_dir={wd!r}, excludes={len(env.get('excludes', []))} patterns, env_vars={names})"




def cpus_per_process(local_cpus: int, processes: int, per_node: int, joined: bool) -> float:
    """CPUs each worker process reserves on a CPU run (GPU runs reserve one GPU and one CPU).

    On a cluster this process joined, the smallest live node's CPUs split among one node's `per_node` workers, so
    that each node's slots fill a Ray node of their own, as a node's GPUs do; on a Ray started here, this machine's
    `local_cpus` among all `processes`, at most one each.
    """
    if not joined:
        return min(1.0, local_cpus / processes)
    import ray

    cpus = [n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]
    smallest = min((c for c in cpus if c > 0), default=0.0)
    if smallest < per_node:
        raise RuntimeError(f"the Ray cluster's nodes offer {sorted(cpus)} CPUs; a CPU run needs at least "
                           f"trainer.n_gpus_per_node={per_node} on every node (ray start --num-cpus)")
    return smallest / per_node


def init_ray(num_cpus: int | None = None, num_gpus: int | None = None, *, address: str | None = None,
             working_dir: str | None = None, extra_env: Mapping[str, str] | None = None,
             include_dashboard: bool | None = None, connect_timeout_s: float = 30.0, **ray_kwargs: Any) -> Any:
    """Start (or join, with `address` or RAY_ADDRESS) Ray with our runtime env; the dashboard, if any, on localhost.

    The dashboard is off unless asked for (`include_dashboard=True`). `ray.shutdown` runs at exit. A cluster to
    join must answer within `connect_timeout_s` (ray_address.py), else RayAddressUnreachable names the address.
    Returns Ray's context; a no-op returning None when Ray is already initialized in this process.
    """
    import ray

    if ray.is_initialized():
        return None
    joining = joins_cluster(address)
    if joining:
        check_ray_address(address, connect_timeout_s)  # ray.init alone would retry for ~14 minutes
        # an existing cluster's resources are fixed, and Ray refuses num_cpus/num_gpus when joining one
        num_cpus = num_gpus = None
    if not joining:
        # Ray prestarts one idle worker a CPU for the first driver, with the default runtime env: none of them can
        # host our actors (they carry ours), so each is a process start-up for nothing (~1.5 CPU-s a Ray start on a
        # 2-core CPU machine; one per core on a GPU host). The raylet started below reads this from our environment.
        os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    if not joining and "_temp_dir" not in ray_kwargs:
        # Ray's session folder and the workers' temp files (megatron-core imports wandb, whose temp folders a
        # worker ended by Ray never removes) go into one folder of this run, removed by shutdown_ray
        run_tmp = _new_run_temp_dir()
        ray_kwargs["_temp_dir"] = os.path.join(run_tmp, "ray")
        extra_env = {"TMPDIR": os.path.join(run_tmp, "tmp"), **(extra_env or {})}
    runtime_env = build_runtime_env(working_dir, extra_env)
    logger.info("starting Ray with %s", describe_runtime_env(runtime_env))
    atexit.register(shutdown_ray)  # first: a signal that interrupts ray.init still gets its folder removed
    # Ray's core worker installs absl's failure signal handler, which takes SIGTERM from the driver's own handler
    # (stack dump, then the process dies): the driver's SIGTERM/SIGINT handling stays the trainer's
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    ray_log = logs.ray_log_path()
    if ray_log:  # a trainer run: Ray's own lines go to its logs/ folder, the console keeps hybridrl's and errors
        logs.route_ray_lines(ray_log)
        logger.info("Ray's own log lines go to %s (its errors to the console too)", ray_log)
    with _signal_handlers_kept():
        context = ray.init(
            address=address, num_cpus=num_cpus, num_gpus=num_gpus, runtime_env=runtime_env or None,
            include_dashboard=bool(include_dashboard), dashboard_host="127.0.0.1", **ray_kwargs,
        )
    if ray_log and getattr(context, "dashboard_url", None):  # asked for: said on the console, not only in ray.log
        url = context.dashboard_url
        logger.info("Ray dashboard at %s", url if "://" in url else f"http://{url}")
    return context


@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """ray.init replaces the driver's SIGTERM handler twice (a Python one calling sys.exit, then its core worker's
    C++ one, which dumps a stack and kills the process): the driver's own handlers (the trainer's stopping.py)
    are put back when it returns."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    remove_run_temp_dirs()
    logs.unroute_ray_lines()


_RUN_TEMP_DIRS: list[str] = []
RUN_TEMP_PREFIX, RUN_TEMP_OWNER = "hybridrl-", "owner.json"


def _new_run_temp_dir(base: str | None = None) -> str:
    """A short path (Ray's UNIX sockets live below it and must stay under 108 characters). Folders of earlier runs
    whose driver ended without removing them (kill -9, out of memory) are removed first: remove_stale_run_temp_dirs."""
    if base is None:
        base = tempfile.gettempdir()
        if len(base) > 32 and os.path.isdir("/tmp"):
            base = "/tmp"
    remove_stale_run_temp_dirs(base)
    path = tempfile.mkdtemp(prefix=RUN_TEMP_PREFIX, dir=base)
    with open(os.path.join(path, RUN_TEMP_OWNER), "w") as f:  # what proves the folder ours once this driver is gone
        json.dump({"pid": os.getpid(), "start": _process_start(os.getpid()), "pid_ns": _pid_namespace()}, f)
    os.makedirs(os.path.join(path, "tmp"))
    _RUN_TEMP_DIRS.append(path)
    return path


def remove_stale_run_temp_dirs(base: str) -> list[str]:
    """Remove the run folders in `base` whose owner.json names a driver that no longer runs (its pid gone, or
    reused by a process that started at another time). A folder without that file, one this user cannot read, or
    one made in another pid namespace (a container sharing /tmp, whose pids mean other processes) is left alone:
    nothing is deleted that is not proven to be an earlier run's."""
    removed = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        path = os.path.join(base, name)
        if not name.startswith(RUN_TEMP_PREFIX) or os.path.islink(path) or not os.path.isdir(path):
            continue
        try:
            with open(os.path.join(path, RUN_TEMP_OWNER)) as f:
                owner = json.load(f)
            pid, start, pid_ns = int(owner["pid"]), owner["start"], owner["pid_ns"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if start is not None and pid_ns is not None and pid_ns == _pid_namespace() and _process_start(pid) != start:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        logger.info("removed %d temp folder(s) of earlier runs that ended without removing them: %s", len(removed),
                    ", ".join(removed))
    return removed


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid, it names one
    process even after the pid is reused. None where /proc is absent or the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def remove_run_temp_dirs() -> None:
    """The folders init_ray made (Ray's session logs and spilled objects, the workers' temp files)."""
    while _RUN_TEMP_DIRS:
        path = _RUN_TEMP_DIRS.pop()
        for _ in range(3):  # a Ray process still ending may write a last log line after the first pass
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                break
            time.sleep(0.5)
