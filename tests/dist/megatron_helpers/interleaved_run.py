"""Two torchrun ranks, pp=2 x vpp=2 (megatron's interleaved schedule): no training pass runs on exactly pp
micro-batches, on which megatron-core 0.16.1 deadlocks (engine.check_interleaved_count).

  fixed     update_policy with 4-sample mini-batches and ppo_micro_batch_size_per_gpu=4: one micro-batch, rounded
            up to pp=2 before (the deadlock), to 2*pp=4 now
  dynamic   the same with a token budget that fits a mini-batch in one micro-batch
  refused   engine.run(forward_only=False) on 2 micro-batches: a ValueError instead of the deadlock
  forward   compute_log_prob on 2 micro-batches (forward only: pp is enough)
Writes rank{r}.json.

    python -m torch.distributed.run --standalone --nproc_per_node=2 interleaved_run.py --models DIR --out DIR
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from types import SimpleNamespace

import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))

import run_layout  # noqa: E402
import tiny  # noqa: E402

from hybridrl.adapters.megatron import parallel  # noqa: E402
from hybridrl.config.layout import BatchPlan  # noqa: E402
from hybridrl.config.schema.actor import ModelConfig  # noqa: E402
from hybridrl.protocol import DataProto  # noqa: E402

MINI = 4  # samples per mini-batch (dp=1): 2*pp


def plan(dynamic: bool) -> BatchPlan:
    n = run_layout.N_SAMPLES
    return BatchPlan(samples_per_step=n, mini_batch_samples=MINI, mini_batches_per_epoch=n // MINI, ppo_epochs=1,
                     mini_batch_per_dp=MINI, micro_batch_per_gpu=None if dynamic else MINI,
                     grad_accum=None if dynamic else 1, use_dynamic_bsz=dynamic, max_token_len_per_gpu=1000,
                     forward_micro_batch_per_gpu=6, forward_max_token_len_per_gpu=1000)


def actor_for(path: str, layout, dynamic: bool):
    from hybridrl.adapters.megatron.actor import MegatronActor

    args = SimpleNamespace(tp=1, pp=2, vpp=2, sp=False, ep=1)
    cfg = run_layout.actor_cfgs(args, micro=MINI, dynamic=dynamic, distributed_optimizer=False)
    actor = MegatronActor(ModelConfig(path=path), cfg, layout, plan(dynamic))
    counts = []
    run = actor.engine.run

    def counted(mbs, *a, **kw):
        counts.append(len(mbs))
        return run(mbs, *a, **kw)

    actor.engine.run = counted
    return actor, counts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    parallel.ensure_process_group(timeout_s=60)  # a deadlock ends in gloo's timeout, not the test's
    layout = parallel.layout_for(2, tp=1, pp=2, vpp=2)
    parallel.init_megatron(layout, seed=7)
    path = os.path.join(args.models, "qwen2")
    if dist.get_rank() == 0:
        tiny.make_model("qwen2", args.models)
    dist.barrier()
    data = run_layout.ppo_data(layout)
    out: dict = {"rank": dist.get_rank()}
    for way in ("fixed", "dynamic"):
        actor, counts = actor_for(path, layout, dynamic=way == "dynamic")
        metrics = actor.update_policy(data)
        out[way] = {"train_micro_batches": list(counts), "pg_loss_finite": math.isfinite(metrics["actor/pg_loss"])}
    mbs = actor._micro_batches(DataProto.from_dict(data.batch), [], 6, None)
    try:
        actor.engine.run(mbs, lambda logits, mb: (logits.float().mean(), {}), forward_only=False)
        out["refused"] = None
    except ValueError as e:
        out["refused"] = str(e)
    counts.clear()
    logp = actor.compute_log_prob(DataProto.from_dict(data.batch, meta_info={"temperature": 1.0}))
    out["forward"] = {"micro_batches": list(counts), "rows": int(logp.batch["log_probs"].shape[0])}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
