"""The Megatron reward model scores what transformers scores on the same weights, at tp1 and tp2.

Two tiny reward models saved by transformers: a Llama *ForSequenceClassification (head `score.weight`, untied
embeddings) and a Qwen2 *ForTokenClassification (`score.weight` + `score.bias`, qkv biases, tied embeddings that
the score head must not share). The reference is transformers' own pooling: AutoModelForSequenceClassification's
logit, and AutoModelForTokenClassification's logit at the last token, each sequence run alone without padding.
The megatron side (rm_run.py) scores verl-layout rows (left-padded prompts, right-padded responses) in padded,
token-budget (dynamic) and packed THD micro-batches.

A critic built from the same folders (critic_run.py; verl's critic is a *ForTokenClassification model) gives, at each
response token, transformers' per-token logit of the token before it: `score.bias` included. Its export, its
checkpoint and the converter (mcore-to-hf) keep the head's bias as it trained.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "megatron_helpers"))

import tiny  # noqa: E402

import launch  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]
MODELS = {"llama_seq": ("LlamaConfig", "LlamaForSequenceClassification", dict(tie_word_embeddings=False)),
          "qwen2_tok": ("Qwen2Config", "Qwen2ForTokenClassification", dict(tie_word_embeddings=True))}


def make_reward_model(name: str, folder: str, seed: int) -> str:
    import transformers

    cfg_cls, model_cls, extra = MODELS[name]
    cfg = getattr(transformers, cfg_cls)(vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=112,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1,
                                         eos_token_id=2, pad_token_id=0, num_labels=1, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
            if n.startswith("score."):
                p.normal_(0.0, 0.5)  # scores well away from 0, so a wrong token or a lost bias shows
    path = os.path.join(folder, name)
    model.save_pretrained(path)
    return path


@torch.no_grad()
def reference_scores(path: str, name: str, batch: dict) -> list[float]:
    import transformers

    auto = "AutoModelForSequenceClassification" if name.endswith("_seq") else "AutoModelForTokenClassification"
    model = getattr(transformers, auto).from_pretrained(path, dtype=torch.float32).eval()
    out = []
    for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
        logits = model(input_ids=ids[mask.bool()][None]).logits
        out.append(float(logits[0, 0] if logits.dim() == 2 else logits[0, -1, 0]))
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    models = str(tmp_path_factory.mktemp("rm_models"))
    batch = tiny.make_batch(10, prompt_len=7, resp_len=6, seed=3)
    torch.save(batch, os.path.join(models, "batch.pt"))
    refs = {name: reference_scores(make_reward_model(name, models, seed=i), name, batch) for i, name in enumerate(MODELS)}
    with open(os.path.join(models, "names.json"), "w") as f:
        json.dump(list(MODELS), f)
    return models, refs


@pytest.mark.parametrize("tp", [1, 2])
def test_scores_equal_transformers(setup, tmp_path, tp):
    models, refs = setup
    launch.torchrun("rm_run.py", tp, ["--models", models, "--out", str(tmp_path), "--tp", str(tp)], 240)
    results = launch.rank_results(str(tmp_path))
    assert len(results) == tp
    spread = max(abs(r) for ref in refs.values() for r in ref)
    assert spread > 0.1, refs  # the heads give scores far enough from 0 for the comparison to mean something
    for rank in results:
        for name, ref in refs.items():
            for way, got in rank[name].items():
                err = max(abs(a - b) for a, b in zip(got, ref))
                assert err < 1e-4, f"tp{tp} {name} {way}: max |megatron - transformers| = {err}\n{got}\n{ref}"


@torch.no_grad()
def reference_values(path: str, name: str, batch: dict) -> torch.Tensor:
    """[B, R] transformers' per-token head output at the token before each response token (0 past the response):
    *ForTokenClassification's logits as they are; for *ForSequenceClassification its `score` on every token's
    hidden state, before the pooling. Each row runs alone without padding."""
    import transformers

    seq = name.endswith("_seq")
    auto = "AutoModelForSequenceClassification" if seq else "AutoModelForTokenClassification"
    model = getattr(transformers, auto).from_pretrained(path, dtype=torch.float32).eval()
    resp_len = batch["responses"].shape[1]
    prompt_len = batch["input_ids"].shape[1] - resp_len
    out = torch.zeros(batch["responses"].shape, dtype=torch.float64)
    for i, (ids, mask) in enumerate(zip(batch["input_ids"], batch["attention_mask"])):
        valid = ids[mask.bool()][None]
        logits = model.score(model.model(valid).last_hidden_state) if seq else model(input_ids=valid).logits
        prompt = int(mask[:prompt_len].sum())
        for j in range(int(batch["response_mask"][i].sum())):
            out[i, j] = float(logits[0, prompt + j - 1, 0])
    return out


def hf_tensors(path: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(os.listdir(path)) if f.endswith(".safetensors")
            for k, v in load_file(os.path.join(path, f)).items()}


@pytest.mark.parametrize("tp", [1, 2])
def test_critic_values_equal_transformers_and_keep_the_score_bias(setup, tmp_path, tp):
    models, _ = setup
    batch = torch.load(os.path.join(models, "batch.pt"))
    launch.torchrun("critic_run.py", tp, ["--models", models, "--out", str(tmp_path), "--tp", str(tp)], 240)
    results = launch.rank_results(str(tmp_path))
    assert len(results) == tp
    for name in MODELS:
        ref = reference_values(os.path.join(models, name), name, batch)
        hf = hf_tensors(os.path.join(models, name))
        assert ("score.bias" in hf) == name.endswith("_tok") and float(ref.abs().max()) > 0.1
        for rank in results:
            got = rank[name]
            for way, values in got["values"].items():
                err = float((torch.tensor(values, dtype=torch.float64) - ref).abs().max())
                assert err < 1e-4, f"tp{tp} {name} {way}: max |critic value - transformers logit| = {err}"
            # the export carries the head as the folder has it, then as it trained (the bias gets gradients too)
            assert set(got["score_before"]) == {n for n in hf if n.startswith("score.")}
            for n, t in got["score_before"].items():
                assert torch.equal(torch.tensor(t, dtype=hf[n].dtype), hf[n]), n
            assert got["score_after"] == results[0][name]["score_after"]  # the replicated head agrees over tp
            assert all(got["score_after"][n] != got["score_before"][n] for n in got["score_after"])
    # the converter writes the trained critic with its bias: every tensor of the export, bitwise
    name = "qwen2_tok"
    out = str(tmp_path / "merged")
    launch.run([sys.executable, "-m", "hybridrl", "convert", "mcore-to-hf", "--ckpt-dir",
                str(tmp_path / f"ckpt_{name}"), "--out", out], 240)
    merged, want = hf_tensors(out), torch.load(str(tmp_path / f"exported_{name}.pt"))
    assert set(merged) == set(want) == set(hf_tensors(os.path.join(models, name))) and "score.bias" in merged
    for n, t in want.items():
        assert torch.equal(merged[n], t), n
