"""LoRA on the megatron actor (adapters/megatron/lora.py) against peft on the same weights (issue 40).

The test process builds a tiny Qwen2 (GQA, qkv bias, tied embeddings) and a peft LoRA adapter on all seven
linear modules with random non-zero A and B, and computes with transformers + peft (no megatron): log-probs
with the adapter and without it, and the adapters' gradients of L = sum w * log-prob. Two torchrun launches
(tp=1; then tp=2 and pp=2 x vpp=2 one after the other; lora_run.py) load the adapter through lora_adapter_path and check against those references:
  * the forward equals peft's (padded and packed micro-batches); the actor with its adapters off (the reference
    policy) equals the base; a fresh adapter (PEFT's init, B = 0) equals the base;
  * gradients reach the adapters only and equal peft's (also under full activation recompute, where the frozen
    embedding's output must be marked as needing grad); the optimizer holds exactly the adapters' elements;
    an update leaves the base bitwise unchanged;
  * tp=2 and pp=2 x vpp=2 (interleaved schedule, one layer a chunk) equal tp=1: two updates' metrics and the log-probs after the first; both load tp=1's
    checkpoint (adapters and distributed optimizer state, keyed by PEFT name) and give tp=1's log-probs and
    second update;
  * the adapter-only sync's export (views planned once at tp 1) equals the unplanned export after updates and after
    an adapter parameter got new storage;
  * export round-trips through transformers + peft: the adapter written by write_peft_adapter, and the model
    merger's merged HF folder and lora_adapter/ from the checkpoint, load with PeftModel.from_pretrained /
    AutoModelForCausalLM and give the trained actor's log-probs.
"""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "megatron_helpers"))

import tiny  # noqa: E402

import launch  # noqa: E402

peft = pytest.importorskip("peft")

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]

LAUNCH_TIMEOUT = 180
TOL = 1e-4  # log-probs, fp32 (the layouts' parity tolerance)
GRAD_TOL = 1e-4  # max |diff| / max |want| over every adapter
REL_TOL = 1e-5
RANK, ALPHA = 4, 8.0


def peft_model(base_path: str):
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules="all-linear", lora_dropout=0.0)
    return peft.get_peft_model(tiny.load_hf(base_path), config)


