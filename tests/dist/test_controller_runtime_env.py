"""build_runtime_env: weights and large files stay out of Ray's upload; the right env vars go in."""
from __future__ import annotations

import zipfile
from pathlib import Path

from ray._private.runtime_env.packaging import create_package

from hybridrl.controller.runtime_env import DEFAULT_EXCLUDES, build_runtime_env, describe_runtime_env, forwarded_env


def _write(path: Path, size: int = 10) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: cheap to create, full size for the size check


def make_job_dir(root: Path) -> Path:
    _write(root / "train.py")
    _write(root / "pkg" / "reward.py")
    _write(root / "configs" / "ppo.yaml")
    _write(root / "model.safetensors", 10 * 1024 * 1024)
    _write(root / "hf" / "pytorch_model.bin", 1024)
    _write(root / "checkpoints" / "step_10" / "actor" / "model.pt", 1024)
    _write(root / "nested" / "checkpoints" / "x.json", 1024)
    _write(root / "weights.gguf", 1024)
    _write(root / ".git" / "objects" / "pack.pack", 1024)
    _write(root / ".venv" / "lib" / "big.py", 1024)
    _write(root / "wandb" / "run" / "log.txt", 1024)
    _write(root / "outputs" / "gen.jsonl", 1024)
    _write(root / "data" / "mystery.dat", 40 * 1024 * 1024)  # unknown extension, over the size limit
    return root


def uploaded_files(env: dict, tmp_path: Path) -> tuple[set[str], int]:
    """What Ray itself would pack for this runtime env (its own packer and exclude matcher)."""
    target = tmp_path / "pkg.zip"
    create_package(env["working_dir"], target, include_gitignore=True, excludes=env["excludes"])
    with zipfile.ZipFile(target) as z:
        names = {n for n in z.namelist() if not n.endswith("/")}
    return names, target.stat().st_size


def test_weights_checkpoints_and_large_files_are_not_uploaded(tmp_path):
    job = make_job_dir(tmp_path / "job")
    env = build_runtime_env(str(job), environ={})
    assert env["working_dir"] == str(job)
    for pattern in ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.ckpt", "checkpoints/", ".git", ".venv",
                    "wandb/", "outputs/"):
        assert pattern in DEFAULT_EXCLUDES
    assert "/data/mystery.dat" in env["excludes"]  # found by size, not by name
    names, size = uploaded_files(env, tmp_path)
    assert names == {"train.py", "pkg/reward.py", "configs/ppo.yaml"}
    assert size < 100_000


def test_user_excludes_and_size_limit(tmp_path):
    job = make_job_dir(tmp_path / "job")
    _write(job / "scratch" / "notes.txt")
    env = build_runtime_env(str(job), excludes=["scratch/"], max_file_mb=1000, environ={})
    assert "/data/mystery.dat" not in env["excludes"]
    names, _ = uploaded_files(env, tmp_path)
    assert "scratch/notes.txt" not in names and "data/mystery.dat" in names


def test_env_vars_forwarded_without_secrets():
    driver_env = {
        "NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": "0", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "HF_TOKEN": "hf_secret", "HF_HUB_TOKEN": "hf_secret2", "WANDB_API_KEY": "wb_secret", "AWS_SECRET_ACCESS_KEY": "x",
        "HOME": "/root", "PATH": "/bin",
    }
    fwd = forwarded_env(driver_env)
    assert fwd == {k: driver_env[k] for k in ("NCCL_DEBUG", "NCCL_NVLS_ENABLE", "GLOO_SOCKET_IFNAME", "PYTHONUNBUFFERED",
                                              "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "CUDA_DEVICE_MAX_CONNECTIONS")}
    env = build_runtime_env(extra_env={"WANDB_API_KEY": "given_on_purpose"}, environ=driver_env)
    assert "working_dir" not in env and env["env_vars"]["WANDB_API_KEY"] == "given_on_purpose"
    text = describe_runtime_env(env)
    assert "WANDB_API_KEY" in text and "given_on_purpose" not in text and "INFO" not in text
