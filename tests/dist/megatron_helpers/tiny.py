"""Tiny random HF models and deterministic verl-layout batches for the megatron tests (no hub access)."""
from __future__ import annotations

import os
from typing import Any

import torch

VOCAB = 1001  # not divisible by tp: exercises vocab padding

# name -> (config class name, kwargs): GQA everywhere, qkv bias (qwen2), tied and untied embeddings,
# llama3 rope scaling, qk-norm (qwen3), a sliding window shorter than the test sequences (mistral).
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(tie_word_embeddings=False, head_dim=24)),
    "mistral": ("MistralConfig", dict(tie_word_embeddings=False, sliding_window=6)),
    # Mixture of experts: 8 experts, top-2 / top-3, softmax-then-top-k (qwen3_moe) and renormalised top-k
    # (qwen2_moe with norm_topk_prob, mixtral), qwen2_moe's gated shared expert and qkv bias.
    "qwen3_moe": ("Qwen3MoeConfig", dict(tie_word_embeddings=False, head_dim=24, num_experts=8, num_experts_per_tok=2,
                                         moe_intermediate_size=40, norm_topk_prob=False)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(tie_word_embeddings=False, num_experts=8, num_experts_per_tok=3,
                                         moe_intermediate_size=40, shared_expert_intermediate_size=56,
                                         norm_topk_prob=True)),
    "mixtral": ("MixtralConfig", dict(tie_word_embeddings=False, num_local_experts=8, num_experts_per_tok=2,
                                      intermediate_size=48)),
}
MODEL_CLASSES = {"LlamaConfig": "LlamaForCausalLM", "Qwen2Config": "Qwen2ForCausalLM",
                 "Qwen3Config": "Qwen3ForCausalLM", "MistralConfig": "MistralForCausalLM",
                 "Qwen3MoeConfig": "Qwen3MoeForCausalLM", "Qwen2MoeConfig": "Qwen2MoeForCausalLM",
                 "MixtralConfig": "MixtralForCausalLM"}
MOE = ("qwen3_moe", "qwen2_moe", "mixtral")
DENSE = tuple(n for n in CONFIGS if n not in MOE)


def make_model(name: str, folder: str, seed: int = 0, num_layers: int = 4) -> str:
    """Save a tiny random model `name` (float32) to folder/name; returns the path."""
    import transformers

    cfg_cls, extra = CONFIGS[name]
    cfg = getattr(transformers, cfg_cls)(**{**dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
        bos_token_id=1, eos_token_id=2, pad_token_id=0), **extra})
    torch.manual_seed(seed)
    model = getattr(transformers, MODEL_CLASSES[cfg_cls])(cfg).float().eval()
    with torch.no_grad():  # random norms and biases so that their mapping matters
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
            if n.endswith("mlp.gate.weight") or n.endswith("shared_expert_gate.weight"):
                p.normal_(0.0, 0.3)  # decisive routing: HF's 0.02 init leaves near-ties between experts
    path = os.path.join(folder, name)
    model.save_pretrained(path)
    return path


def load_hf(path: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def make_batch(n: int, prompt_len: int = 7, resp_len: int = 6, seed: int = 1) -> dict[str, torch.Tensor]:
    """A verl batch: left-padded prompts of varying length + right-padded responses (with holes-free masks)."""
    g = torch.Generator().manual_seed(seed)
    T = prompt_len + resp_len
    input_ids = torch.zeros(n, T, dtype=torch.long)
    attention_mask = torch.zeros(n, T, dtype=torch.long)
    response_mask = torch.zeros(n, resp_len, dtype=torch.float32)
    for i in range(n):
        p = int(torch.randint(2, prompt_len + 1, (1,), generator=g))
        r = int(torch.randint(1, resp_len + 1, (1,), generator=g))
        input_ids[i, prompt_len - p:prompt_len] = torch.randint(3, VOCAB, (p,), generator=g)
        input_ids[i, prompt_len:prompt_len + r] = torch.randint(3, VOCAB, (r,), generator=g)
        attention_mask[i, prompt_len - p:prompt_len + r] = 1
        response_mask[i, :r] = 1
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    return {
        "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
        "responses": input_ids[:, prompt_len:].clone(), "response_mask": response_mask,
    }


def ppo_inputs(batch: dict[str, torch.Tensor], seed: int = 2) -> dict[str, torch.Tensor]:
    """Old/ref log-probs and advantages for a PPO update on `batch` (deterministic)."""
    g = torch.Generator().manual_seed(seed)
    shape = batch["responses"].shape
    mask = batch["response_mask"]
    return {
        "old_log_probs": (-7.0 + 0.3 * torch.randn(shape, generator=g)) * mask,
        "ref_log_prob": (-7.0 + 0.3 * torch.randn(shape, generator=g)) * mask,
        "advantages": torch.randn(shape, generator=g) * mask,
        "values": torch.randn(shape, generator=g) * mask,
        "returns": torch.randn(shape, generator=g) * mask,
    }


@torch.no_grad()
def hf_log_probs(model: Any, batch: dict[str, torch.Tensor], temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference (log-probs [B, R], logits at those positions [B, R, V]) from a transformers model."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"]).logits.float()
    R = batch["responses"].shape[1]
    logits = out[:, -R - 1:-1] / temperature
    logp = torch.log_softmax(logits, -1).gather(-1, batch["responses"][..., None]).squeeze(-1)
    return logp * batch["response_mask"], logits


