"""materialize_hf_dir on a folder without weights: refused with the keys that make a job start from random weights,
accepted when the job reads none (every role's load_weight=false, the rollout on placeholder weights); a GGUF model's
folder appears only complete, also when two runs dequantize it at once."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hybridrl.config import load_config, validate
from hybridrl.trainer.components import _actor_weights_read
from hybridrl.utils.hf_model import materialize_hf_dir


def test_a_folder_without_weights_needs_random_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors weights .*actor.load_weight=false"):
        materialize_hf_dir(str(tmp_path))
    assert materialize_hf_dir(str(tmp_path), weights=False) == str(tmp_path)


@pytest.mark.parametrize("overrides, reads", [
    ([], True),
    (["actor_rollout_ref.actor.load_weight=false"], True),  # the reference (use_kl_loss) still loads them
    (["actor_rollout_ref.actor.load_weight=false", "actor_rollout_ref.actor.use_kl_loss=false"], False),
    (["actor_rollout_ref.actor.load_weight=false", "actor_rollout_ref.ref.load_weight=false"], False),
    (["actor_rollout_ref.actor.load_weight=false", "actor_rollout_ref.actor.use_kl_loss=false",
      "actor_rollout_ref.rollout.load_format=auto"], True),  # the rollout engine reads the folder
])
def test_which_jobs_read_the_actor_weights(overrides, reads):
    run = validate(load_config(["trainer.device=cpu", "actor_rollout_ref.rollout.name=torch",
                                "actor_rollout_ref.actor.use_dynamic_bsz=true",
                                "actor_rollout_ref.actor.use_kl_loss=true", *overrides], config_name="grpo_trainer"),
                   cuda_available=False)
    assert _actor_weights_read(run) is reads



def _fake_writer(monkeypatch, seen_partial, calls):
    """hf_model._write_hf_dir without transformers: config, then (slowly) the weights, both naming the writer."""
    import threading
    import time

    from hybridrl.utils import hf_model

    lock = threading.Lock()

    def write(gguf, out, shown):
        with lock:
            calls.append(out)
            me = len(calls)
        (Path(out) / "config.json").write_text(json.dumps({"writer": me}))
        for _ in range(5):
            if os.path.isdir(shown) and not os.path.isfile(os.path.join(shown, ".complete")):
                seen_partial.append(shown)
            time.sleep(0.02)
        (Path(out) / "model.safetensors").write_text(f"weights of {me}")

    monkeypatch.setattr(hf_model, "_write_hf_dir", write)


def test_two_runs_dequantizing_at_once_never_show_a_partial_folder(tmp_path, monkeypatch):
    """Two lease lanes starting on a fresh machine (lora_smol and agent_tools_sft, next_4gpu.sh) dequantize SmolLM2's
    GGUF at once: each writes its own copy, and the folder both use appears complete, from one writer."""
    import threading

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "x.gguf").write_bytes(b"GGUF")
    seen_partial, calls, got = [], [], []
    _fake_writer(monkeypatch, seen_partial, calls)
    runs = [threading.Thread(target=lambda: got.append(materialize_hf_dir(str(tmp_path / "m"), "x.gguf",
                                                                          cache_dir=str(tmp_path / "cache"))))
            for _ in range(2)]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    assert len(calls) == 2 and len(set(got)) == 1 and not seen_partial
    out = Path(got[0])
    writer = json.loads((out / "config.json").read_text())["writer"]
    assert (out / "model.safetensors").read_text() == f"weights of {writer}" and (out / ".complete").is_file()
    assert sorted(os.listdir(tmp_path / "cache")) == [out.name]  # the other copy dropped
    assert materialize_hf_dir(str(tmp_path / "m"), "x.gguf", cache_dir=str(tmp_path / "cache")) == str(out)
    assert len(calls) == 2  # reused, not written again


def test_a_partial_folder_of_an_older_writer_is_replaced(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "x.gguf").write_bytes(b"GGUF")
    calls = []
    _fake_writer(monkeypatch, [], calls)
    out = materialize_hf_dir(str(tmp_path / "m"), "x.gguf", cache_dir=str(tmp_path / "cache"))
    (Path(out) / ".complete").unlink()  # as an in-place writer killed before the end left it
    (Path(out) / "model.safetensors").write_text("half")
    assert materialize_hf_dir(str(tmp_path / "m"), "x.gguf", cache_dir=str(tmp_path / "cache")) == out
    assert (Path(out) / "model.safetensors").read_text() == "weights of 2" and (Path(out) / ".complete").is_file()
    assert sorted(os.listdir(tmp_path / "cache")) == [os.path.basename(out)]
