"""`hybridrl plan --search` and its step-time model: the model against measured GRPO steps (kept as data in
benchmarks/results/plan_calibration.json), and a search that ranks only layouts the memory plan accepts."""
from __future__ import annotations

import json
import math
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


# Rows the model misses by more than the 20% goal, each with why (reported as plan_step_time_error_max's excess).
# None: h200x4_7b_pp2dp2 was one until its overrides were found to claim recompute and the optimizer's host trips
# that its run (four_gpu_h200x4/7b_pp2dp2_rdp4) did not have.
KNOWN_MISSES: set[str] = set()


def _error(row) -> float:
    predicted = step_seconds(_run(row["overrides"], row["gpus"]), resolve(row["model"]), gpu_named(row["gpu"]))["step"]
    return predicted / row["step_s"] - 1


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_predicted_step_within_20_percent_of_the_measured_one(row):
    err = _error(row)
    bound = 0.4 if row["name"] in KNOWN_MISSES else 0.2
    assert abs(err) <= bound, (row["name"], err)


def test_plan_step_time_error_max_over_every_row():
    errors = {r["name"]: abs(_error(r)) for r in ROWS}
    worst = max(errors.values())
    print(f"plan_step_time_error_max={worst:.3f} ({max(errors, key=errors.get)}); without the known misses: "
          f"{max(e for n, e in errors.items() if n not in KNOWN_MISSES):.3f}")
    assert {n for n, e in errors.items() if e > 0.2} == KNOWN_MISSES
    # the 4 x H200 rows are in: seven of the first lease (the eager one too), five of the second, three of the third
    # (call 2), two of the sixth, two of the seventh (benchmarks/plan_calibration.py SOURCES; the rest in left_out)
    leases = [r["name"] for r in ROWS if r["name"].startswith("h200x4_")]
    assert [len([n for n in leases if n.startswith(p)])
            for p in ("h200x4_2_", "h200x4_3_", "h200x4_6_", "h200x4_7_")] == [5, 3, 2, 2]
    assert len(leases) == 19


def test_decode_is_latency_bound_and_tp_g_pays_an_all_reduce_a_layer():
    """Against the measured generate times of the 4 x H200 7B rows: a replica's decode step barely falls with fewer
    sequences, and tp_g=4 (128 sequences a replica) decodes slower than tp_g=1 x dp_g=4 (32) despite a quarter of the
    weights a GPU."""
    from hybridrl.plan.step_time import Costs

    c, layers = Costs(), 28
    step = {name: c.decode_step_s + c.per_sequence_s * seqs + (2 * layers * c.allreduce_latency_s * math.log2(tp) if tp > 1 else 0)
            for name, seqs, tp in (("tp1_32", 32, 1), ("tp2_64", 64, 2), ("tp4_128", 128, 4))}
    measured = {"tp1_32": 1.34, "tp2_64": 1.68, "tp4_128": 2.08}  # generate seconds for 256 decode steps
    assert step["tp1_32"] < step["tp2_64"] < step["tp4_128"]
    for name, seconds in measured.items():  # the per-step cost without the weights' read, within 30 ms of 256 steps
        weights = 2 * 7.6e9 / int(name[2]) / 4.8e12
        assert abs((step[name] + weights) * 256 - seconds) < 0.35, (name, (step[name] + weights) * 256, seconds)


# lease 6's rows copied through zero-copy views, at 2.9-3.2x the copy's floor (four_gpu.md, lease 6): not the copy
# sync_copy_efficiency was measured on; their bytes are still checked below
CROSS_GPU = [r for r in ROWS if "sync_received_gb" in r.get("phases_s", {})]
ZERO_COPY = {"h200x4_6_7b_big_rdp4", "h200x4_6_7b_pp2dp2_rtp2", "h200x4_7_7b_big_rdp4"}


@pytest.mark.parametrize("row", CROSS_GPU, ids=[r["name"] for r in CROSS_GPU])
def test_sync_receives_the_bytes_the_cross_gpu_copy_moved_and_takes_its_time(row):
    """The 4 x H200 rows whose engine shard was not inside the GPU's training shard (tp4 -> tp_g1, tp2 -> tp_g1,
    pp2 -> tp_g2): the bytes a GPU received (reshard/remote_bytes) and the copy's seconds (reshard_stream)."""
    from hybridrl.plan.step_time import received_bytes

    run, shape = _run(row["overrides"], row["gpus"]), resolve(row["model"])
    received = sum(received_bytes(shape, run.derived.actor, run.derived.rollout)) / 1e9
    assert received == pytest.approx(row["phases_s"]["sync_received_gb"], rel=0.01)
    if row["name"] in ZERO_COPY:
        return
    sync = step_seconds(run, shape, gpu_named(row["gpu"]))["sync"]
    assert sync == pytest.approx(row["phases_s"]["sync"], rel=0.2), (sync, row["phases_s"]["sync"])


