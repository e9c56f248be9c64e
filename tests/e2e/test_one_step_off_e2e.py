"""trainer.one_step_off_policy on CPU: the demo job with the rollout in its own process (hybrid_engine=false),
the weights broadcast over gloo after every update, generation of step k+1 overlapping step k."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPLIT = ["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=1",
         "actor_rollout_ref.rollout.calculate_log_probs=true"]


def _main_ppo(data, out, *extra: str) -> subprocess.CompletedProcess:
    """main_ppo with the demo's config on data/model/tokenizer already made by demo.prepare (`data`: its paths); the
    checkpoints and logs under out/checkpoints, as the demo puts them."""
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1")
    args = ["--config-name", "demo", f"data.train_files={data['train']}", f"data.val_files={data['test']}",
            f"actor_rollout_ref.model.path={data['model']}", f"trainer.default_local_dir={out / 'checkpoints'}", *SPLIT,
            "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.plot=false", *extra]
    proc = subprocess.run([sys.executable, "-m", "hybridrl.trainer.main_ppo", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.mark.timeout(900)
def test_split_placement_synchronous_rollout_holds_the_updated_weights(demo_prepared, tmp_path):
    """Without one_step_off_policy the actor's weights are broadcast before every generation: after an update the
    rollout's log-probs equal the actor's recomputation (fp32), so the broadcast carried the updated weights."""
    out = tmp_path / "demo"
    _main_ppo(demo_prepared, out, "trainer.total_training_steps=2")
    rows = [json.loads(line) for line in open(out / "checkpoints" / "logs" / "metrics.jsonl")]
    train = [r for r in rows if "critic/score/mean" in r]
    assert [r["async/staleness"] for r in train] == [0.0, 0.0]
    # step 1 changed the weights (a nonzero gradient went into the optimizer) and step 2 got them by broadcast
    assert train[0]["actor/grad_norm"] > 0 and train[1]["weight_broadcast/bytes"] > 0
    for r in train:
        assert r["rollout_vs_actor/logprob_abs_diff_mean"] < 1e-5


def _demo(out, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "hybridrl.trainer.demo", "--out", str(out), "--sft-steps", "20", *SPLIT,
                           "trainer.one_step_off_policy=true", "trainer.test_freq=-1", "trainer.val_before_train=false",
                           "trainer.plot=false", *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def _prompts(path) -> list[str]:
    return sorted(json.loads(line)["input"] for line in open(path))


@pytest.mark.timeout(900)
def test_resume_generates_the_prefetched_prompts_again(tmp_path):
    """Run a: three one-step-off steps (checked as such). The checkpoint of step 2 is written while step 3's prompts are already out for generation: a run resumed
    from it must train step 3 on those same prompts (not skip them), on the weights after update 2 (staleness 0)."""
    a, b = tmp_path / "a", tmp_path / "b"
    proc = _demo(a, "trainer.total_training_steps=3", "trainer.save_freq=2", f"trainer.rollout_data_dir={a / 'rollouts'}")
    check_one_step_off_run(proc.stdout, a)
    # run b on run a's data and model (no second demo.prepare): it starts from a's checkpoint anyway
    made = {"train": a / "data" / "train.parquet", "test": a / "data" / "test.parquet", "model": a / "model"}
    _main_ppo(made, b, "trainer.one_step_off_policy=true", "trainer.total_training_steps=3",
              "trainer.resume_mode=resume_path", f"trainer.resume_from_path={a / 'checkpoints' / 'global_step_2'}",
              f"trainer.rollout_data_dir={b / 'rollouts'}")
    assert sorted(os.listdir(b / "rollouts")) == ["3.jsonl"]
    assert _prompts(b / "rollouts" / "3.jsonl") == _prompts(a / "rollouts" / "3.jsonl")
    assert _prompts(a / "rollouts" / "3.jsonl") != _prompts(a / "rollouts" / "2.jsonl")
    rows = [json.loads(line) for line in open(b / "checkpoints" / "logs" / "metrics.jsonl")]
    assert [(r["step"], r["async/staleness"]) for r in rows if "critic/score/mean" in r] == [(3, 0.0)]


def check_one_step_off_run(stdout: str, out) -> None:
    assert "placement: split" in stdout and "one-step-off-policy" in stdout
    rows = [json.loads(line) for line in open(out / "checkpoints" / "logs" / "metrics.jsonl")]
    train = [r for r in rows if "critic/score/mean" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    # batch 1 comes from the initial weights; batch k >= 2 from the policy before the last update
    assert [r["async/staleness"] for r in train] == [0.0, 1.0, 1.0]
    # the initial broadcast delivered the actor's weights exactly (fp32 on CPU): rollout == actor log-probs
    assert train[0]["rollout_vs_actor/logprob_abs_diff_mean"] < 1e-5
    # a stale batch differs from the actor that trains it, and the correction (token TIS, cap 2.0) is applied
    assert train[1]["rollout_vs_actor/logprob_abs_diff_mean"] > 1e-4
    for r in train[1:]:
        assert 0 < r["rollout_corr/rollout_is_max"] <= 2.0
    # batch 2 was generated on the initial weights (no push); batch 3's generation was preceded by the broadcast
    # of update 1, checksummed on the rollout side against what arrived (fp32 on CPU: exact)
    assert "weight_broadcast/bytes" not in train[1]
    assert train[2]["weight_broadcast/bytes"] > 0 and train[2]["sync_check/max_rel_diff"] == 0.0
    assert stdout.rstrip().splitlines()[-1].startswith("demo: val/score ")
