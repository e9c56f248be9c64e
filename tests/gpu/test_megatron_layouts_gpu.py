"""Megatron layouts across two GPUs against one GPU, in bf16 over NCCL: tp2, pp2, dp2, pp2 x vpp2 on a dense tiny
Qwen2 and ep2 on a tiny Qwen3-MoE. Each layout's log-probs and entropy of a fixed batch, the grad norm of one PPO
update and the log-probs after it must stay within the bf16 floor: twice the gap between one GPU in bf16 and one GPU
in float32 on the same weights and data (a layout that splits matmuls rounds in another order, which is a bf16
rounding of the same size; a wrong shard or a lost gradient is far larger). cp2 has its own module
(test_megatron_cp.py, transformer-engine only). Skipped without two GPUs:
    python -m pytest tests/gpu/test_megatron_layouts_gpu.py -q -s
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.dist, pytest.mark.timeout(1200)]

if torch.cuda.device_count() < 2:
    pytest.skip("needs two GPUs", allow_module_level=True)
pytest.importorskip("megatron.core")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "dist", "megatron_helpers"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from runner import run_gpus  # noqa: E402  (benchmarks/runner.py)

DENSE = {"tp2": ["--tp", "2"], "pp2": ["--pp", "2"], "dp2": [], "pp2_vpp2": ["--pp", "2", "--vpp", "2"]}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    import tiny

    folder = str(tmp_path_factory.mktemp("layouts"))
    return {"dense": tiny.make_model("qwen2", folder), "moe": tiny.make_model("qwen3_moe", folder)}


def launch(n: int, model: str, out: str, *extra: str, dtype: str = "bfloat16") -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), NCCL_NVLS_ENABLE="0",
               CUDA_VISIBLE_DEVICES=run_gpus(n))  # the first n GPUs the caller gave, else the machine's
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--standalone",
           os.path.join(HERE, "layout_worker.py"), "--model", model, "--out", out, "--dtype", dtype, *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(extra) or 'one GPU'}: {proc.stderr[-6000:]}"
    with open(out) as f:
        return json.load(f)


def gaps(a: dict, b: dict) -> dict[str, float]:
    mask = torch.tensor(a["response_mask"]).bool()
    out = {k: float((torch.tensor(a[k]) - torch.tensor(b[k]))[mask].abs().mean())
           for k in ("log_probs", "entropys", "log_probs_after")}
    out["grad_norm_rel"] = abs(a["grad_norm"] / b["grad_norm"] - 1)
    return out


def check(name: str, got: dict, one: dict, floor: dict) -> None:
    g = gaps(got, one)
    print(f"\n[{name} vs one GPU, bf16] " + json.dumps({k: round(v, 6) for k, v in g.items()})
          + " floor " + json.dumps({k: round(v, 6) for k, v in floor.items()}))
    for key in ("log_probs", "entropys", "log_probs_after"):
        assert g[key] <= 2 * floor[key] + 1e-6, (name, key, g[key], floor[key])
    assert g["grad_norm_rel"] <= 2 * floor["grad_norm_rel"] + 0.01, (name, g["grad_norm_rel"], floor["grad_norm_rel"])


@pytest.fixture(scope="module")
def dense_refs(models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dense_refs")
    one = launch(1, models["dense"], str(tmp / "one.json"))
    fp32 = launch(1, models["dense"], str(tmp / "fp32.json"), dtype="float32")
    moved = gaps({**one, "log_probs": one["log_probs_after"]}, one)["log_probs"]
    assert moved > 10 * gaps(one, fp32)["log_probs"], "the update must move the log-probs well past the floor"
    return one, gaps(one, fp32)


@pytest.mark.parametrize("name", list(DENSE))
def test_dense_layout_matches_one_gpu_within_the_bf16_floor(name, models, dense_refs, tmp_path):
    one, floor = dense_refs
    check(name, launch(2, models["dense"], str(tmp_path / f"{name}.json"), *DENSE[name]), one, floor)


def test_expert_parallel_matches_one_gpu_within_the_bf16_floor(models, tmp_path):
    one = launch(1, models["moe"], str(tmp_path / "one.json"))
    floor = gaps(one, launch(1, models["moe"], str(tmp_path / "fp32.json"), dtype="float32"))
    check("ep2", launch(2, models["moe"], str(tmp_path / "ep2.json"), "--ep", "2"), one, floor)
