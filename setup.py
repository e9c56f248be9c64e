"""hybridrl: Megatron-core RL post-training (PPO, GRPO) with vLLM rollout and a Ray single controller.

`adapters/` ships as `hybridrl.adapters` (through the symlink hybridrl/adapters -> ../adapters):
a top-level `adapters` import would clash with an unrelated PyPI distribution of that name.
"""
from setuptools import find_packages, setup

# torch is not pinned: the CPU build (2.13.0) or the GPU host's (2.11.0+cu130) must be kept as found.
# An unpinned `torch` pulled by pip on a machine without it would be a multi-GB CUDA build, so
# `make setup` installs the CPU build first.
INSTALL_REQUIRES = [
    "torch>=2.6",
    "megatron-core==0.16.1",
    "ray==2.60.0",
    "transformers>=4.51",
    "tokenizers",
    "safetensors",
    "numpy",
    "pyarrow",
    "pyyaml",
    "psutil",  # dist_checkpointing's writer hangs without it (../shared/notes/megatron-cpu.md)
    "tqdm",
    "tensorboard",
    "matplotlib",
    "nvidia-ml-py",
    "sentencepiece",
]

EXTRAS = {
    "gpu": ["vllm==0.26.0"],
    "data": ["reasoning-gym==0.1.25"],
    "dev": ["pytest", "pytest-timeout", "ruff", "wandb", "reasoning-gym==0.1.25", "pandas",
            "peft>=0.21,<0.23",  # the LoRA tests' independent reference (tests/dist/test_megatron_lora.py)
            "gguf==0.19.0"],  # the GGUF tokenizer tests (tests/unit/test_data_tokenizer.py), skipped without it
}

setup(
    name="hybridrl",
    version="0.1.0",
    description="Megatron-core RL post-training for LLMs with a 3D-HybridEngine and a Ray single controller",
    python_requires=">=3.10",
    packages=find_packages(include=["hybridrl", "hybridrl.*"]),
    package_data={"hybridrl": ["../configs/**/*.yaml"]},
    include_package_data=True,
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["hybridrl=hybridrl.__main__:main"]},
)
