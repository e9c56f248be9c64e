"""One torchrun launch of test_megatron_layouts_gpu.py: the Megatron actor in one layout (tp, pp, vpp, ep; dp is what
is left of the world), log-probs and entropy of a fixed batch, one PPO update, log-probs after it. Rank 0 writes the
whole batch's rows (gathered from the ranks that hold the last stage's tp rank 0) as JSON.

    torchrun --nproc_per_node=N tests/gpu/layout_worker.py --model DIR --out FILE [--tp T --pp P --vpp V --ep E]
        [--dtype bfloat16|float32] [--cpu]

--cpu runs it on gloo (the dry run of the same code; megatron's CPU compatibility layer).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "dist", "megatron_helpers"))
sys.path.insert(0, ROOT)

import tiny  # noqa: E402  (tiny random HF models and verl-layout batches)

from hybridrl.adapters.megatron import compat, parallel  # noqa: E402
from hybridrl.protocol import DataProto  # noqa: E402

SAMPLES, MICRO = 16, 2  # one optimizer step of 16 samples, micro-batches of 2 on every dp rank


def build(model: str, layout, args: argparse.Namespace):
    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.config.layout import BatchPlan
    from hybridrl.config.schema.actor import ActorConfig, ModelConfig
    from hybridrl.config.schema.common import MegatronConfig, OptimConfig

    megatron = MegatronConfig(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                              virtual_pipeline_model_parallel_size=args.vpp, expert_model_parallel_size=args.ep,
                              use_distributed_optimizer=True, sequence_parallel=False, seed=1,
                              transformer_impl="local" if args.cpu else None)
    per_dp = SAMPLES // layout.dp
    actor = ActorConfig(ppo_mini_batch_size=SAMPLES, ppo_micro_batch_size_per_gpu=MICRO, loss_agg_mode="token-mean",
                        clip_ratio=0.2, optim=OptimConfig(lr=1e-4, clip_grad=1.0, total_training_steps=10),
                        megatron=megatron)
    plan = BatchPlan(samples_per_step=SAMPLES, mini_batch_samples=SAMPLES, mini_batches_per_epoch=1, ppo_epochs=1,
                     mini_batch_per_dp=per_dp, micro_batch_per_gpu=MICRO, grad_accum=per_dp // MICRO,
                     use_dynamic_bsz=False, max_token_len_per_gpu=4096, forward_micro_batch_per_gpu=MICRO * 2,
                     forward_max_token_len_per_gpu=4096)
    return MegatronActor(ModelConfig(path=model), actor, layout, plan)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--vpp", type=int, default=None)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--cpu", action="store_true")
    args = p.parse_args()
    if args.cpu:
        compat.apply()
    parallel.ensure_process_group(timeout_s=300)
    world = dist.get_world_size()
    layout = parallel.layout_for(world, args.tp, args.pp, args.vpp, dtype=args.dtype, ep=args.ep)
    parallel.init_megatron(layout, seed=1)
    actor = build(args.model, layout, args)

    full = tiny.make_batch(SAMPLES, prompt_len=24, resp_len=20, seed=5)
    full.update(tiny.ppo_inputs(full, seed=6))
    info = actor.dispatch_info()
    rows = slice(info.dp_rank * SAMPLES // layout.dp, (info.dp_rank + 1) * SAMPLES // layout.dp)
    mine = DataProto.from_dict({k: v[rows] for k, v in full.items()}, meta_info={"temperature": 1.0})
    out = actor.compute_log_prob(mine, calculate_entropy=True).batch
    before, entropy = out["log_probs"], out["entropys"]
    # old log-probs off the current ones by fixed noise: the ratio is not 1, so the loss depends on the model
    mine.batch["old_log_probs"] = (before + 0.05 * full["values"][rows]) * mine.batch["response_mask"]
    metrics = actor.update_policy(mine)
    after = actor.compute_log_prob(mine).batch["log_probs"]

    pieces = [None] * world
    dist.all_gather_object(pieces, (info.dp_rank, info.is_collect, before, entropy, after))
    if dist.get_rank() == 0:
        got = {d: (b, e, a) for d, c, b, e, a in pieces if c}
        join = lambda i: torch.cat([got[d][i] for d in range(layout.dp)]).tolist()  # noqa: E731
        record = {"layout": {"tp": args.tp, "pp": args.pp, "vpp": args.vpp, "ep": args.ep, "dp": layout.dp},
                  "dtype": args.dtype, "log_probs": join(0), "entropys": join(1), "log_probs_after": join(2),
                  "response_mask": full["response_mask"].tolist(), "pg_loss": metrics["actor/pg_loss"],
                  "grad_norm": metrics["actor/grad_norm"],
                  "device": torch.cuda.get_device_name() if compat.cuda_in_use() else "cpu"}
        with open(args.out, "w") as f:
            json.dump(record, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
