"""Fully asynchronous rollouts (async_training.enable): the trainer's iterator of ready batches.

    start:      weights -> rollout, start each worker's producer, hand out one window of prompts
    collector:  a thread moves each finished prompt group from the workers into the bounded SampleQueue at once
    step t:     [every sync_every steps: push the weights after t-1 updates (partial rollout: the workers pause
                 between segments, load, go on), hand out the next window's prompts]
                take groups_per_step groups within the staleness bound (waiting: trainer idle), score, yield
A window is verl's rollout_num = (1 + staleness_threshold) x sync_every x groups_per_step groups, minus the groups
still queued or in flight from the last one. Versions count actor updates: the trainer's version at step t is t-1.

When a rollout worker dies (or anything else fails here), the groups already finished are written to
{default_local_dir}/{async_training.queue_samples_dir}/ and the error names the worker and the file.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Iterator, Optional

from hybridrl.config.async_checks import AsyncPlan
from hybridrl.protocol import DataProto
from hybridrl.rollout.async_queue import SampleQueue, sample_lags, staleness_metrics

from .batch_ops import agent_metrics
from .dynamic_sampling import Rollout

if TYPE_CHECKING:
    from .generation import SplitGeneration
    from .sampling import Sampler

COLLECT_WAIT_S = 0.1  # how long one take_completed call waits on the workers for a finished group


class FullyAsyncStream:
    """`sampler` prepares the prompts and scores the samples; `split` pushes the weights to its rollout workers,
    whose producers generate continuously."""

    def __init__(self, prompts: Iterator[DataProto], split: "SplitGeneration", sampler: "Sampler", plan: AsyncPlan, *,
                 start_step: int, steps: int, spill_dir: str, call_timeout_s: float) -> None:
        self.prompts, self.split, self.sampler, self.plan = prompts, split, sampler, plan
        self.rollout = split.rollout
        self.first, self.last = start_step + 1, start_step + steps
        self.spill_dir, self.call_timeout_s = spill_dir, call_timeout_s
        self.queue = SampleQueue(capacity=max(plan.window_groups * 2, plan.groups_per_step))
        self.replicas = self.rollout.world_size  # tp_g = 1 on the paths that run this (checked by the workers)
        self.submitted = 0
        self.exhausted = False
        self.worker_stats: list[dict[str, float]] = []
        self._next_replica = 0
        self._leftover: Optional[DataProto] = None
        self._draws = 0
        self._taken: list[DataProto] = []  # taken from the queue, not yet trained on
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self._collector: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ the iterator
    def __iter__(self) -> Iterator[Rollout]:
        try:
            yield from self._steps()
        except Exception as e:
            noted = self._failed(e)
            if noted is e:
                raise
            raise noted from e
        finally:
            self._shutdown()

    def _steps(self) -> Iterator[Rollout]:
        if self.first > self.last:
            return
        self.rollout.start_continuous()
        pushed = self.split.push(self.first - 1)
        self._collector = threading.Thread(target=self._collect, name="async-collector", daemon=True)
        self._collector.start()
        self._hand_out(self.plan.window_groups)
        last_yield = time.perf_counter()
        for step in range(self.first, self.last + 1):
            version = step - 1
            if step > self.first and (step - 1) % self.plan.sync_every == 0:
                pushed = self.split.push(version)
                self._hand_out(self.plan.window_groups - self.queued_or_in_flight())
            waited = time.perf_counter()
            groups, dropped = self._take(version)
            if not groups:
                return  # the prompts ran out and nothing is left to train on
            wait_s = time.perf_counter() - waited
            batch = DataProto.concat(groups)
            batch.meta_info = {"temperature": self.sampler.temperature, "step": step, "weight_version": version}
            start = time.perf_counter()
            batch = self.sampler.score(batch)
            metrics = self._metrics(batch, version, dropped, wait_s, time.perf_counter() - last_yield, pushed)
            pushed = {}
            timing = {"gen": wait_s, "reward": time.perf_counter() - start}
            yield Rollout(batch, int(groups[0].meta_info.get("epoch", 0)), metrics, timing)
            self._taken = []
            last_yield = time.perf_counter()

    def _take(self, version: int) -> tuple[list[DataProto], int]:
        """groups_per_step groups within the bound, waiting for the producers; fewer only when no more can come."""
        need, dropped_total = self.plan.groups_per_step, 0
        while len(self._taken) < need:
            self._raise_if_failed()
            got, dropped = self.queue.take(need - len(self._taken), version, self.plan.max_lag)
            self._taken += got
            dropped_total += dropped
            if dropped:
                self._hand_out(dropped)  # replace what the bound threw away
            if len(self._taken) < need:
                if self.exhausted and self.queued_or_in_flight() == 0:
                    break
                self.queue.wait(0.05)
        return self._taken, dropped_total

    def queued_or_in_flight(self) -> int:
        return self.submitted - self.queue.received + len(self.queue)

    # ------------------------------------------------------------------ rollout side
    def _hand_out(self, groups: int) -> None:
        """Submit `groups` new prompts, spread over the rollout replicas."""
        shares: list[list[DataProto]] = [[] for _ in range(self.replicas)]
        left = groups
        while left > 0 and not self.exhausted:
            batch = self._leftover if self._leftover is not None else next(self.prompts, None)
            if batch is None:
                self.exhausted = True
                break
            self._leftover = batch[left:] if len(batch) > left else None  # the next window starts with them
            # step: the one the stream started after (which trainer step takes a group is known only then)
            batch = self.sampler.prepare(batch[:left], self.first - 1, self._draws)
            self._draws += 1
            for i in range(len(batch)):
                shares[self._next_replica].append(batch[i:i + 1])
                self._next_replica = (self._next_replica + 1) % self.replicas
            left -= len(batch)
            self.submitted += len(batch)
        if any(shares):
            self.rollout.submit_prompts([DataProto.concat(s) if s else None for s in shares]).get(self.call_timeout_s)

    def _collect(self) -> None:
        """Collector thread: finished groups into the queue as soon as the workers have them."""
        try:
            while not self._stop.is_set():
                results = self.rollout.take_completed(COLLECT_WAIT_S).get(self.call_timeout_s)
                self.worker_stats = [stats for _, stats in results]
                for groups, _ in results:
                    for group in groups:
                        if not self.queue.put(group, self._stop):
                            return
        except BaseException as e:
            self._error = e
            self.queue.notify()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    # ------------------------------------------------------------------ metrics and endings
    def _metrics(self, batch: DataProto, version: int, dropped: int, wait_s: float, since_last_s: float,
                 pushed: dict[str, float]) -> dict[str, float]:
        out = dict(pushed)
        out.update(staleness_metrics(batch, version, self.plan.sync_every))
        out["async/staleness"] = float(sample_lags(batch, version).double().mean())
        out["fully_async/count/stale_samples_processed"] = float(len({u for u, lag in zip(
            batch.non_tensor_batch["uid"], sample_lags(batch, version).tolist()) if lag > 0}))
        out["fully_async/queue/depth"] = float(len(self.queue))
        out["fully_async/queue/in_flight"] = float(self.submitted - self.queue.received)
        out["fully_async/dropped_stale_groups"] = float(dropped)
        out.update(agent_metrics(batch.non_tensor_batch.get("agent_tool_calls"),
                                 batch.non_tensor_batch.get("agent_turns")))
        out["timing_s/trainer_idle"] = wait_s
        out["trainer/idle_ratio"] = wait_s / since_last_s if since_last_s > 0 else 0.0
        stats = self.worker_stats
        if stats:
            busy = sum(s["busy_s"] for s in stats) / len(stats)
            alive = sum(s["alive_s"] for s in stats) / len(stats)
            out["rollouter/idle_ratio"] = 1.0 - busy / alive if alive > 0 else 0.0
            out["fully_async/restarted_samples"] = sum(s["restarted_samples"] for s in stats)
            out["timing_s/rollouter_sync_pause"] = max(s["sync_pause_s"] for s in stats)
        return out

    def _failed(self, error: Exception) -> Exception:
        """Write the finished groups out; the error with a note saying where (a worker's error keeps its class)."""
        try:
            path = self.queue.spill(self.spill_dir, self._taken)
        except Exception as e:  # the original failure matters more
            note = f" (writing the {len(self.queue) + len(self._taken)} finished sample groups failed: {e})"
        else:
            note = f"; the finished sample groups were written to {path}" if path else ""
        if note and hasattr(error, "with_note"):
            return error.with_note(note)
        if note:
            print(f"hybridrl: fully async training stopped by {type(error).__name__}{note}", flush=True)
        return error

    def _shutdown(self) -> None:
        self._stop.set()
        self.queue.notify()
        if self._collector is not None:
            self._collector.join(timeout=COLLECT_WAIT_S * 20)
        if self._error is None:
            try:
                self.rollout.stop_continuous()
            except Exception as e:  # shutting down after a failure must not hide it
                print(f"hybridrl: stopping the rollout producers raised {type(e).__name__}: {e}", flush=True)

    def loader_state(self) -> Optional[dict]:
        """Prompts in flight at a checkpoint are not generated again on resume (None: the loader's own state)."""
        return None
