"""bf16 training keeps its fp32 master weights across the hybrid engine's offloads (one GPU).

At lr 1e-5 one Adam step moves a weight by about 1e-5, far below a bf16 weight's resolution, so training in bf16
only works if the distributed optimizer's fp32 main params accumulate the steps and the bf16 params are their
rounding. Checked over four updates, each after the hybrid engine's offload (params, grads and optimizer state to
the host) and its onload without the optimizer (which comes back for the step), against the same actor updated
without offloads. `python -m pytest tests/gpu/test_megatron_master_weights.py -q -s`.
"""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("megatron.core")

SHAPE = dict(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)
LR, SAMPLES, PROMPT, RESPONSE, UPDATES = 1e-5, 16, 32, 64, 4


def save_tiny_qwen2(path: str) -> str:
    """The tiny bf16 Qwen2 (tied embeddings) of SHAPE, seed 0, as an HF folder at path."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**SHAPE)).to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    return save_tiny_qwen2(str(tmp_path_factory.mktemp("qwen2_tiny")))


def make_actor(hf_dir: str, layout, *, samples: int = SAMPLES, mini: int = SAMPLES, micro: int = 8, lr: float = LR,
               weight_decay: float = 0.0, clip_ratio: float = 0.2):
    """A bf16 megatron actor (local spec, distributed optimizer) taking samples // mini optimizer steps an update;
    test_megatron_adam_trajectory builds its actor here too."""
    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.config.layout import BatchPlan
    from hybridrl.config.schema.actor import ActorConfig, ModelConfig
    from hybridrl.config.schema.common import MegatronConfig, OptimConfig

    cfg = ActorConfig(ppo_mini_batch_size=mini, ppo_micro_batch_size_per_gpu=micro, loss_agg_mode="token-mean",
                      clip_ratio=clip_ratio,
                      optim=OptimConfig(lr=lr, weight_decay=weight_decay, clip_grad=1.0, lr_warmup_steps=-1,
                                        lr_warmup_steps_ratio=0.0, total_training_steps=100),
                      megatron=MegatronConfig(use_distributed_optimizer=True, sequence_parallel=False, seed=1,
                                              transformer_impl="local"))
    plan = BatchPlan(samples_per_step=samples, mini_batch_samples=mini, mini_batches_per_epoch=samples // mini,
                     ppo_epochs=1, mini_batch_per_dp=mini, micro_batch_per_gpu=micro, grad_accum=mini // micro,
                     use_dynamic_bsz=False, max_token_len_per_gpu=4096, forward_micro_batch_per_gpu=micro,
                     forward_max_token_len_per_gpu=4096)
    return MegatronActor(ModelConfig(path=hf_dir), cfg, layout, plan)


def make_data():
    from hybridrl.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    T = PROMPT + RESPONSE
    ids = torch.randint(10, SHAPE["vocab_size"] - 10, (SAMPLES, T), generator=g)
    mask = torch.ones(SAMPLES, T, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1,
             "responses": ids[:, PROMPT:].clone(), "response_mask": torch.ones(SAMPLES, RESPONSE),
             "advantages": torch.randn(SAMPLES, 1, generator=g).expand(SAMPLES, RESPONSE).contiguous()}
    return DataProto.from_dict(batch, meta_info={"temperature": 1.0})


def main_and_model(actor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distributed optimizer's fp32 main params and the bf16 model params they belong to, flattened."""
    mains, models = [], []
    opt = actor.engine.optimizer
    for o in getattr(opt, "chained_optimizers", [opt]):
        for main_group, model_group in zip(o.shard_fp32_from_float16_groups, o.shard_float16_groups):
            for main, model in zip(main_group, model_group):
                mains.append(main.detach().float().flatten().cpu())
                models.append(model.detach().float().flatten().cpu())
    return torch.cat(mains), torch.cat(models)


def run(actor, data, offload: bool) -> list[dict]:
    out = actor.compute_log_prob(data)
    data.batch["old_log_probs"] = out.batch["log_probs"]
    main0, model0 = main_and_model(actor)
    rows = []
    for k in range(UPDATES):
        if offload:  # the hybrid engine around generation: everything out, then params and grads back
            actor.offload(params=True, grads=True, optimizer=True)
            actor.onload(params=True, grads=True, optimizer=False)
        metrics = actor.update_policy(data)
        main, model = main_and_model(actor)
        rows.append({"update": k + 1, "main_moved_over_lr": float((main - main0).abs().mean() / LR),
                     "model_moved_over_lr": float((model - model0).abs().mean() / LR),
                     "model_is_main_rounded": bool(torch.equal(main.to(torch.bfloat16).float(), model)),
                     "grad_norm": metrics["actor/grad_norm"]})
    return rows


def test_fp32_master_weights_accumulate_across_offloads(hf_dir, layout):
    actor = make_actor(hf_dir, layout)
    plain = run(actor, make_data(), offload=False)
    del actor
    torch.cuda.empty_cache()
    hybrid = run(make_actor(hf_dir, layout), make_data(), offload=True)
    for name, rows in (("plain", plain), ("offload", hybrid)):
        print(f"\n[master weights] {name}: " + "; ".join(
            f"u{r['update']} main {r['main_moved_over_lr']:.2f} lr, model {r['model_moved_over_lr']:.2f} lr, "
            f"rounded {r['model_is_main_rounded']}, |g| {r['grad_norm']:.3g}" for r in rows))
    for rows in (plain, hybrid):
        for r in rows:  # one Adam step moves each weight by about lr; the steps add up in the fp32 copy
            assert r["main_moved_over_lr"] > 0.5 * r["update"], rows
            assert r["model_is_main_rounded"], rows
    for a, b in zip(plain, hybrid):
        assert abs(a["main_moved_over_lr"] - b["main_moved_over_lr"]) < 0.05 * a["main_moved_over_lr"], (plain, hybrid)
