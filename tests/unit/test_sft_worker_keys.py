"""The SFT worker runs the RL workers' shared set-up (hybridrl/workers/common.py): every trainer key that code reads
must exist in the SFT trainer config too, or an SFT job fails on the GPU path only (numa_affinity, 2026-11-28)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import hybridrl.workers.common as common
from hybridrl.config.schema.sft import SFTTrainerConfig
from hybridrl.config.schema.trainer import TrainerConfig


def _trainer_keys_read_by(path: str) -> set[str]:
    return set(re.findall(r"cfg\.trainer\.(\w+)", Path(path).read_text()))


def test_every_trainer_key_the_shared_setup_reads_exists_for_sft_and_rl():
    keys = _trainer_keys_read_by(common.__file__)
    assert {"dist_timeout_s", "numa_affinity", "n_gpus_per_node"} <= keys  # the scan finds what it must
    for cls in (SFTTrainerConfig, TrainerConfig):
        fields = {f.name for f in dataclasses.fields(cls)}
        assert keys <= fields, f"{cls.__name__} lacks {sorted(keys - fields)}"
