"""One torchrun launch of test_megatron_cp.py: a transformer-engine actor with context_parallel_size=N on N GPUs;
log-probs and entropy (padded and packed micro-batches) and one PPO update each way, written by rank 0 as JSON.

    torchrun --nproc_per_node=N tests/gpu/cp_worker.py --model DIR --out FILE
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import test_megatron_te as te  # noqa: E402  (its batch and actor builders)

from hybridrl.adapters.megatron import parallel  # noqa: E402
from hybridrl.config.layout import ParallelLayout  # noqa: E402
from hybridrl.protocol import DataProto  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    parallel.ensure_process_group(timeout_s=300)
    cp = dist.get_world_size()
    layout = ParallelLayout(world_size=cp, tp=1, pp=1, cp=cp, vpp=None, dp=1, sequence_parallel=False, dtype="bfloat16")
    parallel.init_megatron(layout, seed=1)
    out = {"cp": cp}
    batch = te.make_batch(seed=2)
    for packed in (False, True):
        actor = te.build(args.model, layout, "transformer_engine", packed=packed)
        res = actor.compute_log_prob(DataProto.from_dict(batch), calculate_entropy=True).batch
        data = te.ppo_data(actor, seed=4)
        metrics = actor.update_policy(data)
        out["packed" if packed else "padded"] = {"log_probs": res["log_probs"].tolist(), "entropys": res["entropys"].tolist(),
                                                 "pg_loss": metrics["actor/pg_loss"], "grad_norm": metrics["actor/grad_norm"]}
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
