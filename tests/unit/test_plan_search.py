"""`hybridrl plan --search` and its step-time model: the model against measured GRPO steps (kept as data in
benchmarks/results/plan_calibration.json), and a search that ranks only layouts the memory plan accepts."""
from __future__ import annotations

import json
import os

import pytest

from hybridrl.config import load_config, validate
from hybridrl.plan.cli import main
from hybridrl.plan.model_shape import resolve
from hybridrl.plan.step_time import gpu_named, step_seconds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = json.load(open(os.path.join(ROOT, "benchmarks", "results", "plan_calibration.json")))["rows"]
JOB = ["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.rollout.n=8",
       "data.max_prompt_length=64", "data.max_response_length=256", "actor_rollout_ref.model.use_remove_padding=true",
       "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192",
       "actor_rollout_ref.actor.use_kl_loss=false"]


def _run(overrides: list[str], gpus: int):
    cfg = load_config(overrides + [f"trainer.n_gpus_per_node={gpus}", "trainer.nnodes=1",
                                   "actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda"], "grpo_trainer", None)
    return validate(cfg, cuda_available=lambda: True, te_available=lambda: True)


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_predicted_step_within_30_percent_of_the_measured_one(row):
    predicted = step_seconds(_run(row["overrides"], row["gpus"]), resolve(row["model"]), gpu_named(row["gpu"]))["step"]
    assert 0.7 <= predicted / row["step_s"] <= 1.3, (row["name"], predicted, row["step_s"])


def _search(capsys, *args: str) -> tuple[int, dict]:
    code = main(["--search", "--json", "--config-name", "grpo_trainer", *args, *JOB])
    return code, json.loads(capsys.readouterr().out)


def test_one_and_a_half_b_on_two_gpus_ranks_data_parallel_first(capsys):
    """two_gpu.md (2 x H200): dp2 stepped faster than tp2 for this size; the search agrees and every ranked layout fits."""
    code, out = _search(capsys, "--model-config", "Qwen2.5-1.5B", "--gpus", "2", "--gpu-mem-gb", "139.8")
    assert code == 0 and out["ranked"]
    best = out["ranked"][0]
    assert (best["tp"], best["pp"], best["dp"], best["tp_g"], best["dp_g"]) == (1, 1, 2, 1, 2)
    assert not best["optimizer_offload"] and not best["recompute"]  # both fit, both only cost time here
    steps = [c["predicted_seconds"]["step"] for c in out["ranked"]]
    assert steps == sorted(steps)
    assert all(c["peak_bytes"] <= out["gpu_memory_bytes"] for c in out["ranked"])


def test_fourteen_b_needs_several_gpus_and_the_search_says_which_layouts_fit(capsys):
    code, one = _search(capsys, "--model-config", "Qwen2.5-14B", "--gpus", "1", "--gpu-mem-gb", "79.1")
    assert code == 2 and one["ranked"] == [] and all(c["refused"] for c in one["refused"])
    code, four = _search(capsys, "--model-config", "Qwen2.5-14B", "--gpus", "4", "--gpu-mem-gb", "79.1")
    assert code == 0 and four["ranked"]
    assert all(c["tp"] * c["pp"] > 1 or c["optimizer_offload"] for c in four["ranked"])  # 266 GB of state
    refused = {(c["tp"], c["pp"], c["tp_g"], c["optimizer_offload"], c["recompute"]) for c in four["refused"]}
    assert (1, 1, 1, False, False) in refused  # one GPU's share of the whole state: does not fit 80 GB
