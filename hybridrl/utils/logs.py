"""Where hybridrl's own log records go: stderr, at INFO unless HYBRIDRL_LOG_LEVEL says otherwise.

Python drops INFO records of a logger nobody configured (only warnings reach stderr), so the reshard plan,
the direct-copy proof, the offload pinning time and the reward samples (`num_examine`) were never shown.
Only the "hybridrl" logger is touched: vLLM, Ray and megatron keep their own settings. Every process calls
`setup()`: the entry points (trainer, generation, eval) and each worker process (controller/host.py).
The logger stops propagating: in a vLLM worker the root logger has a handler too, and every line came out
twice (once as "INFO:hybridrl...:").
"""
from __future__ import annotations

import logging
import os
import sys

from .errors import ConfigError

LEVEL_ENV = "HYBRIDRL_LOG_LEVEL"
# Set by the trainer's driver for its run (and forwarded to the workers as HYBRIDRL_LOG_LEVEL is): the file that
# other packages' warnings go to, so that the console shows hybridrl's lines (route_warnings below).
WARNINGS_ENV = "HYBRIDRL_WARNINGS_FILE"
_PACKAGE_ROOTS = tuple(os.path.realpath(p) + os.sep for p in (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # hybridrl/
    os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "adapters")))
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMAT = "hybridrl %(levelname)s [%(name)s] %(message)s"


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (Ray and pytest swap it after set-up)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup() -> None:
    """Idempotent; raises ConfigError naming HYBRIDRL_LOG_LEVEL when it holds no level name (the entry points
    print it as they print config mistakes, exit status 2)."""
    level = os.environ.get(LEVEL_ENV, "INFO").strip().upper()
    if level not in LEVELS:
        raise ConfigError(f"{LEVEL_ENV}={os.environ[LEVEL_ENV]!r}: use one of {', '.join(LEVELS)}")
    logger = logging.getLogger("hybridrl")
    logger.setLevel(level)
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(handler)
    logger.propagate = False
    if os.environ.get(WARNINGS_ENV):
        route_warnings(os.environ[WARNINGS_ENV])


def route_warnings(path: str) -> None:
    """Warnings raised in other packages' code (Apex/TE fallbacks, deprecations: about 40 lines a run, from
    every worker) are appended to `path`; hybridrl's own warnings stay on the console. Uses warnings.showwarning,
    the hook the warnings module documents for replacing its output."""
    import warnings

    if getattr(warnings.showwarning, "_hybridrl_file", None) == path:
        return
    console = getattr(warnings.showwarning, "_hybridrl_console", warnings.showwarning)

    def show(message, category, filename, lineno, file=None, line=None):
        # torch's C++ warnings carry the Python line that reached them (ours, often): its marker says whose they are
        ours = os.path.realpath(filename).startswith(_PACKAGE_ROOTS) and "Triggered internally at" not in str(message)
        if ours or file is not None:
            console(message, category, filename, lineno, file, line)
            return
        try:
            with open(path, "a") as f:
                f.write(f"[pid {os.getpid()}] " + warnings.formatwarning(message, category, filename, lineno, line))
        except OSError:
            console(message, category, filename, lineno, file, line)

    show._hybridrl_file, show._hybridrl_console = path, console
    warnings.showwarning = show


# Ray's own driver lines (its "ray" logger) of a run go to this file beside warnings.log: route_ray_lines.
RAY_LOG_NAME = "ray.log"
_ray_routing: list = []  # (our file handler, [(a console handler of Ray's, its level before)])


def ray_log_path() -> str | None:
    """The run's file for Ray's own lines: ray.log beside the run's warnings.log; None outside a trainer run."""
    warnings_file = os.environ.get(WARNINGS_ENV)
    return os.path.join(os.path.dirname(warnings_file), RAY_LOG_NAME) if warnings_file else None


def route_ray_lines(path: str) -> None:
    """Ray's own log lines in this process (the "ray" logger's: its token-authentication warning, "Started a local
    Ray instance", the dashboard address) are appended to `path`; its errors go there and stay on the console. Ray
    configures that logger when imported (one stderr handler, no propagation); ray.init(configure_logging=True) only
    sets its level and formats, so the handlers set here hold through ray.init. unroute_ray_lines undoes it."""
    unroute_ray_lines()
    ray_logger = logging.getLogger("ray")
    handler = logging.FileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s"))
    consoles = [(h, h.level) for h in ray_logger.handlers]
    for h, level in consoles:
        h.setLevel(max(level, logging.ERROR))
    ray_logger.addHandler(handler)
    _ray_routing.append((handler, consoles))


def unroute_ray_lines() -> None:
    ray_logger = logging.getLogger("ray")
    while _ray_routing:
        handler, consoles = _ray_routing.pop()
        ray_logger.removeHandler(handler)
        handler.close()
        for h, level in consoles:
            h.setLevel(level)
