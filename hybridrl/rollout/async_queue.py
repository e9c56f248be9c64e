"""The bounded queue between the rollout producers and the trainer (fully async mode), and the staleness math.

Entries are finished prompt groups (rollout batches of n rows carrying `rollout_versions`, the version of each
response token; -1 where the policy generated nothing). A group's *lag* at a trainer step is the trainer's version
(updates done before the step's update) minus the version of the group's oldest token. The trainer takes groups
first in first out and drops those whose lag exceeds the bound (counted). Nothing here knows about Ray or workers.

A spill file (`SampleQueue.spill`) holds finished groups as safetensors + JSON, tagged with the run that wrote it;
a resumed run reads it back (hybridrl/trainer/spilled.py). It is written under a new name, whole or not at all.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from typing import Optional

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save

from hybridrl.protocol import DataProto
from hybridrl.utils.durable import write_new

from .continuous import VERSIONS_KEY

log = logging.getLogger(__name__)
SPILL_FORMAT = "hybridrl.async_queue/1"


class SpillFileError(ValueError):
    """A spill file that cannot be read back whole (named in the message)."""


def version_span(group: DataProto) -> tuple[int, int]:
    """(oldest, newest) version among the group's generated tokens ((-1, -1) for a group without any)."""
    v = group.batch[VERSIONS_KEY]
    made = v[v >= 0]
    return (int(made.min()), int(made.max())) if made.numel() else (-1, -1)


def sample_lags(batch: DataProto, trainer_version: int) -> torch.Tensor:
    """[B] lag of each row: trainer_version minus its oldest generated token's version (0 for rows without one)."""
    v = batch.batch[VERSIONS_KEY]
    oldest = torch.where(v >= 0, v, torch.full_like(v, trainer_version)).min(dim=-1).values
    return (trainer_version - oldest).clamp(min=0)