def save_lora_references(models: str) -> None:
    """models/adapter (random non-zero A and B, saved by peft) and models/lora_refs.pt (peft's numbers)."""
    path = os.path.join(models, "qwen2")
    model = peft_model(path)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(os.path.join(models, "adapter"))
    batch = tiny.make_batch(8, prompt_len=9, resp_len=7, seed=11)
    temperature = 0.7
    logp, _ = tiny.hf_log_probs(model, batch, temperature)
    with model.disable_adapter():
        base, _ = tiny.hf_log_probs(model, batch, temperature)
    weights = torch.randn(batch["responses"].shape, generator=torch.Generator().manual_seed(9))
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"]).logits.float()
    R = batch["responses"].shape[1]
    lp = torch.log_softmax(out[:, -R - 1:-1] / temperature, -1).gather(-1, batch["responses"][..., None])[..., 0]
    (lp * batch["response_mask"] * weights).sum().backward()
    grads = {n.replace(".default", ""): p.grad.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    torch.save({"batch": batch, "temperature": temperature, "peft_log_probs": logp, "base_log_probs": base,
                "weights": weights, "grads": grads}, os.path.join(models, "lora_refs.pt"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    models = str(root / "models")
    tiny.make_model("qwen2", models)
    save_lora_references(models)
    ckpt, export = str(root / "ckpt_tp1"), str(root / "export_tp1")
    out = {}
    launch.torchrun("lora_run.py", 1, ["--models", models, "--out", str(root / "tp1"), "--save-ckpt", ckpt,
                                       "--export", export], LAUNCH_TIMEOUT)
    out["tp1"] = launch.rank_results(str(root / "tp1"))
    # both 2-rank layouts in one launch (lora_run.py --next): the ranks start up once
    launch.torchrun("lora_run.py", 2, ["--models", models, "--out", str(root / "tp2"), "--resume-ckpt", ckpt, "--next",
                                       "--models", models, "--out", str(root / "pp2_vpp2"), "--resume-ckpt", ckpt,
                                       "--pp", "2", "--vpp", "2"], LAUNCH_TIMEOUT)
    for name in ("tp2", "pp2_vpp2"):
        out[name] = launch.rank_results(str(root / name))
    return {"models": models, "ckpt": ckpt, "export": export, "root": root, **out}


@pytest.mark.parametrize("layout", ["tp1", "tp2", "pp2_vpp2"])
def test_forward_equals_peft_and_adapters_off_equal_the_base(runs, layout):
    for r in runs[layout]:
        assert r["peft_diff"] < TOL, r["peft_diff"]
        assert r["packed_peft_diff"] < TOL, r["packed_peft_diff"]
        assert r["adapters_off_vs_base"] < TOL, r["adapters_off_vs_base"]
        assert r["fresh_vs_base"] < TOL, r["fresh_vs_base"]


@pytest.mark.parametrize("layout", ["tp1", "tp2", "pp2_vpp2"])
def test_gradients_reach_the_adapters_only_and_equal_pefts(runs, layout):
    for r in runs[layout]:
        assert r["grad_rel_diff"] < GRAD_TOL, r["grad_rel_diff"]
        assert r["recompute_grad_rel_diff"] < GRAD_TOL, r["recompute_grad_rel_diff"]  # also under full recompute
        assert r["base_with_grad"] == []
        # 4 layers x 7 modules x (A, B), pp2: half the layers per stage; each was read from the PEFT file
        assert r["adapter_entries"] == 4 * 7 * 2 // (2 if layout == "pp2_vpp2" else 1)
        assert r["optimizer_numel"] == r["adapter_numel"] > 0
        assert r["base_unchanged"]


@pytest.mark.parametrize("layout", ["tp1", "tp2", "pp2_vpp2"])
def test_adapter_export_follows_the_parameters(runs, layout):
    """export_adapter_weights (its views planned once at tp 1, pp 1; gathered each time elsewhere) gives what the
    unplanned export gives, bitwise: after updates that moved the adapters in place, and after an adapter parameter
    got new storage (the planned views of the old one would send stale values: they differ from the new ones)."""
    for r in runs[layout]:
        assert r["export_planned_after_updates"]
        assert r["new_storage_differs"]
        assert r["export_planned_after_new_storage"]


def _same_update(want: dict, got: dict) -> None:
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        a, b = want[key], got[key]
        assert abs(a - b) <= REL_TOL * max(abs(a), 1e-8), (key, a, b)


@pytest.mark.parametrize("layout", ["tp2", "pp2_vpp2"])
def test_tp2_and_pp2_equal_tp1_and_resume_its_checkpoint(runs, layout):
    one = runs["tp1"][0]
    for r in runs[layout]:
        _same_update(one["update"], r["update"])
        _same_update(one["update2"], r["update2"])
        after = torch.tensor(r["log_probs_after"]) - torch.tensor(one["log_probs_after"])
        assert float(after.abs().max()) < TOL
        # tp1's checkpoint (adapters + distributed optimizer state) loaded in this layout: the same model, and the
        # same second update as the uninterrupted run
        resumed = torch.tensor(r["resumed_log_probs"]) - torch.tensor(one["log_probs_after"])
        assert float(resumed.abs().max()) < TOL
        _same_update(one["update2"], r["resumed_update2"])
        # every rank of every layout receives the whole adapter under PEFT's names (small buckets: several gathers)
        want = load_file(os.path.join(runs["export"], "adapter_model.safetensors"))
        got = torch.load(os.path.join(runs["root"], layout, f"adapter_rank{r['rank']}.pt"))
        assert sorted(got) == sorted(want)
        assert max(float((got[n] - want[n]).abs().max()) for n in want) < 1e-5  # after one Adam step
    # the update moved the adapters: the log-probs after it differ from peft's at the start
    refs = torch.load(os.path.join(runs["models"], "lora_refs.pt"))
    assert float((torch.tensor(one["log_probs_after"]) - refs["peft_log_probs"]).abs().max()) > 1e-3


def _actor_log_probs(runs) -> tuple[torch.Tensor, dict]:
    refs = torch.load(os.path.join(runs["models"], "lora_refs.pt"))
    return torch.tensor(runs["tp1"][0]["log_probs_after"]), refs


def test_exported_peft_adapter_loads_with_peft(runs):
    want, refs = _actor_log_probs(runs)
    with open(os.path.join(runs["export"], "adapter_config.json")) as f:
        assert json.load(f)["r"] == RANK
    model = peft.PeftModel.from_pretrained(tiny.load_hf(os.path.join(runs["models"], "qwen2")), runs["export"])
    got, _ = tiny.hf_log_probs(model, refs["batch"], refs["temperature"])
    assert float((got - want).abs().max()) < TOL


def test_model_merger_writes_merged_model_and_peft_adapter(runs):
    want, refs = _actor_log_probs(runs)
    target = str(runs["root"] / "merged")
    launch.run([sys.executable, "-m", "hybridrl.model_merger", "merge", "--backend", "megatron",
                "--local_dir", runs["ckpt"], "--target_dir", target], LAUNCH_TIMEOUT)
    merged, _ = tiny.hf_log_probs(tiny.load_hf(target), refs["batch"], refs["temperature"])
    assert float((merged - want).abs().max()) < TOL
    adapter = peft.PeftModel.from_pretrained(tiny.load_hf(os.path.join(runs["models"], "qwen2")),
                                             os.path.join(target, "lora_adapter"))
    got, _ = tiny.hf_log_probs(adapter, refs["batch"], refs["temperature"])
    assert float((got - want).abs().max()) < TOL
