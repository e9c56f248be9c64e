"""Experiment tracking: one `Tracker` sends each step's metrics to every backend in trainer.logger.

    tracker = Tracker(["console", "jsonl"], "proj", "exp", config=to_dict(cfg), log_dir="out/logs")
    tracker.log({"critic/score/mean": 0.5, ...}, step=1)
    tracker.finish()                      # prints the summary table, flushes and closes the backends

Backends: console (one compact line per step, a summary table at the end), jsonl
(`{log_dir}/metrics.jsonl`, one object per step), tensorboard (`{log_dir}/tensorboard`), wandb (run
folder under `{log_dir}`; offline unless an API key is set and the server answers, so a first run needs
no account and no network).

Secrets: the config every backend receives goes through `redact` first, and nothing here prints or
stores environment variables. Non-finite metric values are logged, never raised on: a NaN loss is
exactly what the logs must show. JSON has no NaN, so jsonl writes them as the strings "nan", "inf",
"-inf" (`float()` reads them back).
"""
from __future__ import annotations

import json
import math
import os
import re
import socket
import sys
import threading
from typing import Any, Iterable, Mapping, Optional, TextIO, Union
from urllib.parse import urlparse

from hybridrl.config.validate import LOGGERS  # the names trainer.logger accepts (one list, checked at validation)

REDACTED = "***REDACTED***"

# A config key is secret when its name contains one of these words (case-insensitive) ...
_SECRET_NAME = re.compile(r"key|token|secret|passw(or)?d|credential", re.IGNORECASE)
# ... unless it is one of the schema's non-secret look-alikes: column names (data.prompt_key, ...),
# tokenizer paths and token-count limits. Listing these keeps the saved config usable for a rerun.
_NOT_SECRET_NAME = re.compile(
    r"^(prompt|response|reward_fn|data_source|reward_model|image|video|answer|label|sort|group)_key$"
    r"|tokenizer|^max_\w*tokens?$|token_len|^num_\w*tokens?$|batched_tokens",
    re.IGNORECASE,
)

# The compact console line: (label, metric) in this order, each shown when the step has it.
CONSOLE_KEYS = (
    ("score", "critic/score/mean"),
    ("resp_len", "response_length/mean"),
    ("pg_loss", "actor/pg_loss"),
    ("ppo_kl", "actor/ppo_kl"),
    ("kl_loss", "actor/kl_loss"),
    ("entropy", "actor/entropy"),
    ("vf_loss", "critic/vf_loss"),
    ("grad_norm", "actor/grad_norm"),
    ("tok/s/gpu", "perf/throughput"),
    ("mfu", "perf/mfu/actor"),
    ("step_s", "timing_s/step"),
)
# Validation scores (verl's val-core/{data_source}/reward/mean@{n}, or val/score) join the line too.
_VAL_KEY = re.compile(r"^val(-core)?/(.*/reward/mean@\d+|score|test_score/.*)$")


# ------------------------------------------------------------------------------------------ redaction
def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name)) and not _NOT_SECRET_NAME.search(name)


def redact(config: Any) -> Any:
    """A copy of `config` (nested dicts/lists) with the values of secret-looking keys replaced.

    Keys matching *key*, *token*, *secret*, *password* (any case, e.g. WANDB_API_KEY, hf_token) are
    secret, except the schema's column-name and token-count keys (data.prompt_key, max_num_batched_tokens).
    A None value stays None: there is nothing to hide and it shows the key was unset.
    """
    if isinstance(config, Mapping):
        return {k: (REDACTED if is_secret_name(str(k)) and v is not None else redact(v)) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [redact(v) for v in config]
    return config


# ------------------------------------------------------------------------------------------ values
def to_float(name: str, value: Any) -> float:
    """A metric as a Python float (tensors, numpy scalars and bools accepted); TypeError names the metric."""
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        raise TypeError(f"metric {name!r}: expected a number, got {type(value).__name__} {value!r}") from None


def json_number(x: float) -> Union[float, str]:
    """Finite floats as is; nan/inf as strings, since strict JSON has no encoding for them."""
    return x if math.isfinite(x) else str(x)


def fmt(x: float) -> str:
    if not math.isfinite(x):
        return str(x)
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.3e}"
    return f"{x:.4g}"


# ------------------------------------------------------------------------------------------ backends
class ConsoleBackend:
    """One short line per step (the CONSOLE_KEYS present), and a first/last/min/max table at the end."""

    def __init__(self, stream: Optional[TextIO] = None) -> None:
        self.stream = stream
        self.history: dict[str, list[float]] = {}

    def _out(self) -> TextIO:
        return self.stream or sys.stdout  # looked up late so redirected/captured stdout is honoured

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.history.setdefault(k, []).append(v)
        shown = [(label, key) for label, key in CONSOLE_KEYS if key in metrics]
        shown[1:1] = [(key, key) for key in sorted(metrics) if _VAL_KEY.match(key)]
        parts = [f"step {step}"] + [f"{label} {fmt(metrics[key])}" for label, key in shown]
        if len(metrics) > len(shown):
            parts.append(f"(+{len(metrics) - len(shown)} metrics)")
        print(" | ".join(parts), file=self._out(), flush=True)

    def summary(self) -> str:
        if not self.history:
            return ""
        width = max(len("metric"), *(len(k) for k in self.history))
        header = f"{'metric':<{width}}  {'first':>10}  {'last':>10}  {'min':>10}  {'max':>10}  {'n':>5}"
        rows = [header, "-" * len(header)]
        for k in sorted(self.history):
            vals = self.history[k]
            finite = [v for v in vals if math.isfinite(v)] or [float("nan")]
            cells = (fmt(vals[0]), fmt(vals[-1]), fmt(min(finite)), fmt(max(finite)))
            rows.append(f"{k:<{width}}  " + "  ".join(f"{c:>10}" for c in cells) + f"  {len(vals):>5}")
        return "\n".join(rows)

    def finish(self) -> None:
        table = self.summary()
        if table:
            print("\nrun summary\n" + table, file=self._out(), flush=True)


