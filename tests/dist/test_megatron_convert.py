"""Converter CLIs: HF -> megatron (tp=2, pp=2, 4 processes) -> HF is bitwise equal; the merged folder loads
in transformers (with its tokenizer) and greedy-generates the same tokens; bad inputs fail with the
path or field to fix."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "megatron_helpers"))

import tiny  # noqa: E402

import launch  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]
CLI_TIMEOUT = 240


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> str:
    path = tiny.make_model("llama", str(tmp_path_factory.mktemp("convert_models")))
    tiny.save_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def mcore_ckpt(hf_model, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("convert") / "mcore")
    proc = launch.run([sys.executable, "-m", "hybridrl", "convert", "hf-to-mcore", "--hf-dir", hf_model, "--out", out,
                       "--tp", "2", "--pp", "2"], CLI_TIMEOUT)
    assert "rank 3: read" in proc.stdout  # progress lines from every worker
    return out


def load_safetensors(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, name)))
    return out


def test_checkpoint_records_the_layout_it_was_saved_from(mcore_ckpt):
    meta = json.load(open(os.path.join(mcore_ckpt, "meta.json")))
    assert (meta["layout"]["tp"], meta["layout"]["pp"], meta["layout"]["world_size"]) == (2, 2, 4)
    assert meta["has_optimizer"] is False and meta["arch"]["num_layers"] == 4
    assert os.path.isfile(os.path.join(mcore_ckpt, "huggingface", "tokenizer.json"))


def test_round_trip_is_bitwise_and_generates_the_same_tokens(hf_model, mcore_ckpt, tmp_path):
    out = str(tmp_path / "hf")
    launch.run([sys.executable, "-m", "hybridrl", "convert", "mcore-to-hf", "--ckpt-dir", mcore_ckpt, "--out", out],
               CLI_TIMEOUT)
    want, got = load_safetensors(hf_model), load_safetensors(out)
    assert set(got) == set(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    prompt = tok("w5 w17 w300 w42", return_tensors="pt")
    outputs = []
    for folder in (hf_model, out):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        outputs.append(model.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=0))
    assert torch.equal(outputs[0], outputs[1])
    assert outputs[0].shape[1] > prompt["input_ids"].shape[1]


def test_model_merger_cli_writes_a_loadable_folder(hf_model, mcore_ckpt, tmp_path):
    out = str(tmp_path / "merged")
    launch.run([sys.executable, "-m", "hybridrl.model_merger", "merge", "--backend", "megatron", "--local_dir",
                mcore_ckpt, "--target_dir", out], CLI_TIMEOUT)
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= set(os.listdir(out))
    want, got = load_safetensors(hf_model), load_safetensors(out)
    assert all(torch.equal(got[k], want[k]) for k in want)


# ------------------------------------------------------------------------------------------ bad inputs
def test_wrong_architecture_names_the_field(tmp_path):
    from hybridrl.adapters.megatron.hf_config import UnsupportedModelError
    from hybridrl.model_merger.megatron import hf_to_mcore

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10}))
    with pytest.raises(UnsupportedModelError, match="model_type='gpt2'"):
        hf_to_mcore(str(tmp_path), str(tmp_path / "out"), 1, 1)


def test_tp_that_does_not_divide_heads_names_the_flag(hf_model, tmp_path):
    from hybridrl.model_merger.megatron import hf_to_mcore

    with pytest.raises(ValueError, match=r"num_key_value_heads=2 is not divisible by --tp=4"):
        hf_to_mcore(hf_model, str(tmp_path / "out"), 4, 1)


def test_missing_shard_names_the_file(hf_model, tmp_path):
    from hybridrl.model_merger.megatron import hf_to_mcore

    broken = tmp_path / "broken"
    shutil.copytree(hf_model, broken)
    os.rename(broken / "model.safetensors", broken / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors",
                            "lm_head.weight": "model-00002-of-00002.safetensors"}}
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        hf_to_mcore(str(broken), str(tmp_path / "out"), 1, 1)


def test_checkpoint_with_missing_or_mismatched_files_is_rejected(mcore_ckpt, tmp_path):
    from hybridrl.model_merger.megatron import mcore_to_hf

    broken = tmp_path / "ckpt"
    shutil.copytree(mcore_ckpt, broken)
    os.remove(broken / "rng" / "rank_00003.safetensors")
    with pytest.raises(ValueError, match="claims a layout of 4 ranks .* holds 3 rank files"):
        mcore_to_hf(str(broken), str(tmp_path / "out"))
    os.remove(broken / "dist" / "metadata.json")
    with pytest.raises(FileNotFoundError, match="dist/metadata.json is missing"):
        mcore_to_hf(str(broken), str(tmp_path / "out"))
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        mcore_to_hf(str(tmp_path), str(tmp_path / "out"))


# ------------------------------------------------------------------------------------------ mixture of experts
@pytest.fixture(scope="module")
def moe_model(tmp_path_factory) -> str:
    """Qwen2-MoE: router, 8 routed experts, the shared expert and its gate, qkv biases."""
    path = tiny.make_model("qwen2_moe", str(tmp_path_factory.mktemp("convert_moe")))
    tiny.save_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def moe_ckpt(moe_model, tmp_path_factory) -> str:
    """Saved from tp=2 with the experts spread over ep=2 (etp=1) on the same 2 processes."""
    out = str(tmp_path_factory.mktemp("convert_moe") / "mcore")
    proc = launch.run([sys.executable, "-m", "hybridrl", "convert", "hf-to-mcore", "--hf-dir", moe_model, "--out", out,
                       "--tp", "2", "--ep", "2", "--etp", "1"], CLI_TIMEOUT)
    assert "ep rank 1" in proc.stdout
    return out


def test_moe_round_trip_through_convert_and_the_merger_is_bitwise(moe_model, moe_ckpt, tmp_path):
    meta = json.load(open(os.path.join(moe_ckpt, "meta.json")))
    assert meta["arch"]["num_experts"] == 8 and meta["arch"]["shared_expert_ffn_hidden_size"] == 56
    want = load_safetensors(moe_model)
    assert {"model.layers.0.mlp.experts.7.down_proj.weight", "model.layers.3.mlp.shared_expert_gate.weight"} <= set(want)
    for cmd in (["-m", "hybridrl", "convert", "mcore-to-hf", "--ckpt-dir", moe_ckpt, "--out", str(tmp_path / "hf")],
                ["-m", "hybridrl.model_merger", "merge", "--backend", "megatron", "--local_dir", moe_ckpt,
                 "--target_dir", str(tmp_path / "merged")]):
        launch.run([sys.executable, *cmd], CLI_TIMEOUT)
        got = load_safetensors(cmd[-1])
        assert set(got) == set(want), cmd[2]
        bad = [n for n, t in want.items() if got[n].dtype != t.dtype or not torch.equal(got[n], t)]
        assert bad == [], f"{cmd[2]}: {bad[:5]}"


def test_expert_layout_that_does_not_divide_the_experts_names_the_flag(moe_model, tmp_path):
    from hybridrl.model_merger.megatron import hf_to_mcore

    with pytest.raises(ValueError, match=r"num_experts=8 is not divisible by --ep=3"):
        hf_to_mcore(moe_model, str(tmp_path / "out"), 1, 1, ep=3)


# ------------------------------------------------------------------------------------------ a critic's folder
def make_token_classifier(folder: str, num_labels: int = 1) -> str:
    """A tiny Qwen2ForTokenClassification (verl's critic format): `score.weight` and `score.bias`, tied embeddings
    that the head must not share."""
    import transformers

    cfg = transformers.Qwen2Config(vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=True, num_labels=num_labels, pad_token_id=0)
    torch.manual_seed(3)
    model = transformers.Qwen2ForTokenClassification(cfg).float()
    with torch.no_grad():
        model.score.bias.normal_(0.0, 0.5)  # a lost bias would show as zeros
    model.save_pretrained(folder)
    return folder


def test_a_critic_folder_converts_with_its_score_head_and_back_bitwise(tmp_path):
    """hf-to-mcore of a *ForTokenClassification folder keeps its value head `score` (weight and bias) through a
    pp2 checkpoint, which records a critic with a biased head, and mcore-to-hf gives back every tensor bitwise."""
    hf = make_token_classifier(str(tmp_path / "critic"))
    out, back = str(tmp_path / "mcore"), str(tmp_path / "hf")
    proc = launch.run([sys.executable, "-m", "hybridrl", "convert", "hf-to-mcore", "--hf-dir", hf, "--out", out,
                       "--tp", "1", "--pp", "2"], CLI_TIMEOUT)
    assert "value head score with bias" in proc.stdout
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert (meta["value_head"], meta["head_bias"], meta["role"]) == (True, True, "critic")
    launch.run([sys.executable, "-m", "hybridrl", "convert", "mcore-to-hf", "--ckpt-dir", out, "--out", back],
               CLI_TIMEOUT)
    want, got = load_safetensors(hf), load_safetensors(back)
    assert {"score.weight", "score.bias"} <= set(want) and set(got) == set(want)
    for name, t in want.items():
        assert torch.equal(got[name], t), name


def test_a_score_head_folder_with_two_labels_or_no_score_weights_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from hybridrl.adapters.megatron.hf_config import UnsupportedModelError
    from hybridrl.model_merger.megatron import hf_to_mcore

    two = make_token_classifier(str(tmp_path / "two"), num_labels=2)
    with pytest.raises(UnsupportedModelError, match="num_labels=2"):
        hf_to_mcore(two, str(tmp_path / "out"), 1, 1)
    headless = make_token_classifier(str(tmp_path / "headless"))
    weights = load_file(os.path.join(headless, "model.safetensors"))
    save_file({k: v for k, v in weights.items() if not k.startswith("score.")},
              os.path.join(headless, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(FileNotFoundError, match="lack score.weight, score.bias"):
        hf_to_mcore(headless, str(tmp_path / "out"), 1, 1)
    assert not (tmp_path / "out").exists()
