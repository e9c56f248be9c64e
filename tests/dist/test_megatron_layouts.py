"""megatron-core backend on CPU (gloo, fp32) in several tp/pp/vpp/dp layouts.

One torchrun launch per layout runs all of that layout's checks (run_layout.py):
  * parity: log-probs, entropy and raw logits vs transformers on the same weights (max abs diff
    < 1e-4) for tiny random Llama (llama3 rope scaling, untied), Qwen2 (qkv bias, tied), Qwen3
    (q/k norm) and Mistral (sliding window) models with GQA and a vocab (1001) not divisible by tp;
    export_hf_weights gives back the HF tensors bitwise, and lets go of a bucket before gathering the next;
  * PPO: two actor updates (2 optimizer steps each, KL loss + entropy bonus) and two critic updates
    give the same losses, metrics and grad norms as the 1-process run (relative diff < 1e-5), with
    the distributed optimizer on and off, other micro-batch sizes and dynamic batching;
  * resume: update 2 from the 1-process run's checkpoint (saved after update 1) in this layout equals
    the uninterrupted update 2;
  * packed (use_remove_padding, THD micro-batches) vs padded on the same weights, in every layout:
    log-probs and entropy of every parity model, the actor's and critic's loss metrics, every gradient
    after one forward-backward and the critic's values (max abs diff < 1e-5); the dp2 layout also runs
    its PPO updates packed with dynamic batch sizes, against the padded 1-process run.
Virtual pipeline stages (pp2_vpp2) train with megatron's interleaved schedule, save and resume.
"""
from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "megatron_helpers"))

import tiny  # noqa: E402

import launch  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.timeout(420)]

LAUNCH_TIMEOUT = 360
PARITY_TOL = 1e-4
PACKED_TOL = 1e-5  # packed vs padded, fp32 on CPU
REL_TOL = 1e-5
ABS_TOL = 1e-5  # other metrics: means of fp32 quantities, some of them differences of log-probs (ppo_kl ~1e-3)
# Losses and grad norms must agree to REL_TOL; the remaining metrics to ABS_TOL.
STRICT = {"actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "critic/vf_loss", "critic/grad_norm"}
ACTOR_KEYS = ["actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac",
              "actor/ppo_kl"]
CRITIC_KEYS = ["critic/vf_loss", "critic/grad_norm", "critic/vf_clipfrac", "critic/vpred_mean"]

# name -> (processes, runner arguments)
LAYOUTS = {
    "tp2": (2, ["--tp", "2", "--micro", "3", "--dist-opt", "0,1", "--tasks", "parity,packed,ppo"]),
    "pp2_vpp2": (2, ["--pp", "2", "--vpp", "2", "--micro", "2", "--dist-opt", "0,1", "--tasks", "parity,packed,ppo,resume"]),
    "dp2_dynamic_bsz_packed": (2, ["--dynamic", "--max-tokens", "16", "--packed", "--packed-max-tokens", "24",
                                   "--dist-opt", "0,1", "--tasks", "packed,ppo"]),
    "tp2_pp2": (4, ["--tp", "2", "--pp", "2", "--micro", "2", "--dist-opt", "0,1", "--tasks", "parity,packed,ppo"]),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("megatron_models"))
    for name in tiny.CONFIGS:
        tiny.save_references(tiny.make_model(name, folder))
    return folder


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory) -> dict:
    """The 1-process run: parity, PPO with both optimizers, same-layout resume; saves the checkpoints."""
    out = str(tmp_path_factory.mktemp("layout_ref"))
    ckpt = os.path.join(out, "ckpt")
    launch.torchrun("run_layout.py", 1, ["--models", models, "--out", out, "--micro", "2", "--dist-opt", "0,1",
                                         "--tasks", "parity,packed,ppo,resume", "--save-ckpt", ckpt], LAUNCH_TIMEOUT)
    result = launch.rank_results(out)[0]
    result["ckpt"] = ckpt
    return result


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-6)


def assert_parity(parity: dict, where: str) -> None:
    for model, r in parity.items():
        for key in ("logp_max_diff", "entropy_max_diff", "logits_max_diff"):
            if key in r:
                assert r[key] < PARITY_TOL, f"{where} {model}: {key}={r[key]}"
        for key in ("packed_logp_vs_padded", "packed_entropy_vs_padded"):
            assert r[key] < PACKED_TOL, f"{where} {model}: {key}={r[key]}"
        assert r["export_mismatches"] == [], f"{where} {model}: export differs: {r['export_mismatches']}"


