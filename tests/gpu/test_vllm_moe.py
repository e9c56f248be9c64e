"""A mixture-of-experts model through the hybrid engine on one GPU (issue 20): a tiny random Qwen3-MoE (2 layers,
8 experts, top-2) synced from the Megatron actor into vLLM's fused MoE layers (CUDA graphs on), rollout routing
recorded, the actor's routing agreement and router replay (R3). Skipped without CUDA or vLLM. Prints its numbers
with a `[moe gpu]` prefix."""
from __future__ import annotations

import argparse
import os
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

SHAPE = dict(vocab_size=32000, hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_experts=8,
             num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             tie_word_embeddings=False, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
             max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6)
PROMPTS, PROMPT_LEN, MAX_TOKENS = 32, 32, 32


def make_moe_model(folder: str) -> str:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from hybridrl.data.tokenizer import build_tiny_tokenizer

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**SHAPE)).to(torch.bfloat16)
    model.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    build_tiny_tokenizer().save_pretrained(folder)
    return folder


def _export(worker) -> dict[str, torch.Tensor]:
    """The actor's HF-named weights, as the sync sends them (inside a rollout phase)."""
    offloaded = worker.sync.options.param_offload
    if offloaded:  # the sync offloads the params once it is done: bring them back to export
        worker.actor.onload(params=True, grads=False, optimizer=False)
    sent = {n: t.detach().clone() for bucket in worker.actor.export_weights(1 << 30) for n, t in bucket}
    if offloaded:
        worker.actor.offload(params=True, grads=False, optimizer=False)
    return sent


def _engine_params(worker, layer: int) -> dict[str, torch.Tensor]:
    """vLLM's own parameters of one layer's MoE block (router and the fused w13 / w2), copied out."""
    prefix = f"layers.{layer}.mlp."

    def read(model):
        return {n: p.detach().clone() for n, p in model.named_parameters() if prefix in n}

    return worker.engine.llm.apply_model(read)[0]


def sync_equality(worker, step: int) -> dict:
    """In one rollout phase (a sync and its per-sync checks): the engine's checksums of every weight against the
    actor's export, and layer 0's router and fused experts compared tensor by tensor."""
    bad = []
    with worker.sync.rollout_phase(step) as metrics:
        sent = _export(worker)
        sums = {n: (float(t.double().sum()), float(t.double().abs().sum())) for n, t in sent.items()}
        engine = worker.engine.weight_checksums(list(sums))
        for name in sums:
            parts = worker.engine.checksum_terms(name)
            want = sum(c * sums[m][0] for m, c in parts)
            scale = sum(abs(c) * sums[m][1] for m, c in parts)
            if not abs(engine[name] - want) <= 1e-6 * scale:
                bad.append(name)
        own = _engine_params(worker, 0)
    w13 = next(t for n, t in own.items() if n.endswith("w13_weight"))
    w2 = next(t for n, t in own.items() if n.endswith("w2_weight"))
    gate = next(t for n, t in own.items() if n.endswith("gate.weight"))
    pre = "model.layers.0.mlp."
    E, f = SHAPE["num_experts"], SHAPE["moe_intermediate_size"]
    want13 = torch.stack([torch.cat([sent[f"{pre}experts.{e}.gate_proj.weight"], sent[f"{pre}experts.{e}.up_proj.weight"]])
                          for e in range(E)])
    want2 = torch.stack([sent[f"{pre}experts.{e}.down_proj.weight"] for e in range(E)])
    return {"checksum_mismatches": bad, "checked": len(sums), "metrics": dict(metrics),
            "w13_shape": tuple(w13.shape), "w13_equal": bool(torch.equal(w13, want13.to(w13))),
            "w2_shape": tuple(w2.shape), "w2_equal": bool(torch.equal(w2, want2.to(w2))),
            "gate_equal": bool(torch.equal(gate, sent[f"{pre}gate.weight"].to(gate))), "f": f}


def _log_probs(worker, out, replay: bool):
    from hybridrl.hybrid.checks import logprob_gap, routing_agreement

    routing = worker.actor.routing
    before, routing.replay = routing.replay, replay
    try:
        lp = worker.compute_log_prob(out).batch
    finally:
        routing.replay = before
    mask = out.batch["response_mask"]
    gap = logprob_gap(out.batch["rollout_log_probs"], lp["old_log_probs"], mask)
    agree = routing_agreement({"response_mask": mask, "routing_agreement": lp["routing_agreement"]})
    return gap["rollout_vs_actor/logprob_abs_diff_mean"], agree


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    pytest.importorskip("vllm")
    from tests.fixtures.child import in_child  # one vLLM engine per process (tests/fixtures/child.py)

    return in_child(_moe_run, str(tmp_path_factory.mktemp("qwen3_moe_tiny")))


