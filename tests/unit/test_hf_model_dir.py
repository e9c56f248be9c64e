"""materialize_hf_dir on a folder without weights: refused with the keys that make a job start from random weights,
accepted when the job reads none (every role's load_weight=false, the rollout on placeholder weights)."""
from __future__ import annotations

import json

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