BUCKETED = {"h200x4_7b_pp2dp2"}  # its sync went the bucketed way (the first lease, before the cross-GPU copy)
# the check per GB was measured on the 4 x H200 leases; the 2 x H200 and scale rows (earlier code) took 1.4-1.9x of it
CHECKED = [r for r in ROWS if "sync_check" in r.get("phases_s", {}) and r["name"] not in BUCKETED
           and r["name"].startswith("h200x4_")]


# rows whose check the term misses by more than 25%, with why: kept so that a model that starts to fit them is noticed
CHECK_MISSES = {
    # 0.16 s predicted, 0.120 measured (steps 2-5: 0.086-0.146 s); the same machine's view-to-view run just before
    # checked the same 282 + 339 pieces in 0.141 s, the other leases' runs of this row 0.141-0.153 s
    "h200x4_7_7b_big_rdp4.staged",
}


@pytest.mark.parametrize("row", CHECKED, ids=[r["name"] for r in CHECKED])
def test_sync_check_term_against_the_measured_check(row):
    """timing_s/sync_check of every row that synced by direct copy: the check of the engine's shard and of the
    received bytes."""
    predicted = step_seconds(_run(row["overrides"], row["gpus"]), resolve(row["model"]), gpu_named(row["gpu"]))["sync_check"]
    within = predicted == pytest.approx(row["phases_s"]["sync_check"], rel=0.25)
    assert within != (row["name"] in CHECK_MISSES), (predicted, row["phases_s"]["sync_check"])


def test_receive_fraction_of_nested_and_crossed_shards():
    """Nested shards (every measured row) give benchmarks/four_gpu.py's 1/tp_g - 1/(pp max(tp, tp_g)); where the
    rank orders cross (hybrid/plan.py: tp rank = rank % tp, tp_g rank = rank % tp_g), worked by hand: tp4 -> tp_g2,
    rank 1 trains quarter 1 and serves half 1 (quarters 2-3), so it receives all of its half; tp2 -> tp_g4, rank 1
    trains half 1 and serves quarter 1 (in half 0)."""
    from hybridrl.plan.step_time import receive_fraction

    for tp, pp, tp_g in ((1, 1, 1), (2, 1, 1), (4, 1, 1), (2, 1, 2), (4, 1, 4), (1, 2, 2), (1, 2, 1), (2, 2, 1), (1, 1, 4)):
        assert receive_fraction(tp, pp, tp_g) == pytest.approx(max(0.0, 1 / tp_g - 1 / (pp * max(tp, tp_g)))), (tp, pp, tp_g)
    assert receive_fraction(4, 1, 2) == pytest.approx(0.5)
    assert receive_fraction(2, 1, 4) == pytest.approx(0.25)
    assert receive_fraction(4, 2, 2) == pytest.approx(0.25 + 0.5 / 2)  # the other stage's half, then as tp4 -> tp_g2


@pytest.mark.parametrize("name", ["Qwen2.5-72B", "Qwen3-30B-A3B"])
def test_kept_hf_configs_give_the_published_shapes(name):
    from dataclasses import replace

    kept = resolve(os.path.join(ROOT, "benchmarks", "plan_models", name))
    assert replace(kept, name="", source="") == replace(resolve(name), name="", source="")
    assert round(kept.params / 1e9, 1) == {"Qwen2.5-72B": 72.7, "Qwen3-30B-A3B": 30.5}[name]


def test_a_slower_network_slows_the_gradient_traffic_that_crosses_nodes():
    from hybridrl.plan.step_time import Network

    job = ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8"]
    shape, gpu = resolve("Qwen2.5-14B"), gpu_named("H200")
    cfg = load_config(JOB + job + ["trainer.n_gpus_per_node=8", "trainer.nnodes=4", "actor_rollout_ref.rollout.name=vllm",
                                   "trainer.device=cuda"], "grpo_trainer", None)
    run = validate(cfg, cuda_available=lambda: True, te_available=lambda: True)
    fast, slow = (step_seconds(run, shape, gpu, net=Network(gbps_per_gpu=g)) for g in (400, 100))
    # dp=4 over 4 nodes: the fp32 gradients' reduce-scatter + all-gather, 14.8e9 x 4 / 8 bytes a GPU, at 40 vs 10 GB/s
    grads = 2 * 4 * shape.params / 8 * 3 / 4
    assert slow["update"] - fast["update"] == pytest.approx(grads / 10e9 - grads / 40e9, rel=0.05)
    assert slow["gen"] == fast["gen"] and slow["log_probs"] == fast["log_probs"]