class JsonlBackend:
    """`{log_dir}/metrics.jsonl`, appended to (a resumed run continues the file; readers keep the last
    record of a step), flushed after every step so a crash loses nothing already logged."""

    def __init__(self, log_dir: str) -> None:
        os.makedirs(log_dir, exist_ok=True)
        self.path = os.path.join(log_dir, "metrics.jsonl")
        self.file = open(self.path, "a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": step, **{k: json_number(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(record, allow_nan=False) + "\n")
        self.file.flush()

    def finish(self) -> None:
        self.file.close()


class TensorboardBackend:
    """A SummaryWriter under `{log_dir}/tensorboard`; the redacted config is stored as a text summary."""

    def __init__(self, log_dir: str, config: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

        self.writer = SummaryWriter(log_dir=os.path.join(log_dir, "tensorboard"))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```", 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def finish(self) -> None:
        self.writer.flush()
        self.writer.close()


def wandb_mode(probe_timeout_s: float = 2.0) -> str:
    """"online" only when an API key is set and the server answers; else "offline" (runs stay in the run
    folder; `wandb sync` uploads them later). A WANDB_MODE the user set is respected."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if not os.environ.get("WANDB_API_KEY"):
        return "offline"
    url = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    port = url.port or (443 if url.scheme == "https" else 80)
    return "online" if _reachable(url.hostname or "api.wandb.ai", port, probe_timeout_s) else "offline"


def _reachable(host: str, port: int, timeout_s: float) -> bool:
    """A TCP connect in a thread: DNS lookups have no timeout of their own and can hang offline."""
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s + 0.5)
    return bool(result and result[0])


class WandbBackend:
    """A wandb run in `{log_dir}/wandb/`; console capture and system stats are off (they would copy
    stdout into the run folder and start a sampling thread)."""

    def __init__(self, project: str, experiment: str, config: dict, log_dir: str) -> None:
        try:
            import wandb
        except ImportError:
            raise ImportError("trainer.logger includes wandb but the wandb package is not installed "
                              "(pip install wandb, or drop wandb from trainer.logger)") from None
        os.makedirs(log_dir, exist_ok=True)
        settings = wandb.Settings(console="off", x_disable_stats=True, silent=True)
        self.mode = wandb_mode()
        self.run = wandb.init(project=project, name=experiment, config=config, dir=log_dir,
                              mode=self.mode, settings=settings, reinit="create_new")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self) -> None:
        self.run.finish()


# ------------------------------------------------------------------------------------------ tracker
def logger_names(loggers: Union[str, Iterable[str]]) -> list[str]:
    """trainer.logger as a list; unknown names are a ValueError naming the key."""
    names = [loggers] if isinstance(loggers, str) else list(loggers)
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise ValueError(f"trainer.logger: unknown logger(s) {unknown}; choose from {list(LOGGERS)}")
    return list(dict.fromkeys(names))


class Tracker:
    """Fan-out of step metrics to the backends named in trainer.logger."""

    def __init__(
        self,
        loggers: Union[str, Iterable[str]],
        project_name: str,
        experiment_name: str,
        config: Optional[Mapping[str, Any]] = None,
        log_dir: str = "logs",
    ) -> None:
        names = logger_names(loggers)
        safe_config = redact(dict(config or {}))
        self.log_dir = log_dir
        self.backends: dict[str, Any] = {}
        for name in names:
            if name == "console":
                self.backends[name] = ConsoleBackend()
            elif name == "jsonl":
                self.backends[name] = JsonlBackend(log_dir)
            elif name == "tensorboard":
                self.backends[name] = TensorboardBackend(log_dir, safe_config)
            else:
                self.backends[name] = WandbBackend(project_name, experiment_name, safe_config, log_dir)
        self._finished = False

    @classmethod
    def from_config(cls, trainer_cfg: Any, config: Optional[Mapping[str, Any]] = None,
                    log_dir: Optional[str] = None) -> "Tracker":
        """From trainer.{logger, project_name, experiment_name}; logs under {default_local_dir}/logs by default."""
        log_dir = log_dir or os.path.join(os.path.expanduser(trainer_cfg.default_local_dir), "logs")
        return cls(trainer_cfg.logger, trainer_cfg.project_name, trainer_cfg.experiment_name, config, log_dir)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        values = {k: to_float(k, v) for k, v in metrics.items()}
        for backend in self.backends.values():
            backend.log(values, int(step))

    def finish(self) -> None:
        """Idempotent, so the trainer can call it from both its normal end and a `finally`."""
        if self._finished:
            return
        self._finished = True
        for backend in self.backends.values():
            backend.finish()
