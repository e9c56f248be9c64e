"""The trainer's memory check (hybridrl/plan/device_check.py, trainer.memory_check): the plan against the GPUs the job
runs on, before Ray and the workers start. CPU only: the GPU is a fake size, the model a built-in shape."""
from __future__ import annotations

import glob
import json
import logging
import os
import shlex

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridrl.config import ConfigError, load_config, validate
from hybridrl.config.cli import normalize_argv, parse_command_line
from hybridrl.plan import device_check
from hybridrl.plan.device_check import Gpu, check_memory, plan_problems
from hybridrl.plan.memory import GiB
from hybridrl.plan.model_shape import KNOWN_CONFIGS, from_hf_config, resolve

ARA = "actor_rollout_ref"
RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "results")
P_7B = 7_615_616_512  # Qwen2.5-7B's parameters (tests/unit/test_plan_memory.py)
# The run table's lora_7b_full row (`python benchmarks/runs.py show lora_7b_full`), its model the built-in 7B shape:
# full fine-tuning of the 7B on one GPU, the optimizer state on the host until its step.
LORA_7B_FULL = [
    "data.max_prompt_length=64", "data.max_response_length=256", "data.train_batch_size=16",
    f"{ARA}.actor.ppo_mini_batch_size=16", f"{ARA}.rollout.n=8", f"{ARA}.rollout.ignore_eos=true",
    f"{ARA}.model.use_remove_padding=true", f"{ARA}.actor.use_dynamic_bsz=true",
    f"{ARA}.rollout.tensor_model_parallel_size=1", "trainer.n_gpus_per_node=1", f"{ARA}.rollout.name=vllm",
    "trainer.device=cuda", f"{ARA}.actor.ppo_max_token_len_per_gpu=4096", f"{ARA}.model.enable_gradient_checkpointing=true",
    f"{ARA}.actor.use_kl_loss=false", f"{ARA}.actor.load_weight=false", f"{ARA}.actor.megatron.optimizer_offload=true",
    f"{ARA}.rollout.gpu_memory_utilization=0.3", f"{ARA}.model.path=Qwen2.5-7B",
]
# actor_step by hand: bf16 params 2P + fp32 grads 4P + fp32 master weights and two Adam moments 12P (one GPU: the
# distributed optimizer has one shard), plus the plan's 3 GiB overhead; the job's largest phase.
STEP_7B = 18 * P_7B + 3 * GiB  # 140,302,322,688 bytes = 130.7 GiB
H100 = Gpu("NVIDIA H100 80GB HBM3", int(79.2 * GiB), 1)  # as the H100 scale runs recorded it (torch's total_memory)


def _run(*overrides: str, name: str = "grpo_trainer"):
    return validate(load_config(list(overrides), name), cuda_available=lambda: True, te_available=lambda: True)


def _fixed(gpu: Gpu):
    return lambda: gpu


def _never():
    raise AssertionError("the GPU was probed")


def test_decision_against_the_actor_step_by_hand(caplog):
    run = _run(*LORA_7B_FULL)
    plan, problems = plan_problems(run, STEP_7B, resolve("Qwen2.5-7B"))
    assert plan.phases["actor_step"].total == STEP_7B and plan.peak.name == "actor_step" and problems == []
    with caplog.at_level(logging.INFO, logger="hybridrl.plan"):
        check_memory(run, _fixed(Gpu("Fake", STEP_7B, 1)))  # exactly the peak: fits
    assert "fits, peak actor_step 130.7 GiB" in caplog.text
    with pytest.raises(ConfigError) as err:
        check_memory(run, _fixed(Gpu("Fake", STEP_7B - 1, 1)))  # one byte less: refused
    assert "the actor_step phase needs 130.7 GiB per GPU of 130.7 GiB" in str(err.value)


