"""One torchrun launch: a MegatronCritic built from each tiny reward-model folder, in this layout.

    python -m torch.distributed.run --nproc_per_node=N --standalone critic_run.py --models DIR --out DIR --tp T

For each model: the values of the saved batch (padded and packed micro-batches), the exported `score.*` tensors
before and after one critic update, and a checkpoint after that update (DIR/ckpt_<model>). rank<N>.json holds
{model: {"values": {way: [B, R]}, "score_before": {...}, "score_after": {...}}}; rank 0 also writes every exported
tensor after the update to DIR/exported_<model>.pt for the converter's output to be compared with.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from hybridrl.adapters.megatron import parallel  # noqa: E402
from hybridrl.adapters.megatron.critic import MegatronCritic  # noqa: E402
from hybridrl.config.layout import BatchPlan  # noqa: E402
from hybridrl.config.schema.common import MegatronConfig, OptimConfig  # noqa: E402
from hybridrl.config.schema.critic import CriticConfig, CriticModelConfig  # noqa: E402
from hybridrl.protocol import DataProto  # noqa: E402


def critic_cfg(path: str, tp: int, packed: bool) -> CriticConfig:
    optim = OptimConfig(lr=5e-2, weight_decay=0.0, clip_grad=10.0, lr_warmup_steps=0, total_training_steps=10)
    megatron = MegatronConfig(tensor_model_parallel_size=tp, use_distributed_optimizer=False, seed=7)
    return CriticConfig(rollout_n=1, optim=optim, megatron=megatron,
                        model=CriticModelConfig(path=path, tokenizer_path="", external_lib=None,
                                                trust_remote_code=False, use_remove_padding=packed),
                        ppo_mini_batch_size=10, ppo_micro_batch_size_per_gpu=5, use_dynamic_bsz=False,
                        forward_max_token_len_per_gpu=40, ppo_epochs=1, shuffle=False,
                        loss_agg_mode="token-mean", data_loader_seed=None)


def exported(critic: MegatronCritic) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for bucket in critic.export_weights(1 << 20) for n, t in bucket}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tp", type=int, default=1)
    args = p.parse_args()
    parallel.ensure_process_group(timeout_s=120)
    layout = parallel.layout_for(dist.get_world_size(), tp=args.tp)
    parallel.init_megatron(layout, seed=7)
    batch = torch.load(os.path.join(args.models, "batch.pt"))
    rows = len(batch["input_ids"])
    plan = BatchPlan(samples_per_step=rows, mini_batch_samples=rows, mini_batches_per_epoch=1, ppo_epochs=1,
                     mini_batch_per_dp=rows, micro_batch_per_gpu=5, grad_accum=2, use_dynamic_bsz=False,
                     max_token_len_per_gpu=40, forward_micro_batch_per_gpu=3, forward_max_token_len_per_gpu=40)
    data = DataProto.from_dict({k: batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses",
                                                      "response_mask")})
    out: dict = {}
    for name in json.load(open(os.path.join(args.models, "names.json"))):
        path = os.path.join(args.models, name)
        critic = MegatronCritic(critic_cfg(path, args.tp, packed=False), layout, plan)
        values = {}
        for way, packed in (("padded", False), ("packed", True)):
            critic.remove_padding = packed
            values[way] = critic.compute_values(data).batch["values"].tolist()
        critic.remove_padding = False
        before = exported(critic)
        mask = data.batch["response_mask"]
        update = data.union(DataProto.from_dict({"values": torch.tensor(values["padded"]) * mask,
                                                 "returns": (torch.tensor(values["padded"]) + 1.0) * mask}))
        critic.update_critic(update)
        after = exported(critic)
        critic.save_checkpoint(os.path.join(args.out, f"ckpt_{name}"))
        if dist.get_rank() == 0:
            torch.save(after, os.path.join(args.out, f"exported_{name}.pt"))
        out[name] = {"values": values, "names": sorted(after),
                     "score_before": {n: t.tolist() for n, t in before.items() if n.startswith("score.")},
                     "score_after": {n: t.tolist() for n, t in after.items() if n.startswith("score.")}}
    with open(os.path.join(args.out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
