"""megatron-core backend on CPU (gloo, fp32) in several tp/pp/vpp/dp layouts.

One torchrun launch per number of ranks runs all the checks of its layouts, one layout after the other (run_layout.py):
  * parity: log-probs, entropy, sum of squared probabilities (chunked, vocab-parallel) and raw logits vs
    transformers on the same weights (max abs diff < 1e-4) for tiny random Llama (llama3 rope scaling, untied), Qwen2 (qkv bias, tied), Qwen3
    (q/k norm) and Mistral (sliding window) models with GQA and a vocab (1001) not divisible by tp;
    export_hf_weights gives back the HF tensors bitwise, and lets go of a bucket before gathering the next;
  * PPO: two actor updates (2 optimizer steps each, KL loss + entropy bonus) and two critic updates
    give the same losses, metrics and grad norms as the 1-process run (relative diff < 1e-5), with
    the distributed optimizer on and off, other micro-batch sizes and dynamic batching;
  * PPO gradient (1 process): the dense actor's update_policy up to its optimizer step against transformers'
    autograd of the PPO loss written out in float64 (clip, dual clip, low_var_kl, token-mean), some ratios clipped;
  * resume: update 2 from the 1-process run's checkpoint (saved after update 1) in this layout equals
    the uninterrupted update 2;
  * mixture of experts: parity (and the export) of tiny Qwen3-MoE, Qwen2-MoE (shared expert) and Mixtral
    models, 8 experts, and their gradients against transformers' autograd; two PPO updates of the Qwen3-MoE actor
    with the load-balancing loss and z-loss on, in ep=2 and ep=2 x tp=2 (experts split over etp=2, sequence
    parallel), against the 1-process run: losses, grad norms, router-loss metrics, log-probs after the updates,
    and update 2 resumed from the 1-process checkpoint (ep=1 -> ep=2); routing against a rollout's (a quarter of
    its choices changed): the agreement per response token and, with routing replay (R3), the log-probs of a
    transformers forward forced to that routing, in one process and in ep=2 x tp=2;
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
STRICT = {"actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "critic/vf_loss", "critic/grad_norm",
          "actor/moe_load_balancing_loss"}
ACTOR_KEYS = ["actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac",
              "actor/ppo_kl"]
CRITIC_KEYS = ["critic/vf_loss", "critic/grad_norm", "critic/vf_clipfrac", "critic/vpred_mean"]
MOE_KEYS = ACTOR_KEYS + ["actor/moe_load_balancing_loss"]
# Under sequence parallelism each tp rank reports the z-loss of its own tokens; the metric averages the ranks'
# means (megatron tracks per-rank means), not the token mean of one process. Its gradient is exact (grad_norm).
Z_LOSS_REL_TOL = 2e-3
MOE = ",".join(tiny.MOE)

# name -> (processes, runner arguments)
LAYOUTS = {
    "tp2": (2, ["--tp", "2", "--micro", "3", "--dist-opt", "0,1", "--tasks", "parity,packed,ppo"]),
    "pp2_vpp2": (2, ["--pp", "2", "--vpp", "2", "--micro", "2", "--dist-opt", "0,1",
                     "--tasks", "parity,packed,ppo,resume", "--parity-models", ",".join(tiny.CONFIGS)]),
    "dp2_dynamic_bsz_packed": (2, ["--dynamic", "--max-tokens", "16", "--packed", "--packed-max-tokens", "24",
                                   "--dist-opt", "0,1", "--tasks", "packed,ppo"]),
    "tp2_pp2": (4, ["--tp", "2", "--pp", "2", "--micro", "2", "--dist-opt", "0,1", "--tasks", "parity,packed,ppo"]),
    "ep2": (2, ["--ep", "2", "--dist-opt", "0,1", "--tasks", "parity,moe_ppo", "--parity-models", MOE]),
    "ep2_tp2": (4, ["--ep", "2", "--tp", "2", "--sp", "--dist-opt", "1", "--tasks", "parity,moe_ppo,routing",
                    "--parity-models", MOE]),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("megatron_models"))
    for name in tiny.CONFIGS:
        tiny.save_references(tiny.make_model(name, folder))
    tiny.save_routing_references(os.path.join(folder, "qwen3_moe"))
    for name in tiny.MOE:
        tiny.save_grad_references(os.path.join(folder, name))
    tiny.save_ppo_grad_references(os.path.join(folder, "qwen2"))
    return folder


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory) -> dict:
    """The 1-process run: parity, PPO with both optimizers, same-layout resume; saves the checkpoints."""
    out = str(tmp_path_factory.mktemp("layout_ref"))
    ckpt = os.path.join(out, "ckpt")
    launch.torchrun("run_layout.py", 1, ["--models", models, "--out", out, "--micro", "2", "--dist-opt", "0,1",
                                         "--tasks", "parity,packed,ppo,resume,moe_ppo,routing,moe_grad,ppo_grad",
                                         "--save-ckpt", ckpt, "--parity-models", ",".join(tiny.CONFIGS)], LAUNCH_TIMEOUT)
    result = launch.rank_results(out)[0]
    result["ckpt"] = ckpt
    return result


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-6)


def assert_parity(parity: dict, where: str) -> None:
    for model, r in parity.items():
        for key in ("logp_max_diff", "entropy_max_diff", "logits_max_diff", "sum_pi_squared_max_diff",
                    "sum_pi_squared_off_mask"):
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


def assert_routing(routing: dict, where: str) -> None:
    """Against transformers (tiny.save_routing_references): without replay the actor routes on its own (parity)
    and its agreement with the changed rollout routing is exactly the unchanged fraction per response token;
    with replay (R3) its log-probs are those of the forward forced to the rollout's routing."""
    off, r3 = routing["disabled"], routing["R3"]
    assert off["logp_max_diff"] < PARITY_TOL and r3["logp_max_diff"] < PARITY_TOL, f"{where}: {routing}"
    assert off["agreement_max_diff"] == 0.0 and 0.6 < off["agreement_mean"] < 0.85, f"{where}: {off}"
    assert r3["update"]["actor/update_applied"] == 1.0, where


