"""transformer-engine layer spec on one GPU (NCCL, bf16), chosen with `*.megatron.transformer_impl`.

Checks, on small random Qwen2 (qkv bias, tied embeddings) and Qwen3 (q/k norm) models imported from HF format:
  * the TE spec is built (fused norm+linear, TE attention) and its parameters are the mapping's TE names;
  * export gives back the bf16 HF tensors bitwise (the one mapping, TE names);
  * log-probs and entropy close to transformers (bf16 and fp32) and to the local spec on the same weights;
  * packed micro-batches (TE's THD varlen attention) give the padded path's log-probs and update;
  * FP8 (hybrid format, delayed and current=tensorwise scaling) runs a PPO update; its log-prob gap to bf16.
Gaps are printed (run with -s). Skipped without CUDA or transformer_engine:
    python -m pytest tests/gpu/test_megatron_te.py -q -s
"""
from __future__ import annotations

import json

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("megatron.core")
pytest.importorskip("transformer_engine")

PROMPT, RESPONSE, SAMPLES = 48, 80, 16
SHAPES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=False, head_dim=64)),
}
COMMON = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=2, max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6,
              bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    import transformers

    out = {}
    for name, (cfg_cls, model_cls, extra) in SHAPES.items():
        path = str(tmp_path_factory.mktemp(name))
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**COMMON, **extra)).to(torch.bfloat16)
        with torch.no_grad():  # random norms and biases so that their mapping matters
            for n, p in model.named_parameters():
                if "norm" in n or n.endswith(".bias"):
                    p.add_(torch.randn_like(p) * 0.1)
        model.save_pretrained(path)
        out[name] = path
    return out


