"""A mixture of experts on transformer-engine layers, one GPU (issue 38): the experts as TE's grouped GEMM
(TEGroupedMLP, one GroupedLinear a layer holding local expert i as linear_fc1.weight{i} / linear_fc2.weight{i}) and
as one TE linear per expert (override_transformer_config.moe_grouped_gemm=false: SequentialMLP), on a small random
Qwen3-MoE imported from HF format:
  * the modules built are the ones asked for, and the mapping reads the grouped names from the model;
  * export gives back the bf16 HF tensors bitwise under both namings (gate/up order of the grouped fc1 included);
  * log-probs close to transformers (bf16 and fp32) and to each other; one PPO update's loss and grad norm agree;
  * packed micro-batches (THD) give the padded path's log-probs.
Gaps are printed with an `[moe te]` prefix (run with -s). Skipped without CUDA or transformer_engine:
    python -m pytest tests/gpu/test_megatron_moe_te.py -q -s
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

from tests.gpu.test_megatron_te import COMMON, build, gap, hf_reference, make_batch, ppo_data  # noqa: E402

MOE = dict(COMMON, moe_intermediate_size=256, num_experts=8, num_experts_per_tok=2, head_dim=64, norm_topk_prob=True,
           decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False, router_aux_loss_coef=0.0)
SEQUENTIAL = {"moe_grouped_gemm": False}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    path = str(tmp_path_factory.mktemp("qwen3_moe"))
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**MOE)).to(torch.bfloat16)
    with torch.no_grad():  # random norms so that their mapping matters
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    return path


def _exports_bitwise(actor, path: str) -> int:
    from safetensors.torch import load_file

    want = load_file(f"{path}/model.safetensors")
    seen = 0
    for bucket in actor.export_weights(bucket_bytes=64 << 20):
        for hf_name, t in bucket:
            assert torch.equal(t.cpu(), want[hf_name]), hf_name
            seen += 1
    return seen


def test_grouped_and_sequential_te_experts_export_bitwise_and_agree(model_dir, layout):
    from megatron.core.transformer.moe.experts import SequentialMLP, TEGroupedMLP

    from hybridrl.adapters.megatron.builder import unwrap
    from hybridrl.adapters.megatron.weights import topology
    from hybridrl.protocol import DataProto

    grouped = build(model_dir, layout, "transformer_engine")
    sequential = build(model_dir, layout, "transformer_engine", overrides=SEQUENTIAL)
    experts = [unwrap(a.engine.chunks[0]).decoder.layers[0].mlp.experts for a in (grouped, sequential)]
    assert isinstance(experts[0], TEGroupedMLP) and isinstance(experts[1], SequentialMLP)
    names = {n for n, _ in unwrap(grouped.engine.chunks[0]).named_parameters()}
    assert "decoder.layers.0.mlp.experts.linear_fc1.weight7" in names
    assert topology(grouped.engine.chunks, layout, value_head=False).grouped_experts
    assert not topology(sequential.engine.chunks, layout, value_head=False).grouped_experts
    counts = [_exports_bitwise(a, model_dir) for a in (grouped, sequential)]
    assert counts[0] == counts[1] > MOE["num_experts"] * 3 * MOE["num_hidden_layers"]

    batch = make_batch()
    mask = batch["response_mask"]
    out = [a.compute_log_prob(DataProto.from_dict(batch), calculate_entropy=True).batch for a in (grouped, sequential)]
    report = {f"grouped_vs_hf_{k}": gap(out[0]["log_probs"], hf_reference(model_dir, batch, d), mask)
              for k, d in (("bf16", torch.bfloat16), ("fp32", torch.float32))}
    report["grouped_vs_sequential_logp"] = gap(out[0]["log_probs"], out[1]["log_probs"], mask)
    data = ppo_data(grouped, seed=3)  # once, before either update: both update from the same batch and weights
    steps = [a.update_policy(data) for a in (grouped, sequential)]
    report["pg_loss"] = [s["actor/pg_loss"] for s in steps]
    report["grad_norm"] = [s["actor/grad_norm"] for s in steps]
    print("\n[moe te] " + json.dumps(report))
    assert report["grouped_vs_hf_fp32"]["mean"] < 0.05 and report["grouped_vs_hf_bf16"]["mean"] < 0.05
    assert report["grouped_vs_sequential_logp"]["mean"] < 0.02  # the same GEMMs, other kernels (bf16)
    assert abs(steps[1]["actor/grad_norm"] / steps[0]["actor/grad_norm"] - 1) < 0.05


def test_grouped_experts_packed_micro_batches_equal_the_padded_path(model_dir, layout):
    from hybridrl.protocol import DataProto

    padded = build(model_dir, layout, "transformer_engine")
    packed = build(model_dir, layout, "transformer_engine", packed=True)
    batch = make_batch(seed=2)
    a = padded.compute_log_prob(DataProto.from_dict(batch)).batch["log_probs"]
    b = packed.compute_log_prob(DataProto.from_dict(batch)).batch["log_probs"]
    report = gap(b, a, batch["response_mask"])
    print("\n[moe te packed vs padded] " + json.dumps(report))
    assert report["mean"] < 1e-2  # bf16 kernels of other shapes; a routing flip moves a token by more
