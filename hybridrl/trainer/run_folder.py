"""trainer.default_local_dir before start-up: never train over another run, never start one that is done.

- resume_mode=disable into a folder that holds a run (global_step_* folders, the latest marker, logs/) is refused,
  naming the two ways out: a new trainer.default_local_dir, or trainer.overwrite_existing_run=true (which deletes
  exactly those entries first). Without this, the new run rewrote global_step_1, left the old global_step_2 beside
  it, moved the marker back and appended its metrics to the old run's metrics.jsonl.
- resume (auto or resume_path) from a step at or past the run's length: one line says so and nothing starts
  (Ray, the workers and the model load cost tens of seconds to train nothing).
Only files are read here (the marker, trainer_state.json, the checksums of the step to resume from).
"""
from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Optional

from hybridrl.config.loader import ConfigError

from .checkpoint_manager import MARKER, find_resume_path, load_trainer_state, step_dirs

logger = logging.getLogger("hybridrl.trainer")
LOGS = "logs"


def run_entries(root: str) -> list[str]:
    """The entries of `root` that a trainer run writes: its step folders, the latest marker and logs/."""
    found = [os.path.basename(p) for p in step_dirs(root).values()]
    found += [name for name in (MARKER, LOGS) if os.path.exists(os.path.join(root, name))]
    return found


def check_run_folder(trainer_cfg: Any) -> Optional[str]:
    """None to go on; the one-line message when the run is already finished. ConfigError for a refusal. Deletes
    nothing: clear_earlier_run does, once the run's inputs are checked too."""
    root = os.path.abspath(os.path.expanduser(trainer_cfg.default_local_dir))
    if trainer_cfg.resume_mode == "disable":
        held = _shown(root)
        if held and not trainer_cfg.overwrite_existing_run:
            raise ConfigError(f"trainer.default_local_dir={root} already holds a run ({held}) and "
                              "trainer.resume_mode=disable would train over it: give a new trainer.default_local_dir, "
                              "or set trainer.overwrite_existing_run=true to delete that run first "
                              "(or trainer.resume_mode=auto to continue it)")
        return None
    path = find_resume_path(trainer_cfg)
    return None if path is None else finished_message(trainer_cfg, path)


def clear_earlier_run(trainer_cfg: Any, rank: int = 0) -> None:
    """resume_mode=disable with overwrite_existing_run=true: delete the earlier run's entries (run_entries) only."""
    root = os.path.abspath(os.path.expanduser(trainer_cfg.default_local_dir))
    held = sorted(run_entries(root))
    if trainer_cfg.resume_mode != "disable" or not trainer_cfg.overwrite_existing_run or not held or rank != 0:
        return  # torchrun: every rank runs this; rank 0 deletes
    logger.warning("trainer.overwrite_existing_run=true: deleting the earlier run in %s (%s)", root, _shown(root))
    for name in held:
        path = os.path.join(root, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)


def _shown(root: str) -> str:
    held = sorted(run_entries(root))
    return ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")


def finished_message(trainer_cfg: Any, step_dir: str) -> Optional[str]:
    state = load_trainer_state(step_dir)
    total = trainer_cfg.total_training_steps or _recorded_total(state.extra, trainer_cfg)
    if total is None or state.global_step < total:
        return None
    return (f"hybridrl: the run in {os.path.dirname(step_dir)} is finished ({step_dir} is step {state.global_step} "
            f"of {total}); nothing to train. To go on, raise trainer.total_training_steps; to start again, give a new "
            "trainer.default_local_dir")


def _recorded_total(extra: dict, trainer_cfg: Any) -> Optional[int]:
    """Without total_training_steps the length is epochs x batches: trust the one the save recorded only if the
    epochs asked for now are the same."""
    if extra.get("total_epochs") == trainer_cfg.total_epochs and extra.get("total_training_steps") is None:
        return extra.get("total_steps")
    return None
