"""Fully asynchronous rollouts (async_training.enable): the trainer's iterator of ready batches.

    start:      weights -> rollout, start each worker's producer, hand out one window of prompts
    collector:  a thread moves each finished prompt group from the workers into the bounded SampleQueue at once
    step t:     [every sync_every steps: push the weights after t-1 updates (partial rollout: the workers pause
                 between segments, load, go on), hand out the next window's prompts]
                take groups_per_step groups within the staleness bound (waiting: trainer idle), score, yield
A window is verl's rollout_num = (1 + staleness_threshold) x sync_every x groups_per_step groups, minus the groups
still queued or in flight from the last one. Versions count actor updates: the trainer's version at step t is t-1.

When a rollout worker dies (or anything else fails here), the groups already finished are written to
{default_local_dir}/{async_training.queue_samples_dir}/ and the error names the worker and the file; when the
trainer stops early (a signal, trainer.max_time_s, an error of its own) the queued groups are written there too.
A run resumed from a checkpoint trains those groups first, each exactly once (spilled.py says how).
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator, Optional

from hybridrl.config.async_checks import AsyncPlan
from hybridrl.protocol import DataProto
from hybridrl.rollout.async_queue import SampleQueue, sample_lags, staleness_metrics

from .batch_ops import agent_metrics
from .dynamic_sampling import Rollout
from .spilled import POSITION, SPILL_STATE, Carried, Pos, SpillLedger

if TYPE_CHECKING:
    from .generation import SplitGeneration
    from .sampling import Sampler

COLLECT_WAIT_S = 0.1  # how long one take_completed call waits on the workers for a finished group


class FullyAsyncStream:
    """`sampler` prepares the prompts and scores the samples; `split` pushes the weights to its rollout workers,
    whose producers generate continuously."""

    def __init__(self, prompts: Iterator[DataProto], split: "SplitGeneration", sampler: "Sampler", plan: AsyncPlan, *,
                 start_step: int, steps: int, spill_dir: str, call_timeout_s: float, snapshot: Callable[[], dict],
                 carried: Optional[Carried] = None) -> None:
        self.prompts, self.split, self.sampler, self.plan = prompts, split, sampler, plan
        self.rollout = split.rollout
        self.first, self.last = start_step + 1, start_step + steps
        self.spill_dir, self.call_timeout_s = spill_dir, call_timeout_s
        # what a resumed run trains first (spilled.py); a fresh run starts a ledger of its own
        self.carried = carried or Carried(SpillLedger.from_loader_state(None))
        self.snapshot, self.ledger = snapshot, self.carried.ledger  # the loader's state; the spilled groups consumed
        self._carried = self.carried.uids  # uid -> prompt position of the carried groups not consumed yet
        self._positions: dict[str, Optional[Pos]] = {}  # uid -> prompt position, of groups handed out
        self._trained = False  # the trainer saved after the batch last yielded, so it trained on it
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
        except GeneratorExit:  # the trainer stopped before the last step: what is finished and untrained stays
            self._spill_on_stop()
            raise
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
        self.queue.preload(self.carried.groups)  # before any new group: they are the oldest
        self.rollout.start_continuous()
        pushed = self.split.push(self.first - 1)
        self._collector = threading.Thread(target=self._collect, name="async-collector", daemon=True)
        self._collector.start()
        self._hand_out(self.plan.window_groups - self.queued_or_in_flight())
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
            metrics = self._metrics(batch, version, len(dropped), wait_s, time.perf_counter() - last_yield, pushed)
            metrics.update(self._consume_carried(groups, dropped, step))
            # the push runs between steps, outside the update's clock: counted in this step's time as the other
            # modes count theirs (inside generation), so timing_s/step sums to the run's wall time
            timing = {"gen": wait_s, "reward": time.perf_counter() - start,
                      "weight_push": pushed.get("timing_s/weight_push", 0.0)}
            pushed = {}
            self._trained = False
            yield Rollout(batch, int(groups[0].meta_info.get("epoch", 0)), metrics, timing)
            self._taken = []
            last_yield = time.perf_counter()

    def _take(self, version: int) -> tuple[list[DataProto], list[DataProto]]:
        """groups_per_step groups within the bound, waiting for the producers; fewer only when no more can come.
        Also the groups dropped on the way as too stale."""
        need, dropped_all = self.plan.groups_per_step, []
        while len(self._taken) < need:
            self._raise_if_failed()
            got, dropped = self.queue.take(need - len(self._taken), version, self.plan.max_lag)
            self._taken += got
            dropped_all += dropped
            if dropped:
                self._hand_out(len(dropped))  # replace what the bound threw away
            if len(self._taken) < need:
                if self.exhausted and self.queued_or_in_flight() == 0:
                    break
                self.queue.wait(0.05)
        return self._taken, dropped_all

    def _consume_carried(self, taken: list[DataProto], dropped: list[DataProto], step: int) -> dict[str, float]:
        """Record the carried groups of this step (trained on, or dropped as stale) in the ledger; their counts."""
        counts = {}
        for name, groups in (("trained", taken), ("stale", dropped)):
            uids = [str(g.non_tensor_batch["uid"][0]) for g in groups]
            mine = [u for u in uids if u in self._carried]
            for u in mine:
                self.ledger.consumed[u] = self._carried.pop(u)
            counts[name] = len(mine)
        if counts["stale"]:
            print(f"hybridrl: step {step}: {counts['stale']} sample group(s) read back from the spill files are more "
                  f"than {self.plan.max_lag} updates old (the staleness bound) and are not trained on "
                  "(fully_async/resume/spilled_stale)", flush=True)
        if not (self.carried.groups or self.ledger.consumed):
            return {}
        return {"fully_async/resume/spilled_trained": float(counts["trained"]),
                "fully_async/resume/spilled_stale": float(counts["stale"]),
                "fully_async/resume/spilled_left": float(len(self._carried))}

    def queued_or_in_flight(self) -> int:
        return self.submitted - self.queue.received + len(self.queue)

    # ------------------------------------------------------------------ rollout side
    def _hand_out(self, groups: int) -> None:
        """Submit `groups` new prompts, spread over the rollout replicas."""
        shares: list[list[DataProto]] = [[] for _ in range(self.replicas)]
        left = groups
        while left > 0 and not self.exhausted:
            drawn = self._leftover if self._leftover is not None else self._draw()
            if drawn is None:
                self.exhausted = True
                break
            batch, where = drawn
            self._leftover = (batch[left:], where[left:]) if len(batch) > left else None  # the next window's first
            # step: the one the stream started after (which trainer step takes a group is known only then)
            batch = self.sampler.prepare(batch[:left], self.first - 1, self._draws)
            self._positions.update(zip(map(str, batch.non_tensor_batch["uid"]), where[:left]))
            self._draws += 1
            for i in range(len(batch)):
                shares[self._next_replica].append(batch[i:i + 1])
                self._next_replica = (self._next_replica + 1) % self.replicas
            left -= len(batch)
            self.submitted += len(batch)
        if any(shares):
            self.rollout.submit_prompts([DataProto.concat(s) if s else None for s in shares]).get(self.call_timeout_s)

    def _draw(self) -> Optional[tuple[DataProto, list[Optional[Pos]]]]:
        """The loader's next batch without the prompts that carried or consumed spilled groups answer (spilled.py),
        and each row's position in the loader's order (None when the loader does not say)."""
        for batch in self.prompts:
            epoch, index = batch.meta_info.get("epoch"), batch.meta_info.get("batch_in_epoch")
            if epoch is None or index is None:
                return batch, [None] * len(batch)
            keep = [r for r in range(len(batch)) if (int(epoch), int(index), r) not in self.carried.skip]
            if keep:
                return (batch if len(keep) == len(batch) else batch[keep]), [(int(epoch), int(index), r) for r in keep]
        return None

    def _collect(self) -> None:
        """Collector thread: finished groups into the queue as soon as the workers have them."""
        try:
            while not self._stop.is_set():
                results = self.rollout.take_completed(COLLECT_WAIT_S).get(self.call_timeout_s)
                self.worker_stats = [stats for _, stats in results]
                for groups, _ in results:
                    for group in groups:
                        pos = self._positions.pop(str(group.non_tensor_batch["uid"][0]), None)
                        group.meta_info[POSITION] = list(pos) if pos is not None else None
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
            path = self.queue.spill(self.spill_dir, self._taken, run=self.ledger.run)
        except Exception as e:  # the original failure matters more
            note = f" (writing the {len(self.queue) + len(self._taken)} finished sample groups failed: {e})"
        else:
            note = f"; the finished sample groups were written to {path}" if path else ""
        if note and hasattr(error, "with_note"):
            return error.with_note(note)
        if note:
            print(f"hybridrl: fully async training stopped by {type(error).__name__}{note}", flush=True)
        return error

    def _spill_on_stop(self) -> None:
        """The queued groups (and the last batch's, unless the trainer saved after training it) to a spill file."""
        if self.first > self.last or self._collector is None:
            return
        try:
            path = self.queue.spill(self.spill_dir, [] if self._trained else self._taken, run=self.ledger.run)
        except Exception as e:  # stopping must go on
            print(f"hybridrl: writing the finished sample groups at the stop failed: {type(e).__name__}: {e}", flush=True)
            return
        if path:
            print(f"hybridrl: fully async: the finished sample groups not trained on were written to {path}; a run "
                  "resumed from the last checkpoint trains them first", flush=True)

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

    def loader_state(self) -> dict:
        """The loader's state and the spill ledger, for the checkpoint the trainer saves after training the batch
        last yielded. Prompts in flight at a checkpoint are not generated again on resume; those finished by a
        failure or a stop come back from the spill files."""
        self._trained = True
        return {**self.snapshot(), SPILL_STATE: self.ledger.state()}