def make_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded responses of random lengths (a GSM8K-like spread)."""
    g = torch.Generator().manual_seed(seed)
    T = PROMPT + RESPONSE
    ids = torch.randint(10, COMMON["vocab_size"] - 10, (SAMPLES, T), generator=g)
    mask = torch.ones(SAMPLES, T, dtype=torch.long)
    resp_mask = torch.ones(SAMPLES, RESPONSE)
    for i in range(SAMPLES):
        pad = int(torch.randint(0, PROMPT // 2, (1,), generator=g))
        cut = int(torch.randint(8, RESPONSE + 1, (1,), generator=g))
        mask[i, :pad] = 0
        mask[i, PROMPT + cut:] = 0
        resp_mask[i, cut:] = 0
    ids = ids * mask
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": ids[:, PROMPT:].clone(), "response_mask": resp_mask}


def build(path: str, layout, impl: str, packed: bool = False, overrides: dict | None = None):
    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.config.layout import BatchPlan
    from hybridrl.config.schema.actor import ActorConfig, ModelConfig
    from hybridrl.config.schema.common import MegatronConfig, OptimConfig

    megatron = MegatronConfig(use_distributed_optimizer=True, sequence_parallel=False, seed=1, transformer_impl=impl,
                              override_transformer_config=overrides or {})
    actor = ActorConfig(ppo_mini_batch_size=SAMPLES, ppo_micro_batch_size_per_gpu=4, loss_agg_mode="token-mean",
                        optim=OptimConfig(lr=1e-5, clip_grad=1.0, total_training_steps=10), megatron=megatron)
    plan = BatchPlan(samples_per_step=SAMPLES, mini_batch_samples=SAMPLES, mini_batches_per_epoch=1, ppo_epochs=1,
                     mini_batch_per_dp=SAMPLES, micro_batch_per_gpu=4, grad_accum=SAMPLES // 4, use_dynamic_bsz=False,
                     max_token_len_per_gpu=8192, forward_micro_batch_per_gpu=8, forward_max_token_len_per_gpu=8192)
    return MegatronActor(ModelConfig(path=path, use_remove_padding=packed), actor, layout, plan)


@torch.no_grad()
def hf_reference(path: str, batch: dict, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).cuda().eval()
    logits = model(input_ids=batch["input_ids"].cuda(), attention_mask=batch["attention_mask"].cuda(),
                   position_ids=batch["position_ids"].cuda()).logits[:, PROMPT - 1:-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, batch["responses"].cuda()[..., None]).squeeze(-1)
    del model
    torch.cuda.empty_cache()
    return logp.cpu()


def gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    d = (a - b)[mask.bool()].abs()
    return {"max": float(d.max()), "mean": float(d.mean())}


def ppo_data(actor, seed: int):
    from hybridrl.protocol import DataProto

    batch = make_batch(seed)
    data = DataProto.from_dict(batch, meta_info={"temperature": 1.0})
    data.batch["old_log_probs"] = actor.compute_log_prob(data).batch["log_probs"]
    g = torch.Generator().manual_seed(seed + 1)
    data.batch["advantages"] = torch.randn(batch["responses"].shape, generator=g) * batch["response_mask"]
    return data


@pytest.mark.parametrize("name", list(SHAPES))
def test_te_spec_parameters_export_and_log_probs(name, models, layout):
    from megatron.core.extensions.transformer_engine import TEDotProductAttention, TELayerNormColumnParallelLinear
    from safetensors.torch import load_file

    from hybridrl.adapters.megatron.builder import unwrap
    from hybridrl.adapters.megatron.weights import topology
    from hybridrl.protocol import DataProto

    path = models[name]
    te = build(path, layout, "transformer_engine")
    model = unwrap(te.engine.chunks[0])
    layer = model.decoder.layers[0]
    assert isinstance(layer.self_attention.linear_qkv, TELayerNormColumnParallelLinear)
    assert isinstance(layer.self_attention.core_attention, TEDotProductAttention)
    assert topology(te.engine.chunks, layout, value_head=False).te_names

    want = load_file(f"{path}/model.safetensors")
    seen = 0
    for bucket in te.export_weights(bucket_bytes=64 << 20):
        for hf_name, t in bucket:
            assert torch.equal(t.cpu(), want[hf_name]), hf_name
            seen += 1
    assert seen == len([k for k in want if not (k == "lm_head.weight" and SHAPES[name][2]["tie_word_embeddings"])])

    batch = make_batch()
    mask = batch["response_mask"]
    out = te.compute_log_prob(DataProto.from_dict(batch), calculate_entropy=True).batch
    local = build(path, layout, "local").compute_log_prob(DataProto.from_dict(batch), calculate_entropy=True).batch
    report = {f"te_vs_hf_{k}": gap(out["log_probs"], hf_reference(path, batch, d), mask)
              for k, d in (("bf16", torch.bfloat16), ("fp32", torch.float32))}
    report["te_vs_local_logp"] = gap(out["log_probs"], local["log_probs"], mask)
    report["te_vs_local_entropy"] = gap(out["entropys"], local["entropys"], mask)
    print(f"\n[te {name}] " + json.dumps(report))
    assert report["te_vs_hf_fp32"]["mean"] < 0.05 and report["te_vs_hf_bf16"]["mean"] < 0.05
    assert report["te_vs_local_logp"]["mean"] < 0.05 and report["te_vs_local_entropy"]["mean"] < 0.05


def test_te_packed_micro_batches_equal_the_padded_path(models, layout):
    from hybridrl.protocol import DataProto

    padded = build(models["qwen2"], layout, "transformer_engine")
    packed = build(models["qwen2"], layout, "transformer_engine", packed=True)
    batch = make_batch(seed=2)
    a = padded.compute_log_prob(DataProto.from_dict(batch), calculate_entropy=True).batch
    b = packed.compute_log_prob(DataProto.from_dict(batch), calculate_entropy=True).batch
    report = {"logp": gap(b["log_probs"], a["log_probs"], batch["response_mask"]),
              "entropy": gap(b["entropys"], a["entropys"], batch["response_mask"])}
    data = ppo_data(padded, seed=4)
    steps = [role.update_policy(data) for role in (padded, packed)]
    report["pg_loss"] = [s["actor/pg_loss"] for s in steps]
    report["grad_norm"] = [s["actor/grad_norm"] for s in steps]
    print("\n[te packed vs padded] " + json.dumps(report))
    assert report["logp"]["mean"] < 5e-3 and report["entropy"]["mean"] < 5e-3  # bf16 kernels of other shapes
    assert abs(steps[1]["actor/grad_norm"] / steps[0]["actor/grad_norm"] - 1) < 0.02
    assert abs(steps[1]["actor/pg_loss"] - steps[0]["actor/pg_loss"]) < 1e-2


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_fp8_update_runs_and_its_log_prob_gap_is_reported(recipe, models, layout):
    from hybridrl.protocol import DataProto

    bf16 = build(models["qwen2"], layout, "transformer_engine", packed=True)
    fp8 = build(models["qwen2"], layout, "transformer_engine", packed=True,
                overrides={"fp8": "hybrid", "fp8_recipe": recipe})
    assert fp8.engine.config.fp8 == "hybrid"
    batch = make_batch(seed=6)
    ref = bf16.compute_log_prob(DataProto.from_dict(batch)).batch["log_probs"]
    got = fp8.compute_log_prob(DataProto.from_dict(batch)).batch["log_probs"]
    data = ppo_data(fp8, seed=8)
    metrics = [fp8.update_policy(data) for _ in range(2)]
    report = {"fp8_vs_bf16_logp": gap(got, ref, batch["response_mask"]), "grad_norm": [m["actor/grad_norm"] for m in metrics]}
    print(f"\n[fp8 {recipe}] " + json.dumps(report))
    assert all(torch.isfinite(torch.tensor(m["actor/grad_norm"])) and m["actor/update_applied"] == 1.0 for m in metrics)
    assert report["fp8_vs_bf16_logp"]["mean"] < 0.5
