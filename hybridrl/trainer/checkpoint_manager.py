"""The trainer's checkpoint folder, verl's layout, with a commit protocol that survives a crash mid-save.

    {default_local_dir}/
      latest_checkpointed_iteration.txt   the step of the newest COMPLETE save (the commit point)
      global_step_{N}/
        actor/  critic/                   written by the part callables (Megatron dist checkpoints)
        trainer_state.json                global step, dataloader + KL controller state, driver RNG
        trainer_state.safetensors         tensors found in that state (only if there are any)
        config.yaml                       the resolved job config, secrets redacted
        .complete                         written last: the folder is whole; lists every file of the
                                          step with its size and CRC-32 (checkpoint_files.py), which
                                          auto resume verifies (.pruned instead once prune removed a part)

Save order: parts -> trainer state -> config -> fsync everything -> `.complete` -> marker. Each file
we write goes to a temporary name, is fsynced and os.replace'd, and its folder is fsynced, so a kill at
any instant leaves either the previous marker (still naming a complete folder) or the new one. A folder
without `.complete` is never resumed from. State is JSON (+ safetensors for tensors), never pickle:
loading a checkpoint must not run code.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import random
import re
import shutil
import time
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch
import yaml

from hybridrl.config.loader import ConfigError, to_dict
from hybridrl.utils.durable import atomic_write, fsync_dir, fsync_tree

from .checkpoint_files import PRUNED, SENTINEL, file_manifest, first_damage
from .tracking import redact

logger = logging.getLogger("hybridrl.checkpoint")
MARKER = "latest_checkpointed_iteration.txt"
# SENTINEL (.complete): the folder is whole; PRUNED replaces it once prune removed a part (not resumable now)
STATE_JSON = "trainer_state.json"
STATE_TENSORS = "trainer_state.safetensors"
CONFIG_YAML = "config.yaml"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")

SavePart = Callable[[str], Any]  # called with the part's folder; returns once its files are written


class CheckpointError(RuntimeError):
    """A save that did not complete (a part failed) or a checkpoint that cannot be loaded."""


# ------------------------------------------------------------------------------------------ atomic files
# ------------------------------------------------------------------------------------------ state codec
def encode_state(obj: Any, tensors: dict[str, torch.Tensor], path: str = "state") -> Any:
    """A JSON-able tree: tensors/arrays move to `tensors` (saved as safetensors) and leave a reference;
    tuples, bytes and non-string dict keys are tagged so decode_state restores them exactly."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        is_numpy = isinstance(obj, np.ndarray)
        tensors[path] = (torch.from_numpy(np.ascontiguousarray(obj)) if is_numpy else obj.detach().cpu()).contiguous()
        return {"__tensor__": path, "numpy": is_numpy}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, bytes):
        return {"__bytes__": base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode_state(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode_state(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode_state(v, tensors, f"{path}.{k}") for k, v in obj.items()}
        return {"__items__": [[encode_state(k, tensors, f"{path}.k{i}"), encode_state(v, tensors, f"{path}.{i}")]
                              for i, (k, v) in enumerate(obj.items())]}
    raise TypeError(f"{path}: cannot store a {type(obj).__name__} in trainer_state (JSON and tensors only, never pickle)")


def decode_state(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [decode_state(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        t = tensors[obj["__tensor__"]]
        return t.numpy() if obj.get("numpy") else t
    if "__bytes__" in obj:
        return base64.b64decode(obj["__bytes__"])
    if "__tuple__" in obj:
        return tuple(decode_state(v, tensors) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {decode_state(k, tensors): decode_state(v, tensors) for k, v in obj["__items__"]}
    return {k: decode_state(v, tensors) for k, v in obj.items()}


def capture_rng_state() -> dict[str, Any]:
    """The driver's Python, numpy and torch (CPU, and CUDA if initialised) generator states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclasses.dataclass
class TrainerState:
    """What the driver needs besides the model parts to continue exactly where it stopped."""

    global_step: int
    dataloader: dict = dataclasses.field(default_factory=dict)  # StatefulDataLoader.state_dict()
    kl_ctrl: dict = dataclasses.field(default_factory=dict)  # e.g. {"value": current beta}
    rng: dict = dataclasses.field(default_factory=capture_rng_state)
    extra: dict = dataclasses.field(default_factory=dict)


def write_trainer_state(folder: str, state: TrainerState) -> None:
    from safetensors.torch import save as save_tensors

    tensors: dict[str, torch.Tensor] = {}
    tree = encode_state(dataclasses.asdict(state), tensors)
    if tensors:  # the JSON refers to these, so they land first
        atomic_write(os.path.join(folder, STATE_TENSORS), save_tensors(tensors))
    atomic_write(os.path.join(folder, STATE_JSON), json.dumps(tree, indent=1).encode())


def load_trainer_state(step_dir: str) -> TrainerState:
    """TrainerState of a complete step folder (CheckpointError otherwise)."""
    from safetensors.torch import load_file

    if not is_complete(step_dir):
        raise CheckpointError(f"{step_dir}: not a complete checkpoint (no {SENTINEL}); it was interrupted mid-save")
    path = os.path.join(step_dir, STATE_JSON)
    try:
        with open(path) as f:
            tree = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable ({type(e).__name__}: {e}); resume from an earlier "
                              "global_step_N with trainer.resume_mode=resume_path") from None
    tensor_file = os.path.join(step_dir, STATE_TENSORS)
    tensors = load_file(tensor_file) if os.path.exists(tensor_file) else {}
    return TrainerState(**decode_state(tree, tensors))


# ------------------------------------------------------------------------------------------ folder queries
def step_of(path: str) -> Optional[int]:
    m = _STEP_DIR.match(os.path.basename(os.path.normpath(path)))
    return int(m.group(1)) if m else None


def is_complete(step_dir: str) -> bool:
    return os.path.isfile(os.path.join(step_dir, SENTINEL))


def is_pruned(step_dir: str) -> bool:
    return os.path.isfile(os.path.join(step_dir, PRUNED))


def read_marker(root: str) -> Optional[int]:
    """The step named by the marker, or None when there is none (or it is unreadable)."""
    try:
        with open(os.path.join(root, MARKER)) as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None


def step_dirs(root: str) -> dict[int, str]:
    """{step: folder} of every global_step_N folder under root, complete or not."""
    if not os.path.isdir(root):
        return {}
    found = {step_of(n): os.path.join(root, n) for n in os.listdir(root)}
    found.pop(None, None)  # other files: the marker, logs/
    return {s: p for s, p in sorted(found.items()) if os.path.isdir(p)}


def complete_steps(root: str) -> list[int]:
    return [s for s, p in step_dirs(root).items() if is_complete(p)]


# ------------------------------------------------------------------------------------------ manager
class CheckpointManager:
    """Saves step folders under `root` (trainer.default_local_dir) and prunes old ones."""

    def __init__(self, root: str, config: Any = None, keep_actor: Optional[int] = None,
                 keep_critic: Optional[int] = None, fsync_files: bool = True) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.config = config
        self.keep_actor, self.keep_critic = keep_actor, keep_critic
        self.fsync_files = fsync_files

    @classmethod
    def from_config(cls, trainer_cfg: Any, config: Any = None) -> "CheckpointManager":
        return cls(trainer_cfg.default_local_dir, config, trainer_cfg.max_actor_ckpt_to_keep,
                   trainer_cfg.max_critic_ckpt_to_keep)

    def step_dir(self, step: int) -> str:
        return os.path.join(self.root, f"global_step_{step}")

    def save(self, step: int, parts: Mapping[str, SavePart], state: TrainerState) -> str:
        """Save every part, then the trainer state and config; commit with `.complete` and the marker.

        `parts` maps a folder name ("actor", "critic") to a callable that writes into that folder and
        returns when done (returning False or raising marks the save failed: no sentinel, no marker).
        Prunes per keep_actor/keep_critic after the commit. Returns the step folder. Saving a step that
        already has a folder starts it afresh (uncommitted first); if that was the marker's step and the
        save dies, resume_mode=auto falls back to the newest complete folder."""
        folder = self.step_dir(step)
        self._clear(folder)
        for name, save_part in parts.items():
            part_dir = os.path.join(folder, name)
            os.makedirs(part_dir, exist_ok=True)
            try:
                done = save_part(part_dir)
            except Exception as e:
                raise CheckpointError(f"checkpoint step {step}: saving {name} failed: {e}") from e
            if done is False:
                raise CheckpointError(f"checkpoint step {step}: saving {name} reported failure")
        write_trainer_state(folder, state)
        self._write_config(folder)
        if self.fsync_files:
            fsync_tree(folder)
        # what the folder holds now, so that a later truncation or loss is named, not met as an EOFError
        meta = {"step": step, "parts": sorted(parts), "time": time.time(), "files": file_manifest(folder)}
        atomic_write(os.path.join(folder, SENTINEL), json.dumps(meta).encode())
        atomic_write(os.path.join(self.root, MARKER), f"{step}\n".encode())
        self.prune(self.keep_actor, self.keep_critic)
        return folder

    def _clear(self, folder: str) -> None:
        """Start a step folder afresh. The sentinel goes first (and durably), so a crash while the old
        contents are deleted leaves an incomplete folder, not a complete-looking mix."""
        os.makedirs(self.root, exist_ok=True)
        if os.path.exists(folder):
            self._uncommit(folder)
            shutil.rmtree(folder)
        os.makedirs(folder)
        fsync_dir(self.root)

    def _uncommit(self, folder: str) -> None:
        for name in (SENTINEL, PRUNED):
            if os.path.exists(os.path.join(folder, name)):
                os.unlink(os.path.join(folder, name))
                fsync_dir(folder)

    def _write_config(self, folder: str) -> None:
        if self.config is None:
            return
        tree = self.config if isinstance(self.config, Mapping) else to_dict(self.config)
        text = yaml.safe_dump(redact(tree), sort_keys=False, default_flow_style=False)
        atomic_write(os.path.join(folder, CONFIG_YAML), text.encode())

    def prune(self, keep_actor: Optional[int], keep_critic: Optional[int]) -> list[str]:
        """Delete old parts: only the newest `keep_actor` saved folders keep actor/, the newest
        `keep_critic` keep critic/ (None or <= 0: keep all). A folder losing a part first has its
        `.complete` renamed to `.pruned` (it still counts for the ranking, but is never resumed from);
        one left with no part is removed, as are interrupted saves older than the marker's step. The
        marker's folder is never touched. Returns the paths deleted."""
        marker = read_marker(self.root)
        folders = step_dirs(self.root)
        saved = sorted((s for s, p in folders.items() if is_complete(p) or is_pruned(p)), reverse=True)
        deleted: list[str] = []
        limits = (("actor", keep_actor), ("critic", keep_critic))
        for rank, step in enumerate(saved):
            if step != marker:
                deleted += self._drop_parts(folders[step], [n for n, keep in limits if keep and 0 < keep <= rank])
        for step, folder in folders.items():
            interrupted = os.path.isdir(folder) and not (is_complete(folder) or is_pruned(folder))
            if marker is not None and step < marker and interrupted:
                shutil.rmtree(folder)
                deleted.append(folder)
        return deleted

    def _drop_parts(self, folder: str, names: list[str]) -> list[str]:
        present = [n for n in names if os.path.isdir(os.path.join(folder, n))]
        if not present:
            return []
        if is_complete(folder):  # atomically: complete -> pruned, before anything is deleted
            os.replace(os.path.join(folder, SENTINEL), os.path.join(folder, PRUNED))
            fsync_dir(folder)
        deleted = []
        for name in present:
            shutil.rmtree(os.path.join(folder, name))
            deleted.append(os.path.join(folder, name))
        if not any(os.path.isdir(os.path.join(folder, n)) for n in os.listdir(folder)):
            shutil.rmtree(folder)
            deleted.append(folder)
        return deleted


# ------------------------------------------------------------------------------------------ resume
def find_resume_path(trainer_cfg: Any) -> Optional[str]:
    """The step folder to resume from, per trainer.resume_mode:
    disable -> None; auto -> the marker's folder if complete, else (with a warning) the newest complete
    one, None when there is none; resume_path -> trainer.resume_from_path, which must be complete."""
    mode = trainer_cfg.resume_mode
    if mode == "disable":
        return None
    if mode == "resume_path":
        return _explicit_resume_path(trainer_cfg.resume_from_path)
    if mode != "auto":
        raise ConfigError(f"trainer.resume_mode={mode!r}: expected auto, disable or resume_path")
    return _auto_resume_path(os.path.abspath(os.path.expanduser(trainer_cfg.default_local_dir)))


def _explicit_resume_path(path: Optional[str]) -> str:
    if not path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N folder)")
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise ConfigError(f"trainer.resume_from_path={path}: no such folder")
    if not is_complete(path):
        hint = "" if step_of(path) is not None else " (it should be a global_step_N folder)"
        raise ConfigError(f"trainer.resume_from_path={path}: not a complete checkpoint, no {SENTINEL} "
                          f"in it; the save was interrupted or this is not a step folder{hint}")
    damage = first_damage(path)
    if damage:
        raise ConfigError(f"trainer.resume_from_path={path}: damaged checkpoint: {damage}; "
                          "give an earlier global_step_N folder")
    return path


def _auto_resume_path(root: str) -> Optional[str]:
    """The marker's step if it is complete and intact; else the newest complete, intact one, said in one line
    naming the step skipped and why; None (start afresh) when nothing was ever completed."""
    marker, complete = read_marker(root), complete_steps(root)
    if marker is not None and marker not in complete:
        why = f"{root}/{MARKER} names step {marker}, which is incomplete or missing"
    elif marker is None and complete:
        why = f"{root}/{MARKER} is missing"
    else:
        why = None
    damaged = []
    for step in sorted(complete, reverse=True):
        if marker is not None and step > marker and why is None:
            continue  # a save newer than the commit point: never resumed from
        folder = os.path.join(root, f"global_step_{step}")
        damage = first_damage(folder)
        if damage is None:
            if why or damaged:
                logger.warning("%s; resuming from %s, the newest intact checkpoint",
                               "; ".join(([why] if why else []) + damaged), folder)
            return folder
        damaged.append(f"step {step} is damaged ({damage})")
    if damaged:
        raise ConfigError(f"{root}: no intact checkpoint to resume from: {'; '.join(damaged)}. Resume from another "
                          "folder (trainer.resume_mode=resume_path), or start afresh in a new trainer.default_local_dir")
    if marker is not None:
        logger.warning("%s/%s names step %s but no complete checkpoint exists; starting fresh", root, MARKER, marker)
    return None