def assert_packed_equals_padded(packed: dict, where: str) -> None:
    for role, r in packed.items():
        for key in ("grad_max_diff", "metric_max_diff", "values"):
            if key in r:
                assert r[key] < PACKED_TOL, f"{where} {role}: packed vs padded {key}={r[key]}"
        assert r["grad_max"] > 1e-3, f"{where} {role}: no gradient reached this rank's parameters"


def assert_same_metrics(got: dict, want: dict, keys: list[str], where: str) -> None:
    for k in keys:
        if k not in want:
            continue
        if k in STRICT:
            assert rel(got[k], want[k]) < REL_TOL, f"{where}: {k} {got[k]} vs 1-process {want[k]}"
        else:
            assert abs(got[k] - want[k]) < ABS_TOL, f"{where}: {k} {got[k]} vs 1-process {want[k]}"


def test_one_process_parity_with_transformers(reference):
    assert set(reference["parity"]) == set(tiny.CONFIGS)
    assert_parity(reference["parity"], "tp1")
    assert_packed_equals_padded(reference["packed"], "tp1")


def test_distributed_optimizer_matches_plain_optimizer(reference):
    ppo = reference["ppo"]
    for step in range(2):
        assert_same_metrics(ppo["actor_do1"][step], ppo["actor_do0"][step], ACTOR_KEYS, f"actor update {step + 1}")
        assert_same_metrics(ppo["critic_do1"][step], ppo["critic_do0"][step], CRITIC_KEYS, f"critic update {step + 1}")
    assert ppo["actor_do0"][0]["actor/update_applied"] == 1.0


def test_resume_same_layout_reproduces_uninterrupted_run(reference):
    r = reference["resume"]
    assert_same_metrics(r["resumed"], r["uninterrupted"], ACTOR_KEYS + ["actor/lr"], "resumed update 2")
    assert r["resumed"]["actor/pg_loss"] != r["first"]["actor/pg_loss"]  # the update changed the model
    assert_same_metrics(r["critic_resumed"], r["critic_uninterrupted"], CRITIC_KEYS, "resumed critic update 2")


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_one_process_run(name, models, reference, tmp_path):
    nproc, args = LAYOUTS[name]
    out = str(tmp_path / name)
    launch.torchrun("run_layout.py", nproc, ["--models", models, "--out", out, "--resume-ckpt", reference["ckpt"],
                                             *args], LAUNCH_TIMEOUT)
    ranks = launch.rank_results(out)
    assert len(ranks) == nproc
    # token-budget micro-batches: every dp rank runs as many as the rank that needs the most (dp2: 2, not 2 and 1)
    assert len({r["packed"]["actor"]["micro_batches"] for r in ranks}) == 1, [r["packed"] for r in ranks]
    want = reference["ppo"]
    for r in ranks:
        where = f"{name} rank {r['rank']}"
        if "parity" in r:
            assert_parity(r["parity"], where)
        assert_packed_equals_padded(r["packed"], where)
        if "resume" in r:  # save and load in this layout
            assert_same_metrics(r["resume"]["resumed"], r["resume"]["uninterrupted"], ACTOR_KEYS + ["actor/lr"],
                                f"{where} resumed update 2")
            assert_same_metrics(r["resume"]["critic_resumed"], r["resume"]["critic_uninterrupted"], CRITIC_KEYS,
                                f"{where} resumed critic update 2")
        for key, got in r.get("ppo", {}).items():
            if key.startswith("actor_do") or key.startswith("critic_do"):
                keys = ACTOR_KEYS if key.startswith("actor") else CRITIC_KEYS
                for step in range(2):
                    assert_same_metrics(got[step], want[key][step], keys, f"{where} {key} update {step + 1}")
            elif key.startswith("actor_resumed_do"):
                do = key[-1]
                assert_same_metrics(got, want[f"actor_do{do}"][1], ACTOR_KEYS, f"{where} resumed update 2 (do={do})")
            elif key.startswith("critic_values_do"):
                per_dp = 6 // r["dp_size"]  # rows of this rank, as run_layout.dp_slice picks them
                rows = [k * 6 + r["dp_rank"] * per_dp + i for k in range(2) for i in range(per_dp)]
                ref_rows = [want[key][i] for i in rows]
                assert max(abs(a - b) for ra, rb in zip(got, ref_rows) for a, b in zip(ra, rb)) < 1e-5, where