def _moe_run(folder: str) -> dict:
    import hybrid_bench as hb

    model_dir = make_moe_model(folder)
    args = argparse.Namespace(prompts=PROMPTS, prompt_len=PROMPT_LEN, max_tokens=MAX_TOKENS, gpu_util=0.3, eager=False)
    overrides = hb.config_overrides(args, model_dir) + [
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=true", "actor_rollout_ref.actor.router_replay.mode=R3"]
    worker, _, _ = hb.start_worker(overrides, model_dir, max_rollout_rows=PROMPTS)
    assert worker.actor.routing is not None and worker.actor.routing.replay, "the actor was not built with R3"
    prompts = hb.make_prompts(PROMPTS, PROMPT_LEN, SHAPE["vocab_size"])
    out = worker.generate_sequences(prompts)  # the first sync (export + load_weights, then the direct copy plan)
    out.meta_info["temperature"] = 1.0
    first_sync = {k: v for k, v in out.meta_info["metrics"].items() if k.startswith(("reshard/", "sync_check/"))}
    r = {"routed_experts": out.batch["routed_experts"].cpu(), "first_sync": first_sync,
         "sync": sync_equality(worker, 500)}
    r["gap_noreplay"], r["agree"] = _log_probs(worker, out, replay=False)
    r["gap_replay"], r["agree_replay"] = _log_probs(worker, out, replay=True)
    worker.actor.routing.replay = False  # the follow check compares plain forwards
    r.update(hb.follow_check(worker, prompts))
    worker.actor.routing.replay = True
    print(f"[moe gpu] first sync {first_sync}", flush=True)
    s = r["sync"]
    print(f"[moe gpu] sync: {s['checked']} weights checked, checksum mismatches {len(s['checksum_mismatches'])}; "
          f"layer 0 w13 {s['w13_shape']} equal {s['w13_equal']}, w2 {s['w2_shape']} equal {s['w2_equal']}, router "
          f"equal {s['gate_equal']}; direct bytes {s['metrics'].get('reshard/direct_bytes')} of "
          f"{s['metrics'].get('reshard/bytes')}", flush=True)
    print(f"[moe gpu] routed_experts {tuple(out.batch['routed_experts'].shape)}; routing agreement {r['agree']} "
          f"(R3 pass {r['agree_replay']})", flush=True)
    print(f"[moe gpu] rollout-vs-actor log-prob gap: without replay {r['gap_noreplay']:.5f}, with R3 "
          f"{r['gap_replay']:.5f}", flush=True)
    print(f"[moe gpu] follow: mismatches {len(r['fresh_mismatches'])}, gap to the changed actor {r['follow_gap']:.5f}, "
          f"to the unchanged one {r['stale_gap']:.5f}", flush=True)
    return r


@pytest.mark.timeout(600)
def test_every_vllm_parameter_equals_the_actors_export(result):
    s = result["sync"]
    assert s["checksum_mismatches"] == [], s["checksum_mismatches"][:5]
    # vLLM's FusedMoE (tp_g=1): w13 [E, 2f, h] = [gate rows; up rows] per expert, w2 [E, h, f], bitwise the actor's
    E, f, h = SHAPE["num_experts"], SHAPE["moe_intermediate_size"], SHAPE["hidden_size"]
    assert s["w13_shape"] == (E, 2 * f, h) and s["w2_shape"] == (E, h, f)
    assert s["w13_equal"] and s["w2_equal"] and s["gate_equal"]


@pytest.mark.timeout(600)
def test_rollout_log_probs_follow_changed_actor_weights(result):
    assert result["fresh_mismatches"] == [], result["fresh_mismatches"][:5]
    assert result["follow_gap"] < 0.05, result["follow_gap"]
    assert result["stale_gap"] > 5 * result["follow_gap"], (result["follow_gap"], result["stale_gap"])


@pytest.mark.timeout(600)
def test_rollout_returns_routing_and_the_actor_mostly_agrees(result):
    routed = result["routed_experts"]
    L, k, E = SHAPE["num_hidden_layers"], SHAPE["num_experts_per_tok"], SHAPE["num_experts"]
    assert tuple(routed.shape) == (PROMPTS, PROMPT_LEN + MAX_TOKENS, L, k), routed.shape
    # every position a forward pass ran (all but the last sampled token: prompts are full length, ignore_eos)
    ran = routed[:, : PROMPT_LEN + MAX_TOKENS - 1]
    assert bool((ran >= 0).all()) and bool((ran < E).all())
    # a token's k experts are distinct
    assert bool((ran.sort(-1).values.diff(dim=-1) != 0).all())
    # bf16 engines (vLLM's Triton fused MoE, megatron's per-expert MLPs): a flip needs a bf16 rounding difference
    # larger than the gap between the k-th and (k+1)-th gating logit; on this 2-layer model that is rare
    assert result["agree"]["rollout_vs_actor/routing_agreement"] > 0.9, result["agree"]


@pytest.mark.timeout(600)
def test_router_replay_brings_the_actor_closer_to_the_rollout(result):
    # R3: the actor routes each token to the rollout's experts; what remains is bf16 rounding in the experts
    assert result["gap_replay"] <= result["gap_noreplay"] * 1.02 + 1e-4, (result["gap_replay"], result["gap_noreplay"])
    assert result["gap_replay"] < 0.05, result["gap_replay"]
