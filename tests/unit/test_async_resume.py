"""Fully async resume (hybridrl.trainer.spilled, FullyAsyncStream): the finished groups a failed or stopped run spilled
are trained by the resumed run exactly once, under the staleness bound, and never again by a later resume.

The stream runs on fakes: a loader of numbered prompts, a rollout that finishes every group at once with the version
pushed last, a sampler that only adds group ids. The test keeps its own books (which uid and which prompt each
trained batch held, which groups each spill file holds) and checks the stream against them.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import torch

from hybridrl.config.async_checks import AsyncPlan
from hybridrl.protocol import DataProto
from hybridrl.rollout.async_queue import SampleQueue, SpillFileError, load_spilled, read_spill
from hybridrl.rollout.continuous import VERSIONS_KEY
from hybridrl.trainer import batch_ops
from hybridrl.trainer.fully_async import FullyAsyncStream
from hybridrl.trainer.spilled import POSITION, SpillLedger, carry, spill_files
from hybridrl.utils.durable import write_new

G = 4  # groups (prompts) a step
STATS = {"busy_s": 0.0, "alive_s": 1.0, "restarted_samples": 0, "sync_pause_s": 0.0}


class Done:
    def __init__(self, value=None) -> None:
        self.value = value

    def get(self, timeout=None):
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


class FakeRollout:
    world_size = 1

    def __init__(self) -> None:
        self.version, self.done = -1, []
        self.lock = threading.Lock()

    def start_continuous(self) -> None:
        pass

    def stop_continuous(self) -> None:
        pass

    def submit_prompts(self, shares):
        for share in shares:
            for i in range(len(share) if share is not None else 0):
                row = share[i:i + 1]
                nt = {k: np.array([row.non_tensor_batch[k][0]] * 2, dtype=object) for k in ("uid", "index")}
                with self.lock:
                    self.done.append(DataProto.from_dict({VERSIONS_KEY: torch.full((2, 3), self.version)}, nt))
        return Done()

    def take_completed(self, wait_s):
        time.sleep(0.002)
        with self.lock:
            out, self.done = self.done, []
        return Done([(out, STATS)])


class FakeSplit:
    def __init__(self) -> None:
        self.rollout = FakeRollout()

    def push(self, version: int) -> dict:
        self.rollout.version = version
        return {}


class FakeSampler:
    """Scoring fails at step `fail_at`, once `ready()` (the groups handed out for that step are queued)."""

    temperature = 1.0

    def __init__(self, fail_at=None, ready=None) -> None:
        self.fail_at, self.ready = fail_at, ready

    def prepare(self, prompts, step, draw):
        return batch_ops.add_group_ids(prompts)

    def score(self, batch):
        if batch.meta_info["step"] == self.fail_at:
            deadline = time.monotonic() + 30
            while not self.ready() and time.monotonic() < deadline:
                time.sleep(0.005)
            raise RuntimeError("the reward function failed")
        return batch


class Loader:
    """Prompts numbered 0, 1, 2, ... in batches of G; state (epoch, position) as PromptLoader keeps it."""

    def __init__(self, state: dict | None = None) -> None:
        self.epoch, self.position = (state["epoch"], state["position"]) if state else (0, 0)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def batches(self):
        while True:
            first = self.position * G
            self.position += 1
            yield DataProto.from_dict(non_tensors={"index": np.arange(first, first + G).astype(object)},
                                      meta_info={"epoch": 0, "batch_in_epoch": self.position - 1})


def plan(staleness: float) -> AsyncPlan:
    return AsyncPlan(G, 1, staleness, True, 1, "async_queue")


def run(folder, *, start: int, steps: int, staleness: float, resume: dict | None, save_at=(), fail_at=None,
        stop_after=None):
    """One run of the stream as PPOTrainer.fit drives it; per step the trained uids/prompts/versions and metrics,
    and the checkpoints' loader states."""
    loader, split = Loader(resume), FakeSplit()
    carried = None
    ledger = SpillLedger.from_loader_state(resume)
    if resume is not None:
        carried = carry(folder, ledger, (resume["epoch"], resume["position"]), start)
    sampler = FakeSampler(fail_at, lambda: len(stream.queue) >= G)
    stream = FullyAsyncStream(loader.batches(), split, sampler, plan(staleness), start_step=start, steps=steps,
                              spill_dir=folder, call_timeout_s=10, snapshot=loader.state_dict, carried=carried)
    out = {"steps": {}, "saved": {}, "carried": carried}
    step = start
    try:
        for rollout in stream:
            step += 1
            b = rollout.batch
            out["steps"][step] = {"uids": set(b.non_tensor_batch["uid"]), "prompts": list(dict.fromkeys(
                b.non_tensor_batch["index"])), "versions": b.batch[VERSIONS_KEY], "metrics": rollout.metrics}
            if step in save_at:
                out["saved"][step] = stream.loader_state()
            if step == stop_after:  # a signal: the step is saved, the stream is closed
                deadline = time.monotonic() + 30
                while stream.submitted > stream.queue.received and time.monotonic() < deadline:
                    time.sleep(0.005)  # the groups in flight finish first (else they are lost, as in a real stop)
                break
    except RuntimeError as e:
        out["error"] = e
    return out


