"""GRPO with LoRA (actor_rollout_ref.model.lora_rank=8) through the real CPU stack: the demo for 2 steps, dp=2.

What only the whole stack shows: the reference is the actor with its adapters off (its KL is exactly 0 before
the first update, when B = 0, and positive after it: the adapters moved the policy away from the base), the
torch engine samples from the merged weights the weight sync sends (its log-probs equal the actor's), and the
checkpoint is a LoRA one (adapters only, meta.json records them)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(400)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict:
    """The demo's data and its tiny model after 5 supervised steps, once for both runs."""
    from hybridrl.trainer.demo import prepare

    model, train, test = prepare(str(tmp_path_factory.mktemp("prepared")), sft_steps=5, seed=0)
    return {"model": model, "train": train, "test": test}


@pytest.mark.parametrize("merge", [False, True], ids=["adapter_sync", "merged_sync"])
def test_grpo_with_lora_trains_the_adapters_against_the_base_as_reference(prepared, tmp_path, merge):
    """merge=false (the default): the engine holds the base from the first sync and takes only the adapters each step
    (every step's sync moves the adapters' bytes alone); merge=true: W + s*B@A in full every step."""
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1")
    # the demo's job (configs/demo.yaml) on its data and model
    cmd = [sys.executable, "-m", "hybridrl.trainer.main_ppo", "--config-name", "demo",
           f"data.train_files={prepared['train']}", f"data.val_files={prepared['test']}",
           f"actor_rollout_ref.model.path={prepared['model']}", f"trainer.default_local_dir={tmp_path / 'checkpoints'}",
           "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=2",
           "trainer.val_before_train=false", "actor_rollout_ref.model.lora_rank=8",
           "actor_rollout_ref.model.lora_alpha=16", "actor_rollout_ref.actor.optim.lr=1e-2",
           f"actor_rollout_ref.model.lora.merge={str(merge).lower()}"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=360)
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    rows = [json.loads(line) for line in open(tmp_path / "checkpoints" / "logs" / "metrics.jsonl")]
    train = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert train[0]["actor/kl_loss"] == 0.0  # B = 0: the actor is the base, i.e. its own reference
    assert train[1]["actor/kl_loss"] > 1e-4  # the first update moved the adapters
    assert abs(train[0]["actor/ppo_kl"]) < 1e-6
    for r in train:  # the engine computes W + s*B@A (merged, or base + hooked adapters): the actor's log-probs (fp32)
        assert r["rollout_vs_actor/logprob_abs_diff_mean"] < 1e-5
        if merge:
            assert "reshard/adapter_bytes" not in r
        else:  # the base came with the first sync (at start-up); a step's sync is the adapters, checked
            assert r["reshard/bytes"] == r["reshard/adapter_bytes"] > 0
            assert r["sync_check/adapter_tensors_checked"] > 0
    meta = json.loads((tmp_path / "checkpoints" / "global_step_2" / "actor" / "meta.json").read_text())
    assert meta["lora"] == {"rank": 8, "alpha": 16.0, "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                  "up_proj", "down_proj"]}
