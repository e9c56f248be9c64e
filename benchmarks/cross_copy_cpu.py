"""CPU timing print (not a test, not a GPU number): the bucketed export + load_weights vs the cross-GPU direct
copy (hybridrl.hybrid.remote) for one weight sync, over gloo, into the torch engine (full model on every rank).

    .venv/bin/python -m torch.distributed.run --nproc_per_node=2 --standalone benchmarks/cross_copy_cpu.py [tp pp]

Builds a random Qwen2-shaped model (hidden 256, 4 layers, fp32), a MegatronActor in (tp, pp) (default 2 1, i.e.
tp2 -> tp_g1), and syncs it REPS times each way after the proof sync. Prints per rank: bytes written into the
engine, bytes received from other ranks, export buckets vs cross-copy rounds, and the median sync seconds.
gloo on 2 shared cores says nothing about NVLink: the GPU run (benchmarks/four_gpu.py) measures the floor.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist

REPS = 5


def build(hf_dir: str, tp: int, pp: int):
    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.adapters.megatron.parallel import layout_for
    from hybridrl.config.layout import BatchPlan
    from hybridrl.config.schema.actor import ActorConfig, ModelConfig
    from hybridrl.config.schema.common import MegatronConfig, OptimConfig

    layout = layout_for(dist.get_world_size(), tp=tp, pp=pp)
    megatron = MegatronConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, seed=7)
    cfg = ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, megatron=megatron,
                      optim=OptimConfig(lr=1e-3, total_training_steps=10))
    plan = BatchPlan(samples_per_step=4, mini_batch_samples=4, mini_batches_per_epoch=1, ppo_epochs=1,
                     mini_batch_per_dp=4 // layout.dp, micro_batch_per_gpu=2, grad_accum=max(1, 2 // layout.dp),
                     use_dynamic_bsz=False, max_token_len_per_gpu=64, forward_micro_batch_per_gpu=2,
                     forward_max_token_len_per_gpu=64)
    return MegatronActor(ModelConfig(path=hf_dir), cfg, layout, plan)


def save_model(folder: str):
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False, use_sliding_window=False)
    if dist.get_rank() == 0:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(folder)
    dist.barrier()
    return cfg


def timed(sync, steps) -> tuple[float, dict]:
    seconds, metrics = [], {}
    for step in steps:
        metrics = sync.push(step)
        sync.release()
        seconds.append(metrics["timing_s/reshard_stream"])
    return statistics.median(seconds), metrics


def main() -> None:
    from hybridrl.adapters.megatron.parallel import ensure_process_group
    from hybridrl.hybrid import SyncOptions, WeightSync
    from hybridrl.rollout.torch_engine import TorchRolloutEngine

    torch.set_num_threads(1)
    ensure_process_group(timeout_s=120)
    tp, pp = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (2, 1)
    folder = os.path.join(tempfile.gettempdir(), "hybridrl_cross_copy_cpu")
    cfg = save_model(folder)
    actor = build(folder, tp, pp)
    engine = TorchRolloutEngine(cfg, pad_token_id=0)
    rows = []
    for direct in (False, True):
        sync = WeightSync(actor, engine, SyncOptions(bucket_bytes=4 << 20, direct=direct))
        sync.push(0)  # the proof sync (bucketed either way)
        sync.release()
        rows.append((direct, *timed(sync, range(1, 1 + REPS))))
    for r in range(dist.get_world_size()):
        if r == dist.get_rank():
            for direct, seconds, m in rows:
                print(f"rank {r} tp{tp} pp{pp} {'cross-direct' if direct else 'bucketed    '}: "
                      f"{m['reshard/bytes'] / 2**20:6.2f} MiB into the engine, "
                      f"{m['reshard/remote_bytes'] / 2**20:6.2f} MiB received p2p, "
                      f"{int(m['reshard/buckets'])} export buckets / {int(m['reshard/tensors'])} HF tensors, "
                      f"{int(m['reshard/remote_rounds'])} p2p rounds, median {seconds * 1e3:7.1f} ms", flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