def test_search_covers_ep_for_experts_and_refuses_beyond_1024_gpus(capsys):
    code, out = _search(capsys, "--model-config", "Qwen3-30B-A3B", "--gpus", "8", "--gpu-mem-gb", "139.8")
    assert code == 0 and {c["ep"] for c in out["ranked"]} >= {1, 2, 4, 8}
    assert out["network_gbps_per_gpu"] == 400.0
    code, out = _search(capsys, "--model-config", "Qwen2.5-7B", "--gpus", "2048", "--gpu-mem-gb", "139.8")
    assert code == 2


def _search(capsys, *args: str) -> tuple[int, dict]:
    code = main(["--search", "--json", "--config-name", "grpo_trainer", *args, *JOB])
    return code, json.loads(capsys.readouterr().out)


def test_one_and_a_half_b_on_two_gpus_ranks_data_parallel_first(capsys):
    """two_gpu.md (2 x H200): dp2 stepped faster than tp2 for this size; the search agrees and every ranked layout fits."""
    code, out = _search(capsys, "--model-config", "Qwen2.5-1.5B", "--gpus", "2", "--gpu-mem-gb", "139.8")
    assert code == 0 and out["ranked"]
    best = out["ranked"][0]
    # measured: dp2 (and vLLM tp_g1 x dp_g2) beat tp2; pp2 was not measured on this shape (the 4-GPU 7B pp2 x dp2
    # run was the fastest 7B layout), and the model puts it within 2% of dp2
    assert best["tp"] == 1 and (best["tp_g"], best["dp_g"]) == (1, 2)
    rank = {(c["tp"], c["pp"], c["tp_g"], c["optimizer_offload"], c["recompute"]): i for i, c in enumerate(out["ranked"])}
    assert rank[(1, 1, 1, False, False)] < rank[(2, 1, 2, False, False)]
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


def test_moe_step_model_counts_a_gpus_own_experts_their_gemms_and_the_expert_sync():
    """Issue 38: a GPU holds dense weights / (tp pp) and experts / (pp ep etp), so ep shrinks the state that moves
    around generation; the local spec's one GEMM per expert costs the update; an ep4 actor feeding vLLM tp_g4 with
    its expert parallel copies in place, and with tensor-parallel experts receives 3/4 of its experts over NVLink
    (and checks them); with optimizer_offload the optimizer state's trip to the host and back counts a GPU's share."""
    from hybridrl.plan.step_time import Costs

    shape, gpu = resolve("Qwen3-30B-A3B"), gpu_named("H200")
    ara = "actor_rollout_ref"
    ep = f"{ara}.actor.megatron.expert_model_parallel_size"

    def predict(*more: str, gpus: int = 8) -> dict[str, float]:
        return step_seconds(_run(JOB + list(more), gpus), shape, gpu)

    off = f"{ara}.actor.megatron.optimizer_offload=true"
    ep1, ep8 = predict(f"{ara}.rollout.tensor_model_parallel_size=1", off), predict(
        f"{ara}.rollout.tensor_model_parallel_size=1", f"{ep}=8", off)
    # the optimizer state a GPU sends to the host and back: 12 bytes a parameter over the 8 GPUs either way (dense
    # weights over dp, experts over ep x expert_dp), at the 50 GB/s of host copies
    for pred in (ep1, ep8):
        assert pred["optimizer_offload"] == pytest.approx(12 * shape.params / 8 / 50e9, rel=1e-3)
    assert ep1["gen"] - ep1["optimizer_offload"] == pytest.approx(
        predict(f"{ara}.rollout.tensor_model_parallel_size=1")["gen"], rel=1e-9)  # its way out is part of gen
    local = predict(f"{ara}.rollout.tensor_model_parallel_size=1", f"{ep}=8", f"{ara}.actor.megatron.transformer_impl=local")
    assert local["update"] > 3 * ep8["update"] and local["log_probs"] > 3 * ep8["log_probs"]
    four = [f"{ara}.rollout.tensor_model_parallel_size=4", f"{ep}=4"]
    whole, split = predict(*four, f"{ara}.rollout.expert_parallel_size=4", gpus=4), predict(*four, gpus=4)
    received = 0.75 * 2 * shape.num_layers * shape.layer_expert_params() / 4
    c = Costs()
    assert split["sync"] - whole["sync"] == pytest.approx(received / (gpu.nvlink_bytes_per_s * c.sync_copy_efficiency), rel=1e-6)
    assert split["sync_check"] - whole["sync_check"] == pytest.approx(c.sync_check_s_per_gb * received / 1e9, rel=1e-6)
