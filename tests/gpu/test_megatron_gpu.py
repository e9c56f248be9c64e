"""megatron-core backend on one GPU (NCCL, bf16): a Qwen2.5-0.5B-shaped random model imported from HF format.

Checks: bf16 log-probs and entropy vs transformers on the same weights (the gap is printed; run with -s),
export gives back the bf16 HF tensors bitwise, first-update ppo_kl ~ 0, a few PPO updates stay finite
and change the model, offload/onload frees GPU memory and restores every byte.
Skipped without CUDA or megatron-core. `python -m pytest tests/gpu/test_megatron_gpu.py -q -s`.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("megatron.core")

# Qwen2.5-0.5B's shape (random weights).
SHAPE = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
             num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
             tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643)
PROMPT, RESPONSE, SAMPLES = 64, 128, 16


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = str(tmp_path_factory.mktemp("qwen2_0p5b"))
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE)).to(torch.bfloat16)
    model.save_pretrained(path)
    return path


def make_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    T = PROMPT + RESPONSE
    ids = torch.randint(10, SHAPE["vocab_size"] - 10, (SAMPLES, T), generator=g)
    mask = torch.ones(SAMPLES, T, dtype=torch.long)
    resp_mask = torch.ones(SAMPLES, RESPONSE)
    for i in range(SAMPLES):
        pad = int(torch.randint(0, PROMPT // 2, (1,), generator=g))
        cut = int(torch.randint(RESPONSE // 2, RESPONSE + 1, (1,), generator=g))
        ids[i, :pad] = 0
        mask[i, :pad] = 0
        ids[i, PROMPT + cut:] = 0
        mask[i, PROMPT + cut:] = 0
        resp_mask[i, cut:] = 0
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": ids[:, PROMPT:].clone(), "response_mask": resp_mask}


@torch.no_grad()
def hf_reference(hf_dir: str, batch: dict, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype).cuda().eval()
    logits = model(input_ids=batch["input_ids"].cuda(), attention_mask=batch["attention_mask"].cuda(),
                   position_ids=batch["position_ids"].cuda()).logits[:, PROMPT - 1:-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, batch["responses"].cuda()[..., None]).squeeze(-1)
    entropy = torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)
    del model
    torch.cuda.empty_cache()
    return logp.cpu(), entropy.cpu()


def configs(hf_dir: str):
    from hybridrl.config.layout import BatchPlan
    from hybridrl.config.schema.actor import ActorConfig, ModelConfig
    from hybridrl.config.schema.common import MegatronConfig, OptimConfig

    megatron = MegatronConfig(use_distributed_optimizer=True, sequence_parallel=False, seed=1)
    actor = ActorConfig(ppo_mini_batch_size=SAMPLES, ppo_micro_batch_size_per_gpu=4, clip_ratio=0.2,
                        loss_agg_mode="token-mean", entropy_coeff=0.0, use_kl_loss=False,
                        optim=OptimConfig(lr=1e-5, clip_grad=1.0, total_training_steps=10), megatron=megatron)
    plan = BatchPlan(samples_per_step=SAMPLES, mini_batch_samples=SAMPLES, mini_batches_per_epoch=1, ppo_epochs=1,
                     mini_batch_per_dp=SAMPLES, micro_batch_per_gpu=4, grad_accum=SAMPLES // 4, use_dynamic_bsz=False,
                     max_token_len_per_gpu=8192, forward_micro_batch_per_gpu=8, forward_max_token_len_per_gpu=8192)
    return ModelConfig(path=hf_dir), actor, plan


@pytest.fixture(scope="module")
def actor(hf_dir, layout):
    from hybridrl.adapters.megatron.actor import MegatronActor

    model, cfg, plan = configs(hf_dir)
    return MegatronActor(model, cfg, layout, plan)


def test_bf16_log_probs_close_to_transformers(hf_dir, actor):
    from hybridrl.protocol import DataProto

    batch = make_batch()
    out = actor.compute_log_prob(DataProto.from_dict(batch), calculate_entropy=True)
    mask = batch["response_mask"].bool()
    report = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        ref_logp, ref_ent = hf_reference(hf_dir, batch, dtype)
        gap = (out.batch["log_probs"] - ref_logp)[mask].abs()
        report[f"logp_gap_vs_hf_{name}"] = {"max": float(gap.max()), "mean": float(gap.mean())}
        report[f"entropy_gap_vs_hf_{name}"] = float((out.batch["entropys"] - ref_ent)[mask].abs().max())
    print("\n[megatron gpu] " + json.dumps(report))
    assert report["logp_gap_vs_hf_bf16"]["mean"] < 0.05 and report["logp_gap_vs_hf_bf16"]["max"] < 1.0
    assert report["logp_gap_vs_hf_fp32"]["mean"] < 0.05


def test_export_returns_the_hf_tensors(hf_dir, actor):
    from safetensors import safe_open

    files = [f for f in os.listdir(hf_dir) if f.endswith(".safetensors")]
    handles = [safe_open(os.path.join(hf_dir, f), framework="pt") for f in files]
    where = {k: h for h in handles for k in h.keys()}
    n = 0
    for bucket in actor.export_weights(bucket_bytes=256 << 20):
        for name, t in bucket:
            assert t.is_cuda and t.dtype == torch.bfloat16
            assert torch.equal(t.cpu(), where[name].get_tensor(name)), name
            n += 1
    assert n == len([k for k in where if k != "lm_head.weight"])


def test_ppo_updates_and_offload(actor):
    from hybridrl.protocol import DataProto

    batch = make_batch(seed=1)
    data = DataProto.from_dict(batch, meta_info={"temperature": 1.0})
    old = actor.compute_log_prob(data).batch["log_probs"]
    g = torch.Generator().manual_seed(3)
    data.batch["old_log_probs"] = old
    data.batch["advantages"] = torch.randn(old.shape, generator=g) * batch["response_mask"]
    history = [actor.update_policy(data) for _ in range(3)]
    print("\n[megatron gpu] updates: " + json.dumps(history))
    first = history[0]
    assert abs(first["actor/ppo_kl"]) < 1e-3, "first-step ppo_kl must be ~0 (old log-probs from the same weights)"
    assert all(torch.isfinite(torch.tensor(h["actor/grad_norm"])) and h["actor/grad_norm"] > 0 for h in history)
    new = actor.compute_log_prob(data).batch["log_probs"]
    assert (new - old)[batch["response_mask"].bool()].abs().max() > 0  # the updates changed the model

    before = torch.cuda.memory_allocated()
    checksum = sum(float(p.detach().float().sum()) for c in actor.engine.chunks for p in c.parameters())
    off = actor.offload(params=True, grads=True, optimizer=True)
    freed = before - torch.cuda.memory_allocated()
    on = actor.onload(params=True, grads=True, optimizer=True)
    print(f"\n[megatron gpu] offload {off}, freed {freed / 2**30:.2f} GiB; onload {on}")
    assert off.params_bytes > 0 and off.optimizer_bytes > 0 and off.grads_bytes > 0
    assert on.total_bytes == off.total_bytes and freed >= 0.8 * off.total_bytes
    assert sum(float(p.detach().float().sum()) for c in actor.engine.chunks for p in c.parameters()) == checksum
    arenas = dict(actor._offloaded.pinned)
    assert set(arenas) == {"params", "optimizer"}
    assert all(a.buffer.registered and a.buffer.tensor.is_pinned() for a in arenas.values())
    slots = sum(len(a.slots) for a in arenas.values())  # exact sizes plus alignment, not rounded up to 2**k
    assert 0 <= actor._offloaded.pinned_bytes() - (off.params_bytes + off.optimizer_bytes) < slots * 512
    again = actor.offload(params=True, grads=True, optimizer=True)
    actor.onload(params=True, grads=True, optimizer=True)
    print(f"[megatron gpu] second offload {again.seconds:.3f} s (first {off.seconds:.3f} s, which pinned the arenas)")
    assert actor._offloaded.pinned == arenas  # reused, not re-registered
    after = actor.update_policy(data)  # training continues after the round trip
    assert torch.isfinite(torch.tensor(after["actor/pg_loss"]))
