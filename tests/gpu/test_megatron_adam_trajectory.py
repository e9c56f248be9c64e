"""Several PPO updates of the megatron actor move the weights as far as torch's AdamW moves an fp32 copy of the
same model on the same mini-batches (one GPU).

Why: on the SmolLM2 job of benchmarks/peer_verl, hybridrl's policy moved about 2.5x less per step than verl's at
the same lr (peer_verl.md: hybridrl at lr 2.5e-5 follows verl's lr 1e-5 curves). The gradient of one mini-batch
is checked against float64 on CPU (tests/dist) and one Adam step against lr (test_megatron_master_weights); this
checks what those do not: the optimizer's state carried over mini-batches and updates, with noisy gradients
(fresh random advantages every update), bf16 with the distributed optimizer, two optimizer steps an update and the
hybrid engine's offloads, as in the trainer. Measure: the distance the weights travel from the start (the
distributed optimizer's fp32 main params against the reference's fp32 params), after each update.
`python -m pytest tests/gpu/test_megatron_adam_trajectory.py -q -s`.
"""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("megatron.core")

# the tiny bf16 Qwen2, the actor and its main params come from the master-weights test
from test_megatron_master_weights import SHAPE, main_and_model, make_actor, save_tiny_qwen2  # noqa: E402

LR, WD, CLIP, SAMPLES, MINI, PROMPT, RESPONSE, UPDATES = 1e-5, 0.01, 0.2, 16, 8, 32, 64, 5


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    return save_tiny_qwen2(str(tmp_path_factory.mktemp("qwen2_tiny_adam")))


def make_batch(update: int) -> dict[str, torch.Tensor]:
    """Fresh tokens and advantages every update (GRPO's noisy gradients), one advantage per sample."""
    g = torch.Generator().manual_seed(100 + update)
    ids = torch.randint(10, SHAPE["vocab_size"] - 10, (SAMPLES, PROMPT + RESPONSE), generator=g)
    mask = torch.ones_like(ids)
    adv = torch.randn(SAMPLES, 1, generator=g).expand(SAMPLES, RESPONSE).contiguous()
    return {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1,
            "responses": ids[:, PROMPT:].clone(), "response_mask": torch.ones(SAMPLES, RESPONSE), "advantages": adv}


def main_params(actor) -> torch.Tensor:
    return main_and_model(actor)[0]


def megatron_distances(actor) -> list[float]:
    """Distance of the fp32 main params from the start after each update (the trainer's path: old log-probs,
    then the hybrid engine's offload/onload around generation, then update_policy's two optimizer steps)."""
    from hybridrl.protocol import DataProto

    start, out = main_params(actor), []
    for k in range(UPDATES):
        data = DataProto.from_dict(make_batch(k), meta_info={"temperature": 1.0})
        data.batch["old_log_probs"] = actor.compute_log_prob(data).batch["log_probs"]
        actor.offload(params=True, grads=True, optimizer=True)
        actor.onload(params=True, grads=True, optimizer=False)
        actor.update_policy(data)
        out.append(float((main_params(actor) - start).norm()))
    return out


def reference_distances(hf_dir: str) -> list[float]:
    """The same updates written out: transformers' model in fp32, torch's AdamW, PPO's clipped loss, token-mean
    over each mini-batch of MINI rows in order, grad-norm clip 1.0."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).cuda()
    params = list(model.parameters())  # the tied embedding once
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
    start = torch.cat([p.detach().flatten().clone() for p in params])

    def log_probs(b):
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"]).logits.float()
        logp = torch.log_softmax(logits[:, PROMPT - 1:-1], -1)
        return logp.gather(-1, b["responses"][..., None])[..., 0]

    out = []
    for k in range(UPDATES):
        batch = {n: t.cuda() for n, t in make_batch(k).items()}
        with torch.no_grad():
            old = log_probs(batch)
        for rows in torch.arange(SAMPLES).split(MINI):
            b = {n: t[rows] for n, t in batch.items()}
            ratio = torch.exp(log_probs(b) - old[rows])
            a = b["advantages"]
            pg = torch.maximum(-a * ratio, -a * ratio.clamp(1 - CLIP, 1 + CLIP))
            loss = (pg * b["response_mask"]).sum() / b["response_mask"].sum()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        out.append(float((torch.cat([p.detach().flatten() for p in params]) - start).norm()))
    return out


def test_weights_travel_as_far_as_torch_adamw_moves_them(hf_dir, layout):
    ours = megatron_distances(make_actor(hf_dir, layout, samples=SAMPLES, mini=MINI, micro=MINI, lr=LR,
                                         weight_decay=WD, clip_ratio=CLIP))
    torch.cuda.empty_cache()
    ref = reference_distances(hf_dir)
    ratios = [o / r for o, r in zip(ours, ref)]
    print("\n[adam trajectory] distance from the start / lr after each update: megatron "
          + " ".join(f"{d / LR:.0f}" for d in ours) + "; torch AdamW " + " ".join(f"{d / LR:.0f}" for d in ref)
          + "; ratio " + " ".join(f"{r:.3f}" for r in ratios))
    assert all(b > a for a, b in zip(ref, ref[1:])), ref  # every update moved the reference further
    for k, r in enumerate(ratios):
        assert 0.85 < r < 1.15, f"update {k + 1}: megatron's weights travelled {r:.3f}x torch AdamW's ({ratios})"