def test_the_issues_run_is_refused_on_an_h100_naming_the_phase_and_the_keys():
    with pytest.raises(ConfigError) as err:
        check_memory(_run(*LORA_7B_FULL), _fixed(H100))
    msg = str(err.value)
    assert "NVIDIA H100 80GB HBM3 (79.2 GiB)" in msg and "the actor_step phase needs 130.7 GiB per GPU of 79.2 GiB" in msg
    assert "largest: actor_optimizer 85.1 GiB, actor_grads 28.4 GiB" in msg and "turn one of: " in msg
    assert "trainer.nnodes" in msg  # the plan's key to turn
    assert "trainer.memory_check=warn starts anyway" in msg and "trainer.memory_check=skip" in msg
    assert "--gpu-mem-gb 79.2" in msg and "\n" not in msg  # one problem: one line, as every user error


def test_several_problems_one_a_line():
    run = _run(*LORA_7B_FULL[:-1], f"{ARA}.rollout.gpu_memory_utilization=0.05", f"{ARA}.model.path=Qwen2.5-7B")
    with pytest.raises(ConfigError) as err:
        check_memory(run, _fixed(Gpu("Fake", 16 * GiB, 2)))
    lines = str(err.value).splitlines()
    assert "Fake (16.0 GiB, the smallest of 2)" in lines[0] and lines[-1].startswith("The plan is a model")
    assert [line.startswith("  - does not fit") for line in lines[1:-1]] == [True] * (len(lines) - 2) and len(lines) > 3
    assert any("KV cache" in line for line in lines)


def test_warn_logs_the_refusal_and_goes_on(caplog):
    run = _run(*LORA_7B_FULL, "trainer.memory_check=warn")
    with caplog.at_level(logging.INFO, logger="hybridrl.plan"):
        check_memory(run, _fixed(H100))
    (record,) = caplog.records
    assert record.levelname == "WARNING" and "trainer.memory_check=warn, starting anyway" in record.message
    assert "the actor_step phase needs 130.7 GiB" in record.message


def test_skip_and_cpu_do_not_probe_or_log(caplog):
    with caplog.at_level(logging.INFO, logger="hybridrl.plan"):
        check_memory(_run(*LORA_7B_FULL, "trainer.memory_check=skip"), _never)
        cpu = [o for o in LORA_7B_FULL if o not in ("trainer.device=cuda", f"{ARA}.rollout.name=vllm")]
        run = _run(*cpu, "trainer.device=cpu", f"{ARA}.rollout.name=torch")
        assert run.derived.device == "cpu"
        check_memory(run, _never)
    assert caplog.records == []


def test_skipped_with_a_logged_line_where_the_gpus_are_not_seen(caplog, tmp_path):
    gguf = tmp_path / "gguf_model"
    gguf.mkdir()
    (gguf / "model.gguf").write_bytes(b"0")
    cases = [
        (_run(*LORA_7B_FULL, "+ray_kwargs.ray_init.address=10.0.0.1:6379"), _never, "the job runs on a Ray cluster this process joins"),
        (_run(*LORA_7B_FULL), lambda: None, "this process sees no GPU"),
        (_run(*LORA_7B_FULL, f"{ARA}.model.path={gguf}"), _fixed(H100), f"no model shape from {ARA}.model.path"),
    ]
    for run, probe, why in cases:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hybridrl.plan"):
            check_memory(run, probe)
        (record,) = caplog.records
        assert record.levelname == "WARNING" and f"memory check skipped: {why}" in record.message, record.message


