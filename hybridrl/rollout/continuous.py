"""The rollout side of the fully async mode: a long-lived producer of prompt groups on one engine.

`submit(prompts, sampling)` hands it prompts; each prompt becomes a group of sampling.n samples generated
concurrently (single-turn requests, or the agent loop's turns) through partial.VersionedRequests, so weights can
change between segments. A finished group is assembled as a rollout batch of n rows (rollout/assemble.py) plus
`rollout_versions` [n, R]: the version of the weights that sampled each response token (-1 on tokens the policy
did not generate: padding, tool and user turns) and waits in `completed` until `take` hands it out.

It runs its own asyncio loop in a daemon thread; `take`, `submit`, `sync` and `stats` are called from the
worker's call thread. A failure inside generation stops the producer and is raised by the next `take`.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any, Callable, Optional

import numpy as np
import torch

from hybridrl.protocol import DataProto

from .assemble import assemble_rollout
from .base import SamplingParams
from .partial import GateClosed, StaleSample, VersionedRequests, VersionGate
from .sampling import row_seed

VERSIONS_KEY = "rollout_versions"


class ContinuousRollout:
    def __init__(self, engine: Any, agent: Optional[Any], *, response_length: int, pad_token_id: int,
                 segment_tokens: int, max_stale_syncs: Optional[int], sync_timeout_s: float) -> None:
        self.engine, self.agent = engine, agent
        self.response_length, self.pad_token_id = response_length, pad_token_id
        self.segment_tokens, self.max_stale_syncs = segment_tokens, max_stale_syncs
        self.sync_timeout_s = sync_timeout_s
        self.gate = VersionGate()
        self.completed: deque[DataProto] = deque()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="continuous-rollout", daemon=True)
        self._error: Optional[BaseException] = None
        self.in_flight = 0  # groups submitted and not finished
        self.restarts = 0  # samples started over (too stale)
        self.busy_s = 0.0  # time with at least one group in flight
        self._busy_since: Optional[float] = None
        self._started = time.perf_counter()
        self._thread.start()

    # ------------------------------------------------------------------ called from the worker's thread
    def submit(self, prompts: DataProto, sampling: SamplingParams) -> None:
        self._raise_if_failed()
        for i in range(len(prompts)):
            with self._lock:
                self.in_flight += 1
                self._busy_since = self._busy_since or time.perf_counter()
            seeded = sampling if sampling.seed is None else sampling.with_(seed=row_seed(sampling.seed, i))
            asyncio.run_coroutine_threadsafe(self._group(prompts[i:i + 1], seeded), self._loop)

    def take(self, wait_s: float = 0.0) -> list[DataProto]:
        """The groups finished since the last take (waits up to wait_s for the first one)."""
        deadline = time.perf_counter() + wait_s
        while True:
            self._raise_if_failed()
            with self._lock:
                if self.completed or time.perf_counter() >= deadline:
                    out = list(self.completed)
                    self.completed.clear()
                    return out
            time.sleep(0.005)

    def sync(self, load: Callable[[], Any], version: int, partial: bool) -> Any:
        return self.gate.sync(load, version, partial, self.sync_timeout_s)

    def stats(self) -> dict[str, float]:
        with self._lock:
            busy = self.busy_s + (time.perf_counter() - self._busy_since if self._busy_since else 0.0)
            return {"in_flight_groups": float(self.in_flight), "restarted_samples": float(self.restarts),
                    "busy_s": busy, "alive_s": time.perf_counter() - self._started, "sync_pause_s": self.gate.paused_s}

    def stop(self) -> None:
        self.gate.stop("the rollout producer stopped")
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"continuous rollout failed: {type(self._error).__name__}: {self._error}") \
                from self._error

    # ------------------------------------------------------------------ event-loop thread
    async def _group(self, prompt: DataProto, sampling: SamplingParams) -> None:
        try:
            base = sampling.seed if sampling.seed is not None else int(time.time_ns())
            rows = await asyncio.gather(*(self._sample(prompt, sampling, row_seed(base, j)) for j in range(sampling.n)))
            group = self._assemble(prompt, rows, sampling.n)
            with self._lock:
                self.completed.append(group)
        except GateClosed:
            return
        except BaseException as e:  # the producer is broken: the next take raises it
            self._error = self._error or e
            self.gate.stop(f"{type(e).__name__}: {e}")
        finally:
            with self._lock:
                self.in_flight -= 1
                if self.in_flight == 0 and self._busy_since is not None:
                    self.busy_s += time.perf_counter() - self._busy_since
                    self._busy_since = None

    async def _sample(self, prompt: DataProto, sampling: SamplingParams, seed: int) -> dict[str, Any]:
        """One sample: (response ids, log-probs, loss mask, per-token versions, agent counts); restarts when stale."""
        attempt = 0
        while True:
            await self.gate.enter_sample()
            requests = VersionedRequests(self.engine, self.gate, self.segment_tokens, self.max_stale_syncs)
            try:
                return await self._generate(requests, prompt, sampling.with_(n=1, seed=row_seed(seed, attempt)))
            except StaleSample:
                self.restarts += 1
                attempt += 1
            finally:
                self.gate.leave_sample()

    async def _generate(self, requests: VersionedRequests, prompt: DataProto, sampling: SamplingParams
                        ) -> dict[str, Any]:
        started = time.perf_counter()
        if self.agent is None:
            ids = prompt.batch["input_ids"][0][prompt.batch["attention_mask"][0].bool()].tolist()
            out = await requests.generate_tokens(ids, sampling.with_(max_tokens=self.response_length))
            response, log_probs, mask, turns, calls = list(out.token_ids), list(out.log_probs), None, 1, 0
        else:
            inputs = replace(self.agent.sample_inputs(prompt, sampling)[0], seed=sampling.seed)
            t = await self.agent.loop.run(requests, sampling, inputs)
            response, log_probs, mask, turns, calls = t.response_ids, t.log_probs, t.loss_mask, t.assistant_turns, \
                t.tool_calls
        versions = iter(requests.versions)
        per_token = [next(versions) if m else -1 for m in (mask if mask is not None else [1] * len(response))]
        return {"response": response, "log_probs": log_probs, "mask": mask, "versions": per_token, "turns": turns,
                "calls": calls, "seconds": time.perf_counter() - started, "segments": requests.segments}

    def _assemble(self, prompt: DataProto, rows: list[dict[str, Any]], n: int) -> DataProto:
        masks = [r["mask"] for r in rows]
        out = assemble_rollout(prompt, [r["response"] for r in rows], [r["log_probs"] for r in rows], n=n,
                               max_tokens=self.response_length, pad_token_id=self.pad_token_id,
                               loss_masks=None if any(m is None for m in masks) else masks)
        versions = torch.full((n, self.response_length), -1, dtype=torch.long)
        for k, r in enumerate(rows):
            versions[k, :len(r["versions"])] = torch.as_tensor(r["versions"], dtype=torch.long)
        out.batch[VERSIONS_KEY] = versions
        if self.agent is not None:
            out.non_tensor_batch["agent_turns"] = np.array([r["turns"] for r in rows], dtype=np.int64)
            out.non_tensor_batch["agent_tool_calls"] = np.array([r["calls"] for r in rows], dtype=np.int64)
        out.meta_info["generate_s"] = max(r["seconds"] for r in rows)
        out.meta_info["segments"] = sum(r["segments"] for r in rows)
        return out