def test_ppo_gradient_matches_the_loss_written_out_in_float64(reference):
    """The actor's whole PPO update path (mini-batch, micro-batches, advantages and old/ref log-probs per row, the
    clipped and dual-clipped ratio, low_var_kl, token-mean over the mini-batch) against transformers' autograd
    of the loss as tiny.save_ppo_grad_references writes it, on rows where some ratios are clipped."""
    r = reference["ppo_grad"]
    assert 0.05 < r["clipped_fraction"] < 0.8, r  # the clip is exercised, not only the unclipped ratio
    assert abs(r["pg_clipfrac"] - r["clipped_fraction"]) < 1e-6, r
    assert len(r["grads"]) == 5
    for name, diff in r["grads"].items():
        assert diff < PARITY_TOL, f"{name}: PPO gradient differs from the float64 reference by {diff} (relative)"


def test_moe_gradients_match_transformers_autograd(reference):
    """Router (through the routing weights: softmax then top-k, or top-k renormalised), routed experts and the
    shared expert with its sigmoid gate, for Qwen3-MoE, Qwen2-MoE and Mixtral (max |diff| / max |grad|)."""
    for model, per_param in reference["moe_grad"].items():
        assert len(per_param) >= 10, model
        for name, diff in per_param.items():
            assert diff < PARITY_TOL, f"{model} {name}: gradient differs from transformers by {diff} (relative)"


def test_moe_routing_agreement_and_replay_match_transformers(reference):
    assert_routing(reference["routing"], "tp1")


def test_moe_router_losses_are_reported_and_differ_between_updates(reference):
    steps = reference["moe_ppo"]["actor_do0"]
    for key in ("actor/moe_load_balancing_loss", "actor/moe_z_loss"):
        assert all(s[key] > 0 for s in steps) and steps[0][key] != steps[1][key], key


def test_resume_same_layout_reproduces_uninterrupted_run(reference):
    r = reference["resume"]
    assert_same_metrics(r["resumed"], r["uninterrupted"], ACTOR_KEYS + ["actor/lr"], "resumed update 2")
    assert r["resumed"]["actor/pg_loss"] != r["first"]["actor/pg_loss"]  # the update changed the model
    assert_same_metrics(r["critic_resumed"], r["critic_uninterrupted"], CRITIC_KEYS, "resumed critic update 2")


