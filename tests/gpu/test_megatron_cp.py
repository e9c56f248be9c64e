"""Context parallelism (transformer-engine attention) on two GPUs: cp=2 against cp=1 on the same weights and data,
padded and packed micro-batches: log-probs, entropy, the PPO loss and grad norm of one update (bf16: close, not
equal). Skipped without two GPUs or transformer_engine:
    python -m pytest tests/gpu/test_megatron_cp.py -q -s
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.dist, pytest.mark.timeout(900)]

if torch.cuda.device_count() < 2:
    pytest.skip("needs two GPUs", allow_module_level=True)
pytest.importorskip("megatron.core")
pytest.importorskip("transformer_engine")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from runner import run_gpus  # noqa: E402  (benchmarks/runner.py)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    import transformers

    cfg_cls, model_cls, extra = ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True})
    sys.path.insert(0, HERE)
    import test_megatron_te as te

    path = str(tmp_path_factory.mktemp("cp_qwen2"))
    torch.manual_seed(0)
    getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**te.COMMON, **extra)).to(torch.bfloat16).save_pretrained(path)
    return path


def launch(n: int, model: str, out: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), NCCL_NVLS_ENABLE="0",
               CUDA_VISIBLE_DEVICES=run_gpus(n))  # the first n GPUs the caller gave, else the machine's
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--standalone",
           os.path.join(HERE, "cp_worker.py"), "--model", model, "--out", out]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    with open(out) as f:
        return json.load(f)


def test_context_parallel_matches_one_gpu(model, tmp_path):
    one, two = launch(1, model, str(tmp_path / "cp1.json")), launch(2, model, str(tmp_path / "cp2.json"))
    report = {}
    for kind in ("padded", "packed"):
        a, b = one[kind], two[kind]
        for key in ("log_probs", "entropys"):
            d = (torch.tensor(b[key]) - torch.tensor(a[key])).abs()
            report[f"{kind}_{key}"] = {"max": float(d.max()), "mean": float(d.mean())}
        report[f"{kind}_grad_norm"] = [a["grad_norm"], b["grad_norm"]]
        report[f"{kind}_pg_loss"] = [a["pg_loss"], b["pg_loss"]]
    print("\n[cp2 vs cp1] " + json.dumps(report))
    for kind in ("padded", "packed"):
        assert report[f"{kind}_log_probs"]["mean"] < 5e-3 and report[f"{kind}_entropys"]["mean"] < 5e-3
        assert abs(two[kind]["grad_norm"] / one[kind]["grad_norm"] - 1) < 0.02
        assert abs(two[kind]["pg_loss"] - one[kind]["pg_loss"]) < 1e-2