PARITY_TEMPERATURE = 0.7


def save_references(path: str) -> None:
    """transformers log-probs, logits and entropy on the parity batch -> path/refs.pt (read by the workers)."""
    batch = make_batch(8, prompt_len=9, resp_len=7, seed=11)
    logp, logits = hf_log_probs(load_hf(path), batch, PARITY_TEMPERATURE)
    entropy = torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)
    torch.save({"batch": batch, "temperature": PARITY_TEMPERATURE, "log_probs": logp,
                "logits": logits * PARITY_TEMPERATURE, "entropy": entropy}, os.path.join(path, "refs.pt"))


def save_tokenizer(path: str) -> None:
    """A word-level tokenizer over VOCAB tokens, saved next to a tiny model (no hub access)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)


def _routers(model: Any) -> list:
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


@torch.no_grad()
def save_routing_references(path: str) -> None:
    """For the routing checks: the parity batch with a rollout's routing in which a fixed quarter of the
    (token, layer) choices were changed, the expected agreement per response token, and the log-probs of a
    transformers forward forced to that routing (router weights gathered at the forced experts: softmax over
    all experts, renormalised when norm_topk_prob) -> path/routing_refs.pt."""
    model = load_hf(path)
    refs = torch.load(os.path.join(path, "refs.pt"))
    batch, temperature = refs["batch"], refs["temperature"]
    seen: list[torch.Tensor] = []
    hooks = [r.register_forward_hook(lambda m, i, o: seen.append(o[2])) for r in _routers(model)]
    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"])
    for h in hooks:
        h.remove()
    B, T = batch["input_ids"].shape
    routed = torch.stack([s.reshape(B, T, -1) for s in seen], dim=2)  # [B, T, layers, k]
    g = torch.Generator().manual_seed(5)
    changed = torch.rand(routed.shape[:3], generator=g) < 0.25  # [B, T, layers]
    experts = model.config.num_experts
    shifted = (routed + routed.shape[-1]) % experts  # k other experts (ids shifted by k): a different set
    forced = torch.where(changed[..., None], shifted, routed)
    mask = batch["attention_mask"].bool()
    forced[~mask] = -1
    R = batch["responses"].shape[1]
    expected = 1.0 - changed[:, T - R:].double().mean(-1)  # response token j's own position is T - R + j
    expected = torch.where(mask[:, T - R:], expected, torch.full_like(expected, -1.0))

    def force(module, inputs, output, layer):
        logits = output[0]
        ids = forced.clamp(min=0)[:, :, layer].reshape(-1, forced.shape[-1]).long()
        probs = torch.softmax(logits.float(), -1).gather(1, ids)
        if getattr(module, "norm_topk_prob", False):
            probs = probs / probs.sum(-1, keepdim=True)
        return logits, probs.to(logits.dtype), ids

    hooks = [r.register_forward_hook(lambda m, i, o, k=k: force(m, i, o, k)) for k, r in enumerate(_routers(model))]
    logp, _ = hf_log_probs(model, batch, temperature)
    for h in hooks:
        h.remove()
    torch.save({"routed_experts": forced.to(torch.int16), "agreement": expected.float(), "replayed_log_probs": logp},
               os.path.join(path, "routing_refs.pt"))


def save_grad_references(path: str) -> None:
    """For the MoE gradient check: d/dθ of sum over response tokens of w * log-prob (w fixed, random) on the parity
    batch, by transformers' autograd, for the router, experts 1 and 6 and the shared expert with its gate, keyed
    by megatron parameter name (tp=1, ep=1) -> path/grad_refs.pt."""
    model = load_hf(path)
    refs = torch.load(os.path.join(path, "refs.pt"))
    batch, temperature = refs["batch"], refs["temperature"]
    weights = torch.randn(batch["responses"].shape, generator=torch.Generator().manual_seed(9))
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"]).logits.float()
    R = batch["responses"].shape[1]
    logp = torch.log_softmax(out[:, -R - 1:-1] / temperature, -1).gather(-1, batch["responses"][..., None])[..., 0]
    (logp * batch["response_mask"] * weights).sum().backward()
    block = "block_sparse_moe" if model.config.model_type == "mixtral" else "mlp"
    grads, pairs = {}, {}
    for layer in (0, 3):
        mlp, m = model.model.layers[layer].mlp, f"decoder.layers.{layer}.mlp."
        hf = f"model.layers.{layer}.{block}."
        grads[hf + "gate.weight"], pairs[m + "router.weight"] = mlp.gate.weight.grad, hf + "gate.weight"
        for e in (1, 6):
            grads[f"{hf}experts.{e}.fc1"] = mlp.experts.gate_up_proj.grad[e]  # [gate; up], as megatron's fc1
            grads[f"{hf}experts.{e}.fc2"] = mlp.experts.down_proj.grad[e]
            pairs[f"{m}experts.local_experts.{e}.linear_fc1.weight"] = f"{hf}experts.{e}.fc1"
            pairs[f"{m}experts.local_experts.{e}.linear_fc2.weight"] = f"{hf}experts.{e}.fc2"
        if hasattr(mlp, "shared_expert"):
            s = mlp.shared_expert
            grads[hf + "shared_expert.fc1"] = torch.cat([s.gate_proj.weight.grad, s.up_proj.weight.grad])
            grads[hf + "shared_expert_gate.weight"] = mlp.shared_expert_gate.weight.grad
            pairs[m + "shared_experts.linear_fc1.weight"] = hf + "shared_expert.fc1"
            pairs[m + "shared_experts.gate_weight"] = hf + "shared_expert_gate.weight"
    torch.save({"weights": weights, "grads": {k: v.detach().clone() for k, v in grads.items()}, "pairs": pairs},
               os.path.join(path, "grad_refs.pt"))


PPO_CLIP, PPO_CLIP_C, PPO_KL_COEF = 0.2, 3.0, 0.1  # run_layout.actor_cfgs' clip_ratio (default), clip_ratio_c, kl


def save_ppo_grad_references(path: str) -> None:
    """For the dense PPO gradient check: the actor's loss written out here in float64 (vanilla PPO with the dual
    clip, low_var_kl to the reference, token-mean over the mini-batch, temperature as in refs.pt) on the parity batch
    with random old/ref log-probs near the model's own and random advantages, and its gradient by transformers'
    autograd for a few parameters, keyed by megatron parameter name (tp=1) -> path/ppo_grad_refs.pt."""
    model = load_hf(path).double()
    refs = torch.load(os.path.join(path, "refs.pt"))
    batch, temperature = refs["batch"], refs["temperature"]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"]).logits
    R = batch["responses"].shape[1]
    logp = torch.log_softmax(out[:, -R - 1:-1] / temperature, -1).gather(-1, batch["responses"][..., None])[..., 0]
    mask = batch["response_mask"].double()
    g = torch.Generator().manual_seed(21)
    noise = lambda scale: scale * torch.randn(logp.shape, generator=g, dtype=torch.float64)  # noqa: E731
    old = ((logp.detach() + noise(0.3)) * mask).float()  # ratios spread over the clip range: some are clipped
    ref = ((logp.detach() + noise(0.2)) * mask).float()
    adv = (noise(1.0) * mask).float()
    ratio = torch.exp(logp - old.double())
    a = adv.double()
    pg1, pg2 = -a * ratio, -a * ratio.clamp(1 - PPO_CLIP, 1 + PPO_CLIP)
    pg = torch.maximum(pg1, pg2)
    pg = torch.where(a < 0, torch.minimum(pg, -a * PPO_CLIP_C), pg)
    kl = ref.double() - logp
    kld = (torch.exp(kl) - kl - 1).clamp(-10, 10)
    loss = ((pg + PPO_KL_COEF * kld) * mask).sum() / mask.sum()
    loss.backward()
    layers = model.model.layers
    grads = {
        "embedding.word_embeddings.weight": model.model.embed_tokens.weight.grad,  # tied: the output layer's too
        "decoder.final_layernorm.weight": model.model.norm.weight.grad,
        "decoder.layers.0.mlp.linear_fc1.weight": torch.cat([layers[0].mlp.gate_proj.weight.grad,
                                                             layers[0].mlp.up_proj.weight.grad]),
        "decoder.layers.0.mlp.linear_fc2.weight": layers[0].mlp.down_proj.weight.grad,
        "decoder.layers.1.self_attention.linear_proj.weight": layers[1].self_attn.o_proj.weight.grad,
    }
    clipped = float(((pg2 > pg1).double() * mask).sum() / mask.sum())  # verl's pg_clipfrac: the clip binds
    torch.save({"inputs": {"old_log_probs": old, "ref_log_prob": ref, "advantages": adv},
                "grads": {k: v.detach().float().clone() for k, v in grads.items()}, "loss": float(loss),
                "clipped_fraction": clipped}, os.path.join(path, "ppo_grad_refs.pt"))
