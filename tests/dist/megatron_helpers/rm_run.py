"""One torchrun launch: MegatronRewardModel's scores of the saved batch, for each tiny reward model, in this layout.

    python -m torch.distributed.run --nproc_per_node=N --standalone rm_run.py --models DIR --out DIR --tp T [--pp P]

Each model is scored three ways: padded micro-batches of 3 rows, dynamic micro-batches of <= 40 tokens, and packed
(THD) micro-batches; rank<N>.json holds {model: {way: [B] scores}} for the test to compare with transformers.
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
from hybridrl.adapters.megatron.reward_model import MegatronRewardModel  # noqa: E402
from hybridrl.config.schema.common import MegatronConfig  # noqa: E402
from hybridrl.config.schema.critic import RewardModelConfig, RewardModelModelConfig  # noqa: E402
from hybridrl.protocol import DataProto  # noqa: E402

WAYS = {"padded": dict(micro_batch_per_gpu=3, max_token_len_per_gpu=None, remove_padding=False),
        "dynamic": dict(micro_batch_per_gpu=None, max_token_len_per_gpu=40, remove_padding=False),
        "packed": dict(micro_batch_per_gpu=4, max_token_len_per_gpu=None, remove_padding=True)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    args = p.parse_args()
    parallel.ensure_process_group(timeout_s=120)
    layout = parallel.layout_for(dist.get_world_size(), tp=args.tp, pp=args.pp)
    parallel.init_megatron(layout, seed=7)
    batch = torch.load(os.path.join(args.models, "batch.pt"))
    data = DataProto.from_dict({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]})
    megatron = MegatronConfig(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                              use_distributed_optimizer=False, seed=7)
    out: dict = {}
    for name in json.load(open(os.path.join(args.models, "names.json"))):
        cfg = RewardModelConfig(enable=True, megatron=megatron,
                                model=RewardModelModelConfig(path=os.path.join(args.models, name), input_tokenizer=None))
        out[name] = {}
        for way, kwargs in WAYS.items():
            rm = MegatronRewardModel(cfg, layout, **kwargs)
            out[name][way] = rm.compute_scores(data).batch["rm_score"].tolist()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
