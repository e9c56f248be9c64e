"""The agent demo (configs/agent_demo.yaml: GRPO with the calculator tool, multi-turn through the agent loop) for
2 steps through the real stack: Ray, megatron-core over gloo, the torch engine's per-request generation."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args[:3]} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out


def problem(sample: dict) -> str:
    """The expression ("37*48") of a dumped prompt ("user\n37*48=\nassistant\n")."""
    return sample["input"].splitlines()[1].rstrip("=")


@pytest.mark.timeout(900)
def test_agent_demo_two_steps(tmp_path):
    out = tmp_path / "agent_demo"
    rollouts = tmp_path / "rollouts"
    # 300 warm-up steps: about the fewest after which the model copies the calculator's result (the default is 500)
    proc = run(["-m", "hybridrl.trainer.agent_demo", "--out", str(out), "--sft-steps", "300",
                "trainer.total_training_steps=2", "trainer.test_freq=2", f"trainer.rollout_data_dir={rollouts}"])
    rows = [json.loads(line) for line in open(out / "checkpoints" / "logs" / "metrics.jsonl")]
    train = [r for r in rows if "critic/score/mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["agent/turns_per_sample"] >= 1 and "agent/tool_calls_per_sample" in r and "agent/tool_seconds" in r
        assert r["agent/tool_errors"] >= 0 and r["timing_s/agent_loop"] > 0
        # fp32 on CPU: the torch engine's per-request log-probs equal the actor's recomputation on the
        # multi-turn sequences (observation tokens in the context, excluded by the mask)
        assert r["rollout_vs_actor/logprob_abs_diff_mean"] < 1e-5
    assert abs(train[0]["actor/ppo_kl"]) < 1e-6
    assert any(r["agent/tool_calls_per_sample"] > 0 for r in train)  # the warm-up taught some tool calls
    samples = [json.loads(line) for step in (1, 2) for line in open(rollouts / f"{step}.jsonl")]
    for s in samples:  # the reward is exact match on the response's last line, whatever came before it
        assert s["score"] == float(s["output"].strip().splitlines()[-1:] == [s["gts"]]), s
    # GRPO's signal: a sample that calls the calculator with the problem's expression then answers with its
    # result (an earlier warm-up, 300 steps with 30% tool conversations, taught the calls but not the copying:
    # ~1 result in 20 and a train score of ~0 at every step)
    called = [s for s in samples if f'"expression": "{problem(s)}"' in s["output"]]
    assert len(called) >= 5 and sum(s["score"] for s in called) >= 0.7 * len(called), called[:5]
    last = proc.stdout.rstrip().splitlines()[-1]
    assert last.startswith("agent demo: val/score ") and "tool-call rate" in last
