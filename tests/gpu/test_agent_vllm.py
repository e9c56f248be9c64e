"""The agent loop on the colocated vLLM engine (one GPU): per-request generation through LLMEngine
add_request/step, user turns inside the responses, rollout log-probs of the multi-turn sequences against a
transformers forward on the same weights (loaded through load_weights after sleep/wake, as the hybrid sync
does). Skipped without CUDA or vLLM."""
from __future__ import annotations

import os
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


def _report(out: str) -> dict:
    import agent_bench

    return agent_bench.main(["--tiny", "--prompts", "16", "--n", "2", "--response-length", "128", "--reps", "2",
                             "--eager", "--gpu-util", "0.3", "--out", out])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    pytest.importorskip("vllm")
    from tests.fixtures.child import in_child  # one vLLM engine per process (tests/fixtures/child.py)

    return in_child(_report, str(tmp_path_factory.mktemp("agent") / "agent_smoke.json"))


@pytest.mark.timeout(600)
def test_multi_turn_runs_with_user_turns_and_masks(report):
    m = report["metrics"]
    assert m["turns_per_sample"] > 1 and m["user_turns_per_sample"] > 0
    assert m["engine_steps_per_rep"] > 0


@pytest.mark.timeout(600)
def test_rollout_log_probs_match_transformers_on_multi_turn_sequences(report):
    # bf16 engine vs fp32 transformers on a random model: the bf16 floor, far below a context mix-up
    assert report["metrics"]["rollout_vs_hf_logprob_abs_diff_mean"] < 0.05, report["metrics"]
