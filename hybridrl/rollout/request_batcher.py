"""Per-request generation over a batched engine: requests wait briefly, then run together.

The agent loop awaits one request per sample and turn (`RolloutEngine.generate_tokens`). An engine whose
kernel runs batches (the torch engine) puts a RequestBatcher in front of it: every request that is ready
when the event loop gets round to it joins the next batch, which runs in a worker thread so tool calls and
other asyncio work go on meanwhile. A request that arrives while a batch runs joins the following one:
there is no barrier per turn across samples, only per engine batch.

The batcher holds no event-loop state between drains (futures are made per request), so the same batcher
serves consecutive `asyncio.run` calls (one per rollout step).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from .base import SamplingParams, TokenOutput

RunRows = Callable[[list[list[int]], SamplingParams, list[int], list[int]], list[TokenOutput]]


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future


class RequestBatcher:
    def __init__(self, run_rows: RunRows, max_rows: int = 256) -> None:
        """run_rows(prompts, sampling, limits, seeds): one sample per prompt, row i at most limits[i] tokens,
        drawn from seeds[i] (the torch engine's generate_rows)."""
        if max_rows < 1:
            raise ValueError(f"RequestBatcher: max_rows={max_rows} must be >= 1")
        self.run_rows = run_rows
        self.max_rows = max_rows
        self._pending: list[_Request] = []
        self._task: Optional[asyncio.Task] = None
        self.batches = 0  # engine batches run (for metrics: requests / batches = mean batch size)
        self.requests = 0

    async def submit(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> TokenOutput:
        if sampling.n != 1:
            raise ValueError(f"generate_tokens: sampling.n={sampling.n}; a request is one sample (n=1)")
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), sampling, loop.create_future())
        self._pending.append(request)
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._drain())
        return await request.future

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # every request that is ready now joins this batch
            batch = self._take_batch()
            seeds = [r.sampling.seed if r.sampling.seed is not None else int(torch.randint(0, 2**62, (1,)))
                     for r in batch]
            self.batches += 1
            self.requests += len(batch)
            try:
                outs = await asyncio.to_thread(self.run_rows, [r.prompt_ids for r in batch], batch[0].sampling,
                                               [r.sampling.max_tokens for r in batch], seeds)
            except BaseException as e:  # every request of the batch fails with the engine's error
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(e)
                continue
            for r, out in zip(batch, outs):
                if not r.future.done():
                    r.future.set_result(out)

    def _take_batch(self) -> list[_Request]:
        """The oldest request and every pending one that samples the same way (max_tokens and seed may
        differ per row), up to max_rows."""
        key = _batch_key(self._pending[0].sampling)
        batch = [r for r in self._pending if _batch_key(r.sampling) == key][: self.max_rows]
        taken = {id(r) for r in batch}
        self._pending = [r for r in self._pending if id(r) not in taken]
        return batch


def _batch_key(sampling: SamplingParams) -> SamplingParams:
    return sampling.with_(max_tokens=1, seed=None)
