"""Per-request generation on the colocated vLLM engine: one request per agent turn, no barrier per turn.

Why not vLLM's AsyncLLM: in vLLM 0.26 it always runs its engine core in another process
(EngineCoreClient.make_async_mp_client), while the hybrid engine needs the model in this process
(external_launcher, VLLM_ENABLE_V1_MULTIPROCESSING=0): the weight sync writes the actor's shards straight
into the engine's parameters, and sleep/wake free this process's memory. So the same in-process
`vllm.LLM` keeps serving, driven request by request through its LLMEngine: `add_request` when a sample's
turn is ready, `step()` one scheduler iteration at a time from an asyncio task, each finished request
resolving its sample's future. Between steps the event loop runs tool calls and admits new requests, so
the engine's continuous batching sees requests join and leave as their samples' turns do.

Everything runs on the event loop's thread (vLLM's engine is not thread-safe); a step blocks it for one
scheduler iteration (milliseconds), tools run in their own threads meanwhile (hybridrl.agent.loop).
"""
from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable, Optional, Sequence

from .base import SamplingParams, TokenOutput


class VLLMRequestDriver:
    def __init__(self, llm_engine: Any, to_vllm: Callable[[SamplingParams], Any],
                 request_kwargs: Callable[[], dict[str, Any]] = dict) -> None:
        """llm_engine: vllm.LLM(...).llm_engine; to_vllm: our SamplingParams -> vllm.SamplingParams; request_kwargs:
        add_request's further arguments at submit time (the current LoRA adapter's lora_request)."""
        self.engine = llm_engine
        self.to_vllm = to_vllm
        self.request_kwargs = request_kwargs
        self._futures: dict[str, asyncio.Future] = {}
        self._ids = itertools.count()
        self._task: Optional[asyncio.Task] = None
        self.steps = 0  # engine steps driven (for benchmarks: requests per step)

    async def submit(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> TokenOutput:
        if sampling.n != 1:
            raise ValueError(f"generate_tokens: sampling.n={sampling.n}; a request is one sample (n=1)")
        loop = asyncio.get_running_loop()
        rid = f"agent-{next(self._ids)}"
        future = loop.create_future()
        self.engine.add_request(rid, {"prompt_token_ids": list(prompt_ids)}, self.to_vllm(sampling),
                                **self.request_kwargs())
        self._futures[rid] = future
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._drive())
        try:
            return await future
        except asyncio.CancelledError:  # the sample was abandoned: free its slot in the engine
            if self._futures.pop(rid, None) is not None:
                self.engine.abort_request([rid])
            raise

    async def _drive(self) -> None:
        while self._futures:
            try:
                outputs = self.engine.step()
            except BaseException as e:  # every waiting sample fails with the engine's error
                for future in self._futures.values():
                    if not future.done():
                        future.set_exception(e)
                self._futures.clear()
                raise
            self.steps += 1
            for out in outputs:
                if out.finished:
                    future = self._futures.pop(out.request_id, None)
                    if future is not None and not future.done():
                        future.set_result(token_output(out.outputs[0]))
            await asyncio.sleep(0)  # tools and new turns get in between engine steps


def token_output(completion: Any) -> TokenOutput:
    """A vLLM CompletionOutput as TokenOutput (log-probs: the sampled token's processed log-prob, 0 without)."""
    ids = tuple(int(t) for t in completion.token_ids)
    if completion.logprobs is not None:
        lps = tuple(float(step[t].logprob) for step, t in zip(completion.logprobs, ids))
    else:
        lps = (0.0,) * len(ids)
    return TokenOutput(ids, lps, "stop" if completion.finish_reason == "stop" else "length")
