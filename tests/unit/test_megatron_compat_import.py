"""compat.apply() on CPU imports megatron-core without its torch.compile fuser (compat._import_megatron_without_compile):
the decoration alone imported inductor and dynamo, ~2.5 CPU-s of every worker, torchrun rank and CLI start-up; and
without wandb, which megatron's inference context imported for metrics hybridrl never logs (~0.8 CPU-s)."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# In a fresh interpreter: the pytest process may have imported megatron already (then apply() leaves it as it is).
CHILD = """
import sys
import torch
compile_ = torch.compile
from hybridrl.adapters.megatron import compat
compat.apply(force_cpu=True)
from megatron.core import jit
from megatron.core.fusions import fused_bias_geglu
print(torch.compile is compile_, jit.jit_fuser is jit.noop_decorator,
      fused_bias_geglu.geglu.__code__.co_filename == fused_bias_geglu.__file__, "torch._inductor.compile_fx" in sys.modules)
from megatron.core.inference.contexts import dynamic_context
from megatron.core import timers
print(dynamic_context.HAVE_WANDB, timers.wandb is None, "wandb" in sys.modules)
import wandb  # hybridrl's logger: wandb was hidden from megatron's import only
print(wandb.__name__)
"""


def test_apply_imports_megatron_with_its_fuser_off_and_torch_compile_put_back():
    env = dict(os.environ, PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    # megatron's fused geglu is its own code, not dynamo's wrapper (eval_frame.py) as a plain import makes it
    assert out.stdout.split() == ["True", "True", "True", "False", "False", "True", "False", "wandb"], out.stdout
