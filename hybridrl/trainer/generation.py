"""Where the trainer's generate calls go: the colocated hybrid engine, or rollout workers of their own.

Both answer `start(prompts, version)` (a handle) and `finish(handle)` (the samples), so a pipeline can start the
next generation before training on the last one. `version` is the number of actor updates done so far: the
split placement broadcasts the actor's weights first unless the rollout already holds that version, and each
batch carries meta_info["weight_version"], the version it was generated with.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from hybridrl.controller import WorkerDiedError, WorkerError
from hybridrl.protocol import DataProto

DEATH_GRACE_S = 10.0  # how long a failed broadcast waits to learn whether a peer died (Ray reports it soon)


class _Generation:
    def start(self, prompts: DataProto, version: int) -> Any:
        raise NotImplementedError

    def finish(self, handle: Any) -> DataProto:
        raise NotImplementedError

    def generate_sequences(self, prompts: DataProto, version: int) -> DataProto:
        """start + finish: for callers that wait for their samples (validation, ReMax's baselines)."""
        return self.finish(self.start(prompts, version))


class ColocatedGeneration(_Generation):
    """The hybrid engine: every generate call syncs the actor's current weights in place (hybridrl.hybrid)."""

    def __init__(self, actor_group: Any) -> None:
        self.actor = actor_group

    def start(self, prompts: DataProto, version: int) -> Any:
        out = self.actor.generate_sequences(prompts)  # synchronous: the engine shares the actor's GPUs
        out.meta_info["weight_version"] = version
        return out

    def finish(self, handle: Any) -> DataProto:
        return handle


class SplitGeneration(_Generation):
    """Rollout workers on their own GPUs (hybridrl.workers.rollout): weights arrive by broadcast from actor rank 0."""

    def __init__(self, actor_group: Any, rollout_group: Any) -> None:
        self.actor, self.rollout = actor_group, rollout_group
        self.version: Optional[int] = None  # what the rollout holds

    @classmethod
    def connect(cls, actor_group: Any, rollout_group: Any) -> "SplitGeneration":
        """Open the broadcast group (actor rank 0 + every rollout rank) and send the initial weights."""
        addr, port = actor_group.weight_broadcast_address()
        world = 1 + rollout_group.world_size
        joins = [actor_group.join_weight_broadcast(addr, port, world),
                 rollout_group.join_weight_broadcast(addr, port, world)]
        for future in joins:
            future.get()
        split = cls(actor_group, rollout_group)
        split.push(0)
        return split

    def push(self, version: int) -> dict[str, float]:
        """Broadcast the actor's weights (after `version` updates) unless the rollout has them; metrics of the push."""
        if self.version == version:
            return {}
        start = time.perf_counter()
        sent, received = self.actor.broadcast_weights(version), self.rollout.receive_weights(version)
        metrics = dict(_root_cause(sent, received)[0])
        per_rank = received.get()
        metrics["sync_check/max_rel_diff"] = max((m.get("sync_check/max_rel_diff", 0.0) for m in per_rank), default=0.0)
        metrics["timing_s/weight_receive"] = max(m["timing_s/weight_receive"] for m in per_rank)
        metrics["timing_s/weight_push"] = time.perf_counter() - start
        self.version = version
        return metrics

    def start(self, prompts: DataProto, version: int) -> Any:
        pushed = self.push(version)
        return self.rollout.generate_sequences(prompts), pushed

    def finish(self, handle: Any) -> DataProto:
        future, pushed = handle
        out = future.get()
        out.meta_info.setdefault("metrics", {}).update(pushed)
        return out


def _root_cause(sender: Any, receivers: Any) -> Any:
    """The sender's result; when its broadcast failed because a rollout worker died, the death is raised
    (it names the rank and pid), not the sender's collective error that followed from it."""
    try:
        return sender.get()
    except WorkerDiedError:
        raise
    except WorkerError as failed:
        try:
            receivers.get(timeout=DEATH_GRACE_S)
        except WorkerDiedError as died:
            raise died from failed
        except WorkerError:
            pass
        raise