def groups_by_uid(path: str) -> dict[str, DataProto]:
    return {str(g.non_tensor_batch["uid"][0]): g for g in load_spilled(path)}


def test_spilled_groups_are_trained_once_across_resumes(tmp_path):
    folder = str(tmp_path / "async_queue")
    # run 1 (staleness_threshold 1, a sync every step: at most 1 update old): checkpoint after step 2; scoring fails
    # in step 4, once the prompts handed out for it are finished (update 3 is lost with the run)
    r1 = run(folder, start=0, steps=10, staleness=1.0, resume=None, save_at=(2,), fail_at=4)
    assert "reward function" in str(r1["error"]) and list(r1["steps"]) == [1, 2, 3]
    [f1] = spill_files(folder)
    spill1 = groups_by_uid(f1)
    assert len(spill1) == 2 * G and read_spill(f1)[0] == r1["saved"][2]["fully_async_spill"]["run"]
    assert max(int(g.batch[VERSIONS_KEY].max()) for g in spill1.values()) == 3  # newer than the checkpoint's 2
    # run 2 resumes from step 2, saves after step 5 and is stopped there (a signal)
    r2 = run(folder, start=2, steps=8, staleness=1.0, resume=r1["saved"][2], save_at=(5,), stop_after=5)
    c2 = r2["carried"]
    assert [str(g.non_tensor_batch["uid"][0]) for g in c2.groups] == list(spill1) and c2.files == [f1]
    # the spilled prompts were handed out after the checkpoint (its loader stood at batch 3): not drawn again
    loader_at = r1["saved"][2]["position"]
    assert c2.skip == {tuple(g.meta_info[POSITION]) for g in spill1.values()} and loader_at == 3
    assert all(g.meta_info[POSITION][1] >= loader_at for g in spill1.values())
    # step 3 trains the version-2 half; the version-3 half counts as 1 (2*2-3): 2 updates old at step 4, stale
    assert r2["steps"][3]["uids"] == {u for u, g in spill1.items() if int(g.batch[VERSIONS_KEY].max()) == 2}
    assert r2["steps"][4]["metrics"]["fully_async/resume/spilled_stale"] == G
    f2 = [f for f in spill_files(folder) if f != f1]
    assert len(f2) == 1, "the stop writes the groups still queued"
    spill2 = groups_by_uid(f2[0])
    # run 3 resumes from step 5 and runs to the end
    r3 = run(folder, start=5, steps=5, staleness=1.0, resume=r2["saved"][5])
    assert "error" not in r3 and list(r3["steps"]) == [6, 7, 8, 9, 10]
    assert {str(g.non_tensor_batch["uid"][0]) for g in r3["carried"].groups} == set(spill2)

    lineage = {**{s: v for s, v in r1["steps"].items() if s <= 2}, **r2["steps"], **r3["steps"]}
    assert sorted(lineage) == list(range(1, 11))
    uids = [u for v in lineage.values() for u in v["uids"]]
    prompts = [p for v in lineage.values() for p in v["prompts"]]
    assert len(uids) == len(set(uids)) and len(prompts) == len(set(prompts)), "a group or a prompt trained twice"
    spilled = set(spill1) | set(spill2)
    trained = spilled & set(uids)
    metric = {k: sum(v["metrics"].get(f"fully_async/resume/spilled_{k}", 0.0) for v in lineage.values())
              for k in ("trained", "stale")}
    assert metric["trained"] == len(trained) > G and metric["stale"] >= G
    assert len(trained) + metric["stale"] == len(spilled), "a spilled group neither trained nor counted stale"
    assert r3["steps"][10]["metrics"]["fully_async/resume/spilled_left"] == 0.0
    # spilled groups run 2 consumed before its checkpoint are not carried by run 3
    consumed = set(r2["saved"][5]["fully_async_spill"]["consumed"])
    assert consumed and not consumed & {str(g.non_tensor_batch["uid"][0]) for g in r3["carried"].groups}
    for step, v in lineage.items():  # the bound holds on the rebased versions too
        made = v["versions"][v["versions"] >= 0]
        assert step - 1 - int(made.min()) <= 1, step
    assert len(load_spilled(f1)) == len(spill1) and spill_files(folder) == sorted([f1, f2[0]])  # nothing replaced


