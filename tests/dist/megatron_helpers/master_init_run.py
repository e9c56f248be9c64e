"""One torchrun process: where a bf16 actor's fp32 master weights start, for a float32 and a bf16 checkpoint.

The CPU trains in float32 (builder.model_dtype); this script builds the actor with bf16 params as the GPU does
(megatron's Float16Module and distributed optimizer work on CPU too), so the master weights are distinct from
the model params. For each checkpoint it writes, to rank0.json:
  ckpt_sorted_equal  the sorted values of every fp32 main param equal the sorted checkpoint values (plus the vocab
                     padding's zeros): the master weights hold the checkpoint's values, whatever the fused layout
  model_is_rounding  every bf16 model param is its main param rounded
  embedding_max_diff the word embedding's main param against the checkpoint tensor, row for row
  moved_max / lr     the largest distance a main param moved in one update (two Adam steps)
  ckpt_max_diff_after / lr  the largest distance of a main param from the checkpoint after that update

    python -m torch.distributed.run --standalone --nproc_per_node=1 master_init_run.py --models DIR --out DIR
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import run_layout  # noqa: E402
import tiny  # noqa: E402

from hybridrl.adapters.megatron import builder, parallel  # noqa: E402
from hybridrl.config.schema.actor import ModelConfig  # noqa: E402
from hybridrl.config.schema.common import OptimConfig  # noqa: E402

LR = 1e-5


def mains_and_models(actor) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(param name, fp32 main param, bf16 model param) of every bf16 param (dp = 1: the main is the whole param)."""
    names = {id(p): n for n, p in actor.engine.chunks[0].named_parameters()}
    opt = actor.engine.optimizer
    out = []
    for o in getattr(opt, "chained_optimizers", [opt]):
        for models, mains in zip(o.model_float16_groups, o.shard_fp32_from_float16_groups):
            out += [(names[id(p)], m.detach().clone(), p.detach().float().flatten().clone()) for p, m in zip(models, mains)]
    return out


def check(path: str) -> dict:
    from safetensors.torch import load_file

    from hybridrl.adapters.megatron.actor import MegatronActor

    layout = parallel.layout_for(1, tp=1, pp=1)
    cfg = run_layout.actor_cfgs(SimpleNamespace(tp=1, pp=1, vpp=None, sp=False, ep=1), micro=2, dynamic=False,
                                distributed_optimizer=True)
    cfg = dataclasses.replace(cfg, optim=OptimConfig(lr=LR, weight_decay=0.0, clip_grad=1.0, lr_warmup_steps=-1,
                                                     lr_warmup_steps_ratio=0.0, total_training_steps=10))
    actor = MegatronActor(ModelConfig(path=path), cfg, layout, run_layout.batch_plan(layout, micro=2, dynamic=False))
    before = mains_and_models(actor)
    ckpt = {k: v.float() for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
    values = torch.cat([m for _, m, _ in before])
    padding = values.numel() - sum(v.numel() for v in ckpt.values())
    want = torch.cat([torch.cat([v.flatten() for v in ckpt.values()]), torch.zeros(max(padding, 0))])
    emb = next(m for n, m, _ in before if n.endswith("embedding.word_embeddings.weight"))
    table = ckpt["model.embed_tokens.weight"]
    actor.update_policy(run_layout.ppo_data(layout))
    after = mains_and_models(actor)
    moved = max(float((a - b).abs().max()) for (_, a, _), (_, b, _) in zip(after, before))
    ckpt_after = torch.cat([m for _, m, _ in after])
    return {
        "padding": padding,
        "ckpt_sorted_equal": bool(padding >= 0 and torch.equal(values.sort().values, want.sort().values)),
        "ckpt_on_bf16_grid": float((want == want.to(torch.bfloat16).float()).float().mean()),
        "embedding_max_diff": float((emb.view(-1, table.shape[1])[: table.shape[0]] - table).abs().max()),
        "model_is_rounding": all(torch.equal(m.to(torch.bfloat16).float(), p) for _, m, p in before + after),
        "moved_max_over_lr": moved / LR,
        "ckpt_max_diff_after_over_lr": float((ckpt_after.sort().values - want.sort().values).abs().max()) / LR
        if padding >= 0 else None,
        "bf16_changed": int(sum(int((pa != pb).sum()) for (_, _, pa), (_, _, pb) in zip(after, before))),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    parallel.ensure_process_group(timeout_s=300)
    parallel.init_megatron(parallel.layout_for(1, tp=1, pp=1), seed=7)
    builder.model_dtype = lambda layout: torch.bfloat16  # the GPU's params on the CPU (see the docstring)
    fp32 = tiny.make_model("qwen2", os.path.join(args.models, "fp32"))
    bf16 = os.path.join(args.models, "bf16", "qwen2")
    tiny.load_hf(fp32).to(torch.bfloat16).save_pretrained(bf16)
    out = {"rank": dist.get_rank(), "lr": LR, "float32": check(fp32), "bfloat16": check(bf16)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