def test_run_ppo_stops_before_ray_and_the_workers(tmp_path, monkeypatch):
    """The trainer's start: the inputs pass check_inputs, then the plan refuses before anything is built."""
    from hybridrl.trainer import ppo_trainer

    model = tmp_path / "Qwen2.5-7B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**KNOWN_CONFIGS["Qwen2.5-7B"], "max_position_embeddings": 4096}))
    (model / "model.safetensors").write_bytes(b"0")  # only its presence is checked before start-up
    (model / "tokenizer.json").write_text("{}")
    row = {"data_source": "arithmetic", "prompt": [{"role": "user", "content": "1+2="}],
           "reward_model": {"style": "rule", "ground_truth": "3"}}
    pq.write_table(pa.Table.from_pylist([row] * 3), tmp_path / "data.parquet")
    run = _run(*LORA_7B_FULL, f"{ARA}.model.path={model}", f"data.train_files={tmp_path / 'data.parquet'}",
               f"data.val_files={tmp_path / 'data.parquet'}", f"trainer.default_local_dir={tmp_path / 'run'}")
    monkeypatch.setattr(device_check, "smallest_local_gpu", _fixed(H100))
    monkeypatch.setattr(ppo_trainer, "build_components", lambda *a: _never())
    with pytest.raises(ConfigError, match="the actor_step phase needs 130.7 GiB per GPU of 79.2 GiB"):
        ppo_trainer.run_ppo(run)
    assert not (tmp_path / "run").exists()


def test_the_key_takes_three_values():
    with pytest.raises(ConfigError, match="trainer.memory_check='maybe' is not one of error, skip, warn"):
        _run("trainer.memory_check=maybe")
    assert _run(*LORA_7B_FULL).cfg.trainer.memory_check == "error"


# ------------------------------------------------------------------------------------------ runs that ran
# Recorded before optimizer_offload took verl's meaning (bd8ffd2, 2026-11-27): then the hybrid engine sent the
# actor's optimizer state to the host through generation whatever the key said; now false keeps it on the GPU beside
# the engine, so the command as recorded needs the key the run table's scale_7b row passes today (SCALE_SHAPES).
BEFORE_OFFLOAD_MEANING = {"megatron_scale/7b_run.json", "megatron_scale_rope_off/7b_run.json"}


def _recorded_runs():
    for path in sorted(glob.glob(os.path.join(RESULTS, "**", "*_run.json"), recursive=True)):
        with open(path) as f:
            row = json.load(f)
        if "gpu_memory_gib" in row:  # the ones that say which GPU they ran on
            yield os.path.relpath(path, RESULTS), row


def _shape_of(run_json: str):
    """The random Qwen2 model a run trained (benchmarks/multi_gpu_bench.SHAPES), from its plan.json."""
    with open(os.path.join(RESULTS, run_json.replace("_run.json", "_plan.json"))) as f:
        m = json.load(f)["model"]
    shape = from_hf_config(dict(model_type="qwen2", num_hidden_layers=m["num_layers"], hidden_size=m["hidden_size"],
                                intermediate_size=m["ffn_hidden_size"], num_attention_heads=m["num_attention_heads"],
                                num_key_value_heads=m["num_key_value_heads"], vocab_size=m["vocab_size"],
                                tie_word_embeddings=m["tie_word_embeddings"]), name=m["name"])
    assert shape.params == m["params"], run_json
    return shape


def test_every_recorded_gpu_run_passes_on_the_gpu_it_ran_on():
    """benchmarks/results/*/*_run.json: each GPU run with its command and GPU, planned by today's code."""
    checked = 0
    for name, row in _recorded_runs():
        argv = row.get("overrides") or shlex.split(row["command"])[3:]  # "python3 -m hybridrl.trainer.main_ppo ..."
        if name in BEFORE_OFFLOAD_MEANING:
            argv = [*argv, f"{ARA}.actor.megatron.optimizer_offload=true"]
        cl = parse_command_line(normalize_argv(argv))
        run = validate(load_config(cl.overrides, cl.config_name, cl.config_path), cuda_available=lambda: True,
                       te_available=lambda: True)
        _, problems = plan_problems(run, int(row["gpu_memory_gib"] * GiB), _shape_of(name))
        assert problems == [], (name, problems)
        checked += 1
    assert checked >= 30  # 4 x H200 leases, the H200 and H100 scale curves
