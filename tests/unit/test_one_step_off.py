"""The one-step-off pipeline's order (hybridrl.trainer.one_step_off): generation of step k+1 is launched before
step k is handed to the trainer, on the weights the actor has at that moment, and a checkpoint after step k
records the prompt loader from before the prefetched draw."""
from __future__ import annotations

import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.one_step_off import OneStepOffStream


class FakeLoader:
    def __init__(self, n: int) -> None:
        self.position, self.n = 0, n

    def state_dict(self) -> dict:
        return {"position": self.position}

    def batches(self):
        while self.position < self.n:
            self.position += 1
            yield DataProto.from_dict({"x": torch.full((2, 1), float(self.position))}, meta_info={"epoch": 0})


class FakeSampler:
    """Records each launch with the version the stream asks for and the updates the trainer has done by then."""

    def __init__(self, events: list, trained: dict) -> None:
        self.events, self.trained = events, trained

    def start(self, prompts, step, draw, version):
        assert version == self.trained["updates"], "the stream launched on other weights than the actor's of the moment"
        self.events.append(("launch", step, version))
        return prompts, version

    def finish(self, handle):
        prompts, version = handle
        out = DataProto.from_dict({"x": prompts.batch["x"].clone()}, meta_info={"weight_version": version})
        out.meta_info["metrics"] = {"timing_s/generate": 0.0}
        return out

    def score(self, batch):
        return batch


def run_stream(total_batches: int, steps: int):
    loader, events, trained = FakeLoader(total_batches), [], {"updates": 0}
    stream = OneStepOffStream(loader.batches(), FakeSampler(events, trained), start_step=0, steps=steps,
                              snapshot=loader.state_dict)
    states = []
    for k, rollout in enumerate(stream, start=1):
        events.append(("train", k, int(rollout.batch.batch["x"][0, 0]), rollout.batch.meta_info["weight_version"]))
        trained["updates"] += 1
        states.append(stream.loader_state())
    return events, states


def test_next_generation_starts_before_the_step_trains_on_the_weights_of_the_moment():
    events, _ = run_stream(total_batches=10, steps=3)
    assert events == [
        ("launch", 1, 0),
        ("launch", 2, 0), ("train", 1, 1, 0),   # batch 2 generated on v0 while step 1 trains
        ("launch", 3, 1), ("train", 2, 2, 0),   # after update 1: batch 3 on v1; step 2 trains batch 2 (v0): stale 1
        ("train", 3, 3, 1),                      # last step: nothing prefetched
    ]


def test_checkpoint_state_excludes_the_prefetched_prompts():
    _, states = run_stream(total_batches=10, steps=3)
    # after step 1 the loader has handed out batch 2 too; a resumed run must generate batch 2 again
    assert states[0] == {"position": 1}
    assert states[1] == {"position": 2}
    assert states[2] is None  # nothing drawn ahead: the loader's current state (3) is the right one


def test_stream_ends_when_the_prompts_run_out():
    events, _ = run_stream(total_batches=2, steps=5)
    assert [e for e in events if e[0] == "train"] == [("train", 1, 1, 0), ("train", 2, 2, 0)]


def test_each_sides_idle_time_under_the_fully_async_names():
    from hybridrl.trainer.one_step_off import idle_metrics

    # the rollout generated 6 s of a 10 s launch-to-launch cycle; the trainer waited 1 s of its 8 s cycle
    m = idle_metrics(gen_s=6.0, wait_s=1.0, cycle_s=8.0, launch_to_launch_s=10.0)
    assert m == {"async/overlapped_gen_s": 5.0, "timing_s/trainer_idle": 1.0, "trainer/idle_ratio": 1.0 / 8.0,
                 "rollouter/idle_ratio": 0.4}
    assert "rollouter/idle_ratio" not in idle_metrics(6.0, 1.0, 8.0, None)  # the last batch: no next launch
    assert idle_metrics(6.0, 9.0, 8.0, 4.0)["trainer/idle_ratio"] == 1.0  # clamped, never above 1 or below 0
    assert idle_metrics(6.0, 9.0, 8.0, 4.0)["rollouter/idle_ratio"] == 0.0


def test_the_stream_reports_idle_for_every_step_and_the_rollouts_for_all_but_the_last():
    loader, events, trained = FakeLoader(10), [], {"updates": 0}
    stream = OneStepOffStream(loader.batches(), FakeSampler(events, trained), start_step=0, steps=3,
                              snapshot=loader.state_dict)
    rows = []
    for rollout in stream:
        rows.append(rollout.metrics)
        trained["updates"] += 1
    assert all(0.0 <= r["trainer/idle_ratio"] <= 1.0 and r["timing_s/trainer_idle"] >= 0.0 for r in rows)
    assert ["rollouter/idle_ratio" in r for r in rows] == [True, True, False]
