"""One torchrun launch: the memory knobs of the scale runs (benchmarks/runs.py's scale_SHAPE rows) against the plain actor.

Two PPO updates of the tiny Qwen2 actor (run_layout.py's batch, configs and plan; packed micro-batches cut by
tokens, as the scale runs do) with
  plain      no knob
  recompute  actor_rollout_ref.model.enable_gradient_checkpointing (megatron full recompute of every layer)
  bf16_grads megatron.override_ddp_config.grad_reduce_in_fp32=false (the CPU trains in float32, so the grad
             buffer stays float32 and the numbers must not move; the test checks the flag reached megatron's DDP)
and the log-probs after the updates; rank<N>.json for the test to compare.

    python -m torch.distributed.run --standalone --nproc_per_node=1 knobs_run.py --models DIR --out DIR
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from types import SimpleNamespace

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import run_layout  # noqa: E402

from hybridrl.adapters.megatron import parallel  # noqa: E402
from hybridrl.config.schema.actor import ModelConfig  # noqa: E402

KNOBS = {"plain": ({}, {}), "recompute": ({"enable_gradient_checkpointing": True}, {}),
         "bf16_grads": ({}, {"grad_reduce_in_fp32": False})}


def mlp_saved_bytes(actor, tokens: int) -> dict:
    """Bytes one megatron MLP keeps for its backward over `tokens` tokens (unique storages the autograd graph
    saves, its weights left out), beside the sizes the plan's formula needs."""
    import torch

    mlp = next(m for n, m in actor.engine.chunks[0].named_modules() if n.endswith("layers.0.mlp"))
    params = {p.untyped_storage().data_ptr() for p in mlp.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            kept[ptr] = t.untyped_storage().nbytes()
        return t

    h = mlp.config.hidden_size
    x = torch.randn(tokens, 1, h, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = mlp(x)
    y = y[0] if isinstance(y, tuple) else y
    y.sum().backward()
    return {"bytes": sum(kept.values()), "tokens": tokens, "hidden": h, "ffn": mlp.config.ffn_hidden_size,
            "gated": bool(mlp.config.gated_linear_unit), "dtype_bytes": x.element_size()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    layout_args = SimpleNamespace(tp=1, pp=1, vpp=None, sp=False, ep=1)
    parallel.ensure_process_group(timeout_s=300)
    layout = parallel.layout_for(dist.get_world_size(), tp=1, pp=1)
    parallel.init_megatron(layout, seed=7)
    from hybridrl.adapters.megatron.actor import MegatronActor

    data = run_layout.ppo_data(layout)
    plan = run_layout.batch_plan(layout, micro=2, dynamic=True, max_tokens=40)
    out: dict = {"rank": dist.get_rank()}
    for name, (model_knobs, ddp) in KNOBS.items():
        model = ModelConfig(path=os.path.join(args.models, "qwen2"), use_remove_padding=True, **model_knobs)
        cfg = run_layout.actor_cfgs(layout_args, micro=2, dynamic=True, distributed_optimizer=True)
        cfg = dataclasses.replace(cfg, megatron=dataclasses.replace(cfg.megatron, override_ddp_config=ddp))
        actor = MegatronActor(model, cfg, layout, plan)
        steps = [actor.update_policy(data), actor.update_policy(data)]
        after = actor.compute_log_prob(data).batch["log_probs"]
        ddp_config = actor.engine.chunks[0].ddp_config
        if name == "plain":
            out["mlp_saved"] = mlp_saved_bytes(actor, tokens=24)
        out[name] = {"steps": steps, "log_probs_after": after.tolist(),
                     "grad_reduce_in_fp32": ddp_config.grad_reduce_in_fp32,
                     "recompute_granularity": actor.engine.chunks[0].config.recompute_granularity}
    run_layout.finish(args.out, out)


if __name__ == "__main__":
    main()
