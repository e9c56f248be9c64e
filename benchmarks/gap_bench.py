"""Where the rollout-vs-actor log-prob gap comes from: each bf16 engine against a float32 reference.

On one GPU (CUDA graphs on, as users run vLLM), the real role worker (hybridrl.workers.ActorRolloutRefWorker: Megatron actor + colocated vLLM,
weights synced by the 3D-HybridEngine) generates responses; then the same tokens are scored by
  vllm              the rollout engine's own token log-probs (what the gap metric compares)
  megatron_sdpa     the actor, bf16, core attention on torch SDPA (the default: adapters/megatron/attention.py)
  megatron_local    the actor, bf16, megatron's DotProductAttention (attention_backend=local)
  hf_bf16           transformers, bf16, SDPA attention: a third, independent bf16 implementation
  hf_fp32           transformers, float32 (TF32 off): the reference
and prints/writes |a - b| (mean, max over response tokens) for every engine against vllm and against hf_fp32.
If gap(vllm, megatron) ~ sqrt(err(vllm)^2 + err(megatron)^2) with err(x) = gap(x, hf_fp32), the gap is the
two engines' independent bf16 rounding and not a resharding error.

    PYTHONPATH=$PWD:/tmp/site python benchmarks/gap_bench.py --model-dir /tmp/qwen2_1.5b --out gap.json
    python benchmarks/gap_bench.py --cpu-dry-run      # the same code on CPU: tiny model, torch engine, fp32
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import gap_table, hf_log_probs, make_prompts, start_worker, swap_attention  # noqa: E402

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default=None, help="HF folder (default: a random model of --shape, built here)")
    p.add_argument("--shape", default="1.5b", help="benchmarks/multi_gpu_bench.py SHAPES key for a built model")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--chunk", type=int, default=8, help="sequences per transformers forward")
    p.add_argument("--out", default=None, help="results JSON (DEVELOPERS.md format)")
    p.add_argument("--rollout-rows", type=int, default=None,
                   help="max_rollout_rows of the worker (the CUDA-graph capture sizes): a trainer run's train_batch_size "
                        "x n shares its compiled graphs with this run (vLLM's compile cache hashes the sizes)")
    p.add_argument("--override", action="append", default=[], help="extra key=value config override (repeatable)")
    p.add_argument("--cpu-dry-run", action="store_true")
    return p.parse_args()


def overrides(args: argparse.Namespace, model_dir: str) -> list[str]:
    n = args.prompts
    return [
        "preset=1.5b_2gpu", "trainer.n_gpus_per_node=1", f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_batch_size={n}", f"actor_rollout_ref.actor.ppo_mini_batch_size={n}",
        f"data.max_prompt_length={args.prompt_len}", f"data.max_response_length={args.max_tokens}",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.ignore_eos=true",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.temperature=1.0", "trainer.device=cuda", *args.override,
    ]


def main() -> None:
    import torch
    from multi_gpu_bench import make_model

    from hybridrl.hybrid.checks import routing_agreement

    args = parse()
    cpu = args.cpu_dry_run
    if cpu:
        args.shape = args.shape if args.shape in ("tiny", "moe_tiny") else "tiny"
        args.prompts, args.max_tokens, args.prompt_len = 8, 16, 8
    model_dir = args.model_dir or os.path.join(tempfile.mkdtemp(), f"qwen2_{args.shape}")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        make_model(model_dir, args.shape)
    start = time.perf_counter()
    worker, used, _ = start_worker(overrides(args, model_dir), model_dir, cpu, max_rollout_rows=args.rollout_rows)
    print(f"worker up in {time.perf_counter() - start:.0f}s", flush=True)

    with open(os.path.join(model_dir, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]  # the model's own: a real model (--model-dir) need not match --shape
    prompts = make_prompts(args.prompts, args.prompt_len, vocab)
    out = worker.generate_sequences(prompts)
    out.meta_info["temperature"] = 1.0
    mask = out.batch["response_mask"]
    lps = {"vllm": out.batch["rollout_log_probs"]}
    actor_out = worker.compute_log_prob(out)
    lps["megatron_sdpa"] = actor_out.batch["old_log_probs"]
    # MoE with the rollout's routing recorded: the actor's top-k against it ({} otherwise)
    routing = routing_agreement({"response_mask": mask, **{k: actor_out.batch[k] for k in ("routing_agreement",)
                                                           if k in actor_out.batch}})
    swapped = swap_attention(worker, to_local=True)
    lps["megatron_local"] = worker.compute_log_prob(out).batch["old_log_probs"]
    swap_attention(worker, to_local=False)
    if not cpu:  # room for the transformers copies
        worker.actor.offload(params=True, grads=True, optimizer=True)

    torch.backends.cuda.matmul.allow_tf32 = False  # a float32 reference must not run its matmuls in TF32
    torch.set_float32_matmul_precision("highest")
    device = "cpu" if cpu else "cuda"
    ids = out.batch["input_ids"]
    if not cpu:
        lps["hf_bf16"] = hf_log_probs(model_dir, torch.bfloat16, device, ids, args.prompt_len, args.chunk)
    lps["hf_fp32"] = hf_log_probs(model_dir, torch.float32, device, ids, args.prompt_len, args.chunk)

    table = gap_table(lps, mask)
    for k, v in table.items():
        print(f"{k:32s} mean {v['mean']:.5f}  max {v['max']:.4f}", flush=True)
    for k, v in routing.items():
        print(f"{k:32s} {v:.4f}", flush=True)
    metrics = {"logprob_abs_diff_mean": table["megatron_sdpa_vs_vllm"]["mean"],
               "logprob_abs_diff_max": table["megatron_sdpa_vs_vllm"]["max"],
               **{f"{k}_abs_diff_mean": v["mean"] for k, v in table.items()},
               **{f"{k}_abs_diff_max": v["max"] for k, v in table.items()},
               "response_tokens": float(mask.sum()), "attention_modules_swapped": float(swapped),
               "rollout_logprob_mean": float(lps["vllm"][mask.bool()].mean()),
               **{k.split("/")[-1]: v for k, v in routing.items()}}
    if args.out and not cpu:
        import datetime

        record = {"command": "PYTHONPATH=$PWD:/tmp/site python " + " ".join(sys.argv), "device": torch.cuda.get_device_name(),
                  "date": datetime.date.today().isoformat(), "metrics": metrics,
                  "setup": {"model_dir": model_dir, "shape": args.shape, "overrides": used}}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        print(f"wrote {args.out}", flush=True)
    assert swapped > 0, "no SDPA attention module found in the actor: the local spec did not use it"


if __name__ == "__main__":
    main()