def group(uid: str, versions: list[int], pos) -> DataProto:
    v = torch.tensor([versions, versions])
    return DataProto.from_dict({VERSIONS_KEY: v}, {"uid": np.array([uid, uid], dtype=object)}, {POSITION: pos})


def test_carry_dedups_skips_rebases_and_keeps_to_its_run(tmp_path):
    folder = str(tmp_path)
    q = SampleQueue(8)
    for g in (group("a", [0, 1, -1], [0, 1, 0]), group("b", [1, 3, 4], [0, 3, 2]), group("c", [2, 2, 2], None)):
        q.put(g)
    first = q.spill(folder, run="r1")
    q.take(1, trainer_version=0, max_lag=10)  # "a" leaves; "b" and "c" are spilled again by a later failure
    second = q.spill(folder, run="r1")
    q.spill(folder, run="someone-else")
    assert len({first, second}) == 2 and len(spill_files(folder)) == 3
    out = carry(folder, SpillLedger("r1", {"c": [0, 5, 1], "z": [0, 0, 0]}), loader_at=(0, 2), version=2)
    assert [str(g.non_tensor_batch["uid"][0]) for g in out.groups] == ["a", "b"]
    assert out.skip == {(0, 3, 2), (0, 5, 1)}  # "b" and the consumed "c" answer prompts not drawn yet; "z", "a" drawn
    assert out.groups[1].batch[VERSIONS_KEY][0].tolist() == [1, 1, 0]  # 3 -> 2*2-3, 4 -> 0
    assert out.groups[0].batch[VERSIONS_KEY][0].tolist() == [0, 1, -1]
    assert out.files == sorted([first, second]) and len(out.others) == 1


def test_a_damaged_spill_file_is_named(tmp_path):
    q = SampleQueue(4)
    q.put(group("a", [0, 0, 0], None))
    path = q.spill(str(tmp_path), run="r1")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(SpillFileError, match=path):
        carry(str(tmp_path), SpillLedger("r1"), (0, 0), 0)


def test_a_spill_never_replaces_a_file(tmp_path):
    mine = tmp_path / "samples_x.safetensors"
    mine.write_bytes(b"the user's")
    path = write_new(str(tmp_path), "samples_x", ".safetensors", b"new")
    assert path.endswith("samples_x_1.safetensors") and mine.read_bytes() == b"the user's"
    assert sorted(os.listdir(tmp_path)) == ["samples_x.safetensors", "samples_x_1.safetensors"]
