"""Per-rank RNG state files of megatron role checkpoints: safetensors + JSON metadata, never pickle."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from hybridrl.adapters.megatron.checkpoint import RNG_FORMAT, load_rng_state, save_rng_state


def _draws() -> tuple:
    return (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), np.random.normal(), torch.rand(3).tolist())


def _state(tracker: dict) -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": None, "tracker": tracker}


def test_rng_state_round_trip_restores_every_stream(tmp_path):
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    random.gauss(0, 1)  # leaves a cached gaussian in python's state ...
    np.random.normal()  # ... and in numpy's
    g = torch.Generator().manual_seed(7)
    tracker = {"model-parallel-rng": g.get_state(), "data-parallel-rng": torch.Generator().manual_seed(8).get_state()}
    file = tmp_path / "rank_00000.safetensors"
    save_rng_state(str(file), _state(tracker))
    expected = _draws()

    _draws(), _draws()  # move every stream on
    state = load_rng_state(str(file))
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    assert _draws() == expected
    assert state["cuda"] is None
    assert sorted(state["tracker"]) == sorted(tracker)
    for name, t in tracker.items():
        assert torch.equal(state["tracker"][name], t)


def test_rng_file_is_safetensors_with_json_metadata_not_pickle(tmp_path):
    file = tmp_path / "rank_00000.safetensors"
    save_rng_state(str(file), _state({}))
    raw = file.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])
    assert json.loads(header["__metadata__"]["hybridrl"])["format"] == RNG_FORMAT
    assert not raw.startswith(b"PK") and b"\x80\x02" not in raw[:2]  # neither a torch zip nor a raw pickle


def test_a_foreign_safetensors_file_is_refused(tmp_path):
    from safetensors.torch import save_file

    file = tmp_path / "rank_00000.safetensors"
    save_file({"torch": torch.get_rng_state()}, str(file))
    with pytest.raises(ValueError, match="not a hybridrl RNG state file"):
        load_rng_state(str(file))