# The layouts of one size share a torchrun launch (run_layout.py --next): each rank's start-up (torch, transformers,
# megatron-core imports, ~8 s of CPU) is paid once per size instead of once per layout. In launch order: the MoE
# layouts last (megatron keeps MoE loss trackers in module globals), the one layout without the parity check first.
SHARED_LAUNCHES = (("dp2_dynamic_bsz_packed", "tp2", "pp2_vpp2", "ep2"), ("tp2_pp2", "ep2_tp2"))


@pytest.fixture(scope="module")
def layout_runs(models, reference, tmp_path_factory):
    """name -> its ranks' results, or the launch's error; a shared launch runs when the first of its layouts is
    tested (within that test's timeout) and its outcome is kept for the others."""
    done: dict = {}

    def results(name: str):
        if name not in done:
            names = next(group for group in SHARED_LAUNCHES if name in group)
            nprocs = {LAYOUTS[n][0] for n in names}
            assert len(nprocs) == 1, f"a shared launch needs one number of ranks: {names}"
            root = tmp_path_factory.mktemp("layouts")
            argv: list[str] = []
            for n in names:
                argv += [*(["--next"] if argv else []), "--models", models, "--out", str(root / n),
                         "--resume-ckpt", reference["ckpt"], *LAYOUTS[n][1]]
            nproc = nprocs.pop()
            try:
                launch.torchrun("run_layout.py", nproc, argv, LAUNCH_TIMEOUT)
                done.update({n: launch.rank_results(str(root / n)) for n in names})
            except AssertionError as e:
                # the layouts that finished before the failure (every rank wrote its file) are still checked
                for n in names:
                    ranks = launch.rank_results(str(root / n))
                    done[n] = ranks if len(ranks) == nproc else f"the launch of layouts {', '.join(names)} failed: {e}"
        if isinstance(done[name], str):
            raise AssertionError(done[name])
        return done[name]
    return results


def test_every_layout_is_launched():
    assert sorted(n for group in SHARED_LAUNCHES for n in group) == sorted(LAYOUTS)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_one_process_run(name, layout_runs, reference):
    nproc, args = LAYOUTS[name]
    ranks = layout_runs(name)
    assert len(ranks) == nproc
    # token-budget micro-batches: every dp rank runs as many as the rank that needs the most (dp2: 2, not 2 and 1)
    packed = "packed" in args[args.index("--tasks") + 1].split(",")  # dense layouts; MoE ones check it in parity
    if packed:
        assert len({r["packed"]["actor"]["micro_batches"] for r in ranks}) == 1, [r["packed"] for r in ranks]
    want = reference["ppo"]
    for r in ranks:
        where = f"{name} rank {r['rank']}"
        if "parity" in r:
            assert_parity(r["parity"], where)
        if packed:
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
                assert_same_rows(got, want[key], r, 1e-5, where)
        for key, got in r.get("moe_ppo", {}).items():
            assert_same_moe(key, got, reference["moe_ppo"], r, f"{where} moe {key}")
        if "routing" in r:
            assert_routing(r["routing"], where)
            mine, theirs = r["routing"]["R3"]["update"], reference["routing"]["R3"]["update"]
            assert_same_metrics(mine, theirs, MOE_KEYS, f"{where} update with routing replay")


def assert_same_rows(got: list, want: list, rank: dict, tol: float, where: str) -> None:
    """Per-row outputs of this dp rank against the 1-process rows it holds."""
    per_dp = 6 // rank["dp_size"]  # rows of this rank, as run_layout.dp_slice picks them
    rows = [k * 6 + rank["dp_rank"] * per_dp + i for k in range(2) for i in range(per_dp)]
    diff = max(abs(a - b) for ra, rb in zip(got, [want[i] for i in rows]) for a, b in zip(ra, rb))
    assert diff < tol, f"{where}: max diff {diff}"


def assert_same_moe(key: str, got, want: dict, rank: dict, where: str) -> None:
    do = key[-1]
    if key.startswith("log_probs_do"):
        assert_same_rows(got, want[key], rank, 1e-5, where)
        return
    steps = [(got, want[f"actor_do{do}"][1])] if key.startswith("actor_resumed") else zip(got, want[key])
    for mine, theirs in steps:
        assert_same_metrics(mine, theirs, MOE_KEYS, where)
        z = "actor/moe_z_loss"
        assert rel(mine[z], theirs[z]) < Z_LOSS_REL_TOL, f"{where}: {z} {mine[z]} vs 1-process {theirs[z]}"