def staleness_metrics(batch: DataProto, trainer_version: int, sync_every: int) -> dict[str, float]:
    """Version lag per sample (mean/max/min, in updates), its histogram in sync windows, and verl's partial-rollout
    counts (a partial sample's tokens come from more than one version)."""
    v = batch.batch[VERSIONS_KEY]
    made = v >= 0
    lags = sample_lags(batch, trainer_version).double()
    newest = torch.where(made, v, torch.full_like(v, -1)).max(dim=-1).values
    oldest = torch.where(made, v, torch.full_like(v, 2**62)).min(dim=-1).values
    span = torch.where(made.any(-1), newest - oldest, torch.zeros_like(newest))
    n = max(len(batch), 1)
    out = {"fully_async/version_lag/mean": float(lags.mean()), "fully_async/version_lag/max": float(lags.max()),
           "fully_async/version_lag/min": float(lags.min()),
           "fully_async/count/stale_trajectory_processed": float((lags > 0).sum()),
           "fully_async/partial/total_partial_num": float((span > 0).sum()),
           "fully_async/partial/partial_ratio": float((span > 0).sum()) / n,
           "fully_async/partial/max_partial_span": float(span.max()) if len(batch) else 0.0}
    windows = (lags // max(sync_every, 1)).long()
    for k in range(int(windows.max()) + 1 if len(batch) else 0):
        out[f"fully_async/staleness_hist/{k}_syncs"] = float((windows == k).sum()) / n
    return out


class SampleQueue:
    """Finished groups in arrival order, at most `capacity` (put blocks beyond it); thread-safe."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"SampleQueue: capacity={capacity} must be >= 1")
        self.capacity = capacity
        self._groups: deque[DataProto] = deque()
        self._cond = threading.Condition()
        self.dropped = 0  # groups over the staleness bound, never trained on
        self.received = 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._groups)

    def put(self, group: DataProto, stop: Optional[threading.Event] = None) -> bool:
        """Append (waits while full); False if `stop` was set meanwhile."""
        with self._cond:
            while len(self._groups) >= self.capacity:
                if stop is not None and stop.is_set():
                    return False
                self._cond.wait(0.05)
            self._groups.append(group)
            self.received += 1
            self._cond.notify_all()
            return True

    def preload(self, groups: list[DataProto]) -> None:
        """Put `groups` (read back from a spill file) first in line, whatever the capacity: the producers' groups
        wait behind them."""
        with self._cond:
            self._groups.extendleft(reversed(groups))
            self._cond.notify_all()

    def take(self, count: int, trainer_version: int, max_lag: int) -> tuple[list[DataProto], list[DataProto]]:
        """Up to `count` groups within the bound (oldest first) and the stale ones dropped on the way."""
        out: list[DataProto] = []
        dropped: list[DataProto] = []
        with self._cond:
            while self._groups and len(out) < count:
                group = self._groups.popleft()
                oldest, _ = version_span(group)
                if oldest >= 0 and trainer_version - oldest > max_lag:
                    dropped.append(group)
                    continue
                out.append(group)
            self.dropped += len(dropped)
            self._cond.notify_all()
        return out, dropped

    def wait(self, timeout_s: float) -> None:
        """Until something arrives or timeout_s passes."""
        with self._cond:
            self._cond.wait(timeout_s)

    def notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def spill(self, folder: str, extra: Optional[list[DataProto]] = None, run: str = "") -> Optional[str]:
        """Write every queued group (plus `extra`, groups taken but not trained on, first) to a new file in
        `folder`, tagged with `run`; its path, or None when there was nothing to write. safetensors for the tensors
        and JSON for the rest, so reading it back runs no pickle (tests/unit/test_security.py)."""
        with self._cond:
            groups = list(extra or []) + list(self._groups)
        if not groups:
            return None
        tensors = {f"{i}/{k}": t.detach().cpu().contiguous().clone() for i, g in enumerate(groups) for k, t in g.batch.items()}
        rest = [{"non_tensor_batch": {k: list(v) for k, v in g.non_tensor_batch.items()}, "meta_info": g.meta_info,
                 "batch_keys": list(g.batch)} for g in groups]
        lossy: set[str] = set()
        text = json.dumps(rest, default=lambda o: _jsonable(o, lossy))
        if lossy:  # written as their repr(): the file still holds every sample's tokens and versions
            log.warning("async queue spill into %s: values of type %s written as text", folder, sorted(lossy))
        data = save(tensors, metadata={"groups": text, "format": SPILL_FORMAT, "run": run})
        return write_new(folder, f"samples_{time.strftime('%Y%m%d_%H%M%S')}_{os.getpid()}", ".safetensors", data)


def _jsonable(o: object, lossy: set[str]) -> object:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    lossy.add(type(o).__name__)
    return repr(o)


def load_spilled(path: str) -> list[DataProto]:
    """The groups `SampleQueue.spill` wrote (SpillFileError naming the file if it is damaged)."""
    return read_spill(path)[1]


def read_spill(path: str) -> tuple[str, list[DataProto]]:
    """(the run that wrote it, "" for files from before runs were recorded; its groups), whole or SpillFileError."""
    try:
        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != SPILL_FORMAT:
                raise SpillFileError(f"format {meta.get('format')!r}, expected {SPILL_FORMAT!r}")
            groups = json.loads(meta["groups"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        out = []
        for i, g in enumerate(groups):
            batch = {k: tensors[f"{i}/{k}"] for k in g["batch_keys"]}
            non_tensor = {k: np.array(v + [None], dtype=object)[:-1] for k, v in g["non_tensor_batch"].items()}
            group = DataProto(batch, non_tensor, g["meta_info"])
            rows = {len(v) for v in [*batch.values(), *non_tensor.values()]}
            if len(rows) != 1 or len(set(non_tensor["uid"])) != 1 or VERSIONS_KEY not in batch:
                raise SpillFileError(f"group {i} is not one prompt's rows with a uid and {VERSIONS_KEY}")
            out.append(group)
    except SpillFileError as e:
        raise SpillFileError(f"{path}: damaged spill file: {e}") from None
    except Exception as e:  # truncated or altered bytes, JSON or keys: safetensors and json raise many kinds
        raise SpillFileError(f"{path}: damaged spill file ({type(e).__name__}: {e})") from e
    return meta.get("run", ""), out
