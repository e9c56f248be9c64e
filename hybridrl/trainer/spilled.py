"""Fully async mode: the finished sample groups a failed or stopped run wrote to disk, trained on when it resumes.

FullyAsyncStream writes the groups it holds when the run fails or stops early (SampleQueue.spill, into
{default_local_dir}/{async_training.queue_samples_dir}/samples_*.safetensors, never over a file). Their prompts were
handed out already: the checkpoint's loader state counts them as drawn, so unless they are read back they are lost.

  ledger    the run's id and the spilled groups consumed so far, {uid: prompt position}: trained, or dropped as
            older than the staleness bound. Each checkpoint records it in its loader state (SPILL_STATE), so a
            later resume never takes them again; no spill file is changed or deleted.
  carried   on resume: every group of the spill files this run wrote (tagged with its id), oldest file first, one
            copy per uid, minus the ledger's. The trainer takes them before any new group, under the same
            staleness bound; those past it are dropped, counted and reported (fully_async/resume/spilled_stale).
  skip      a group whose prompt the checkpoint's loader had not handed out yet (drawn after the checkpoint, before
            the failure) answers that prompt: the loader's batch comes without it, so no prompt is trained twice.
  versions  tokens sampled by weights newer than the checkpoint's (version k) come from updates the resumed run
            discards: version v > k counts as 2k - v, so a group's lag is its distance from the trainer's weights
            through the checkpoint's (at least 0: -1 marks tokens no policy sampled; a spill more than k updates
            past its checkpoint, which only an older checkpoint than the newest can give, counts a little fresher).

A damaged spill file stops the resume with its path (SpillFileError): skipping it would lose its samples and
their prompts (the loader counts them as drawn) without the user deciding to; moving the file out of the folder
is that decision, and the run then goes on without it.
"""
from __future__ import annotations

import glob
import os
import uuid
from dataclasses import dataclass, field
from typing import Optional

import torch

from hybridrl.protocol import DataProto
from hybridrl.rollout.async_queue import read_spill, version_span
from hybridrl.rollout.continuous import VERSIONS_KEY

SPILL_STATE = "fully_async_spill"  # key of the ledger in a checkpoint's loader state
POSITION = "prompt_pos"  # a spilled group's meta_info: [epoch, batch in epoch, row] of its prompt in the loader
Pos = tuple[int, int, int]


@dataclass
class SpillLedger:
    run: str  # this run's id: its spill files carry it, resumes continue it
    consumed: dict[str, Optional[list[int]]] = field(default_factory=dict)  # uid -> prompt position (None: unknown)

    @classmethod
    def from_loader_state(cls, state: Optional[dict]) -> "SpillLedger":
        """The ledger a checkpoint's loader state holds; a new run id when it holds none (a fresh start)."""
        saved = (state or {}).get(SPILL_STATE)
        if not saved:
            return cls(uuid.uuid4().hex)
        return cls(str(saved["run"]), {str(k): v for k, v in saved["consumed"].items()})

    def state(self) -> dict:
        return {"run": self.run, "consumed": dict(self.consumed)}


@dataclass
class Carried:
    """What a resumed run trains first, the prompts it draws no more, and the ledger it goes on with."""

    ledger: SpillLedger
    groups: list[DataProto] = field(default_factory=list)
    skip: set[Pos] = field(default_factory=set)
    files: list[str] = field(default_factory=list)  # this run's spill files
    others: list[str] = field(default_factory=list)  # spill files of other runs (or from before runs were tagged)

    @property
    def uids(self) -> dict[str, Optional[list[int]]]:
        return {str(g.non_tensor_batch["uid"][0]): g.meta_info.get(POSITION) for g in self.groups}

    def report(self, folder: str, version: int, max_lag: int) -> list[str]:
        """What the resume found, for the log."""
        out = []
        if self.others:
            out.append(f"{len(self.others)} spill file(s) in {folder} come from another run and are left as they are: "
                       + ", ".join(self.others))
        if self.files:
            oldest = [version_span(g)[0] for g in self.groups]
            stale = sum(1 for v in oldest if v >= 0 and version - v > max_lag)
            out.append(f"{len(self.groups)} finished sample group(s) from {len(self.files)} spill file(s) in {folder} "
                       f"are trained first ({stale} already more than {max_lag} updates old: counted in "
                       f"fully_async/resume/spilled_stale, not trained on); {len(self.ledger.consumed)} were consumed "
                       "before this checkpoint")
        return out


def spill_files(folder: str) -> list[str]:
    """The spill files in `folder`, oldest first (their names start with the time they were written)."""
    return sorted(glob.glob(os.path.join(glob.escape(folder), "samples_*.safetensors")), key=os.path.basename)


def carry(folder: str, ledger: SpillLedger, loader_at: tuple[int, int], version: int) -> Carried:
    """The groups of this run's spill files in `folder` not in `ledger`, their versions rebased on `version` (the
    resumed checkpoint's), and the prompt positions at or past `loader_at` ((epoch, batch) the loader stands at)
    that carried or consumed groups answer. SpillFileError names a damaged file."""
    out = Carried(ledger)
    seen = set(ledger.consumed)
    for pos in ledger.consumed.values():
        if pos is not None and tuple(pos[:2]) >= loader_at:
            out.skip.add(_pos(pos))
    for path in spill_files(folder):
        run, groups = read_spill(path)
        if run != ledger.run:
            out.others.append(path)
            continue
        out.files.append(path)
        for group in groups:
            uid = str(group.non_tensor_batch["uid"][0])
            if uid in seen:  # consumed before the checkpoint, or a copy a later spill made of a carried group
                continue
            seen.add(uid)
            pos = group.meta_info.get(POSITION)
            if pos is not None and tuple(pos[:2]) >= loader_at:
                out.skip.add(_pos(pos))
            out.groups.append(rebase_versions(group, version))
    return out


def rebase_versions(group: DataProto, version: int) -> DataProto:
    """Token versions newer than `version` (weights the resumed run never had) -> 2 * version - v (module doc)."""
    v = group.batch[VERSIONS_KEY]
    if bool((v > version).any()):
        group.batch[VERSIONS_KEY] = torch.where(v > version, (2 * version - v).clamp(min=0), v)
    return group


def _pos(pos: list[int]) -> Pos:
    return int(pos[0]), int(pos[1]), int(pos[2])
