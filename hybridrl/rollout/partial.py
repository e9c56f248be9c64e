"""Partial rollout: requests generate in segments, and weights change between segments (the fully async mode).

A request of up to max_tokens runs as segments of at most `segment_tokens` (each a `generate_tokens` call on the
prompt plus what the request generated so far). Between segments it passes the VersionGate. A weight sync closes
the gate, waits for the segments in flight (partial rollout) or for the samples in flight (without), loads the
weights and opens the gate with the new version: the request goes on with the new weights, re-reading its prefix
(verl's abort-and-resume). Every generated token records the version of the weights that sampled it, so a sample
holds token ranges of several versions, and its rollout log-probs are each range's own.

A sample whose first token is more than `max_stale_syncs` syncs old when it passes the gate starts over from its
prompt (StaleSample): the trainer would not take it anyway.

Thread model: generation runs on an asyncio loop in one thread; `sync` runs in another (the worker's call thread)
and only touches the engine while no segment is in flight.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Optional, Sequence

from .base import SamplingParams, TokenOutput
from .sampling import row_seed

_POLL_S = 0.002


class StaleSample(Exception):
    """A sample's oldest token became too old before it finished: it starts over."""


class GateClosed(Exception):
    """The producer stopped (or failed) while a request waited at the gate."""


class VersionGate:
    """Counts segments and samples in flight; a sync closes it, a version opens it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.version: Optional[int] = None  # actor updates behind the engine's weights; None: no weights yet
        self.syncs = 0  # weight loads so far
        self._open = False  # segments may start
        self._accepting = False  # samples may start (false while a sync without partial rollout waits)
        self._segments = 0
        self._samples = 0
        self._stopped: Optional[str] = None
        self.paused_s = 0.0  # time segments could not run because of syncs

    # ------------------------------------------------------------------ generation side (event-loop thread)
    async def enter_sample(self) -> None:
        await self._wait(lambda: self._accepting)
        self._samples += 1

    def leave_sample(self) -> None:
        with self._cond:
            self._samples -= 1
            self._cond.notify_all()

    async def enter_segment(self) -> tuple[int, int]:
        """(version, sync index) of the weights this segment runs on."""
        await self._wait(lambda: self._open)
        self._segments += 1
        return int(self.version), self.syncs

    def leave_segment(self) -> None:
        with self._cond:
            self._segments -= 1
            self._cond.notify_all()

    async def _wait(self, ready: Callable[[], bool]) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    raise GateClosed(self._stopped)
                if ready():
                    return
            await asyncio.sleep(_POLL_S)

    # ------------------------------------------------------------------ sync side (any other thread)
    def sync(self, load: Callable[[], Any], version: int, partial: bool, timeout_s: float) -> Any:
        """Close, wait for what is in flight, `load()` the new weights, open with `version`; returns load's result."""
        start = time.perf_counter()
        with self._cond:
            self._accepting = False
            if not partial:  # the samples in flight finish on the old weights
                self._wait_for(lambda: self._samples == 0, timeout_s, "samples")
            self._open = False
            self._wait_for(lambda: self._segments == 0, timeout_s, "segments")
        try:
            return load()
        finally:
            with self._cond:
                self.version, self.syncs = version, self.syncs + 1
                self._open = self._accepting = True
                self.paused_s += time.perf_counter() - start
                self._cond.notify_all()

    def _wait_for(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        if not self._cond.wait_for(done, timeout=timeout_s):
            raise TimeoutError(f"weight sync: the {what} in flight did not finish within {timeout_s:.0f} s")

    def pause(self, timeout_s: float) -> "_Paused":
        """A block in which no segment runs (validation on the same engine)."""
        return _Paused(self, timeout_s)

    def stop(self, reason: str) -> None:
        with self._cond:
            self._stopped = reason
            self._cond.notify_all()


class _Paused:
    def __init__(self, gate: VersionGate, timeout_s: float) -> None:
        self.gate, self.timeout_s = gate, timeout_s

    def __enter__(self) -> None:
        g = self.gate
        with g._cond:
            self._was_open = g._open
            g._open = False
            g._wait_for(lambda: g._segments == 0, self.timeout_s, "segments")

    def __exit__(self, *exc: Any) -> None:
        g = self.gate
        with g._cond:
            g._open = self._was_open
            g._cond.notify_all()


class VersionedRequests:
    """One sample's view of the engine: `generate_tokens` in segments through the gate, recording per generated
    token the version that sampled it (in generation order; the agent loop adds them to its response in order)."""

    def __init__(self, engine: Any, gate: VersionGate, segment_tokens: int, max_stale_syncs: Optional[int]) -> None:
        self.engine, self.gate = engine, gate
        self.segment_tokens, self.max_stale_syncs = segment_tokens, max_stale_syncs
        self.versions: list[int] = []
        self.first_sync: Optional[int] = None
        self.segments = 0

    async def generate_tokens(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> TokenOutput:
        ids: list[int] = []
        log_probs: list[float] = []
        budget = sampling.max_tokens
        base_seed = sampling.seed if sampling.seed is not None else int(time.time_ns())
        finish = "length"
        while len(ids) < budget:
            version, sync = await self.gate.enter_segment()
            try:
                if self.first_sync is None:
                    self.first_sync = sync
                elif self.max_stale_syncs is not None and sync - self.first_sync > self.max_stale_syncs:
                    raise StaleSample(f"first token {sync - self.first_sync} syncs old")
                step = sampling.with_(max_tokens=min(self.segment_tokens, budget - len(ids)),
                                      seed=row_seed(base_seed, self.segments))
                out = await self.engine.generate_tokens(list(prompt_ids) + ids, step)
            finally:
                self.gate.leave_segment()
            self.segments += 1
            ids += out.token_ids
            log_probs += out.log_probs
            self.versions += [version] * len(out.token_ids)
            finish = out.finish_reason
            if finish == "stop":
                break
        return TokenOutput(tuple(ids), tuple(log_probs), finish)
