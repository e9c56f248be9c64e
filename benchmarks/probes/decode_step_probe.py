"""Where do vLLM's ~4 ms per decode step go? (issue 33: generation does not scale with dp)

four_gpu.md (2 x H200, 2026-11-27): the hybrid engine's vLLM took 8.6 ms per decode step for 256 sequences and 6.4 ms
for 128 on the random 1.5B model, about 4.2 ms fixed + 0.017 ms per sequence, against a 0.65 ms weight-read floor.
A fixed per-step cost is not divided by data parallelism. This probe times the same generation (prompts x n=8
samples, 64-token prompts, 256 new tokens, ignore_eos, in-process engine, CUDA graphs) at 64, 128 and 256
sequences in four variants, and fits ms/step = a + b x sequences for each:
  ours          per-request seeds (every sample its own torch.Generator: vLLM's sampler then loops over the
                requests one by one, and skips FlashInfer's sampling) and the sampled token's log-prob
  no_seed       the engine's own generator (no per-request seeds), log-probs kept
  no_logprobs   per-request seeds, no log-probs
  bare          neither
`gc.freeze()` after the engine is built is a fifth variant (Python's collector walks a process that also holds
the Megatron model).

    PYTHONPATH=$PWD:/tmp/site VLLM_ENABLE_V1_MULTIPROCESSING=0 python3 benchmarks/probes/decode_step_probe.py \
        --model-dir /tmp/m_1.5b --out $OUT/decode_step_probe.json

Whether engines slow each other down on one host (the dp replicas): run one copy per GPU at once, e.g.
    for i in 0 1 2 3; do CUDA_VISIBLE_DEVICES=$i python3 ... --sizes 128 --variants ours,no_seed --no-gc-freeze \
        --out $OUT/probe_together_$i.json & done; wait

Answer: not run yet (written 2026-11-27 for the next GPU lease).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPT, NEW, N = 64, 256, 8
VARIANTS = {"ours": (True, True), "no_seed": (False, True), "no_logprobs": (True, False), "bare": (False, False)}


def requests(count: int, seeded: bool, logprobs: bool, vocab: int):
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": [(7 * i + j) % (vocab - 10) + 5 for j in range(PROMPT)]} for i in range(count // N)]
    params = [SamplingParams(n=N, temperature=1.0, top_p=1.0, top_k=0, max_tokens=NEW, ignore_eos=True,
                             detokenize=False, logprobs=0 if logprobs else None, seed=1000 + i * N if seeded else None)
              for i in range(len(prompts))]
    return prompts, params


def time_one(llm, count: int, variant: str, vocab: int, reps: int, spreads: dict | None = None) -> float:
    prompts, params = requests(count, *VARIANTS[variant], vocab)
    seconds = []
    for _ in range(reps):
        llm.reset_prefix_cache()
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
    if spreads is not None:
        spreads[count] = [min(seconds) / NEW * 1e3, max(seconds) / NEW * 1e3]
    return statistics.median(seconds) / NEW * 1e3  # ms per decode step (prefill included, one step of 256)


def fit(points: dict[int, float]) -> tuple[float, float]:
    xs, ys = list(points), list(points.values())
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--sizes", default="64,128,256")
    p.add_argument("--variants", default=",".join(VARIANTS), help="a subset of " + ",".join(VARIANTS))
    p.add_argument("--no-gc-freeze", action="store_true", help="leave out the gc.freeze() variant")
    args = p.parse_args()
    from vllm import LLM

    sizes = [int(s) for s in args.sizes.split(",")]
    llm = LLM(model=args.model_dir, skip_tokenizer_init=True, dtype="bfloat16", load_format="dummy",
              gpu_memory_utilization=0.4, max_num_seqs=max(sizes), logprobs_mode="processed_logprobs",
              disable_log_stats=True, enable_prefix_caching=True)
    vocab = llm.llm_engine.model_config.hf_config.vocab_size
    cfg = llm.llm_engine.vllm_config
    result = {"async_scheduling": cfg.scheduler_config.async_scheduling,
              "capture_sizes": cfg.compilation_config.cudagraph_capture_sizes, "variants": {}}
    time_one(llm, sizes[0], "ours", vocab, 1)  # warm-up
    result["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    for variant in args.variants.split(","):
        spreads: dict[int, list[float]] = {}
        points = {s: time_one(llm, s, variant, vocab, args.reps, spreads) for s in sizes}
        a, b = fit(points) if len(points) > 1 else (float("nan"), float("nan"))
        result["variants"][variant] = {"ms_per_step": points, "spread_ms": spreads, "fixed_ms": a, "per_sequence_ms": b}
        print(f"[decode probe] {variant:12s} " + " ".join(f"{s}: {v:.2f} ms" for s, v in points.items())
              + f"  -> {a:.2f} ms + {b * 1e3:.1f} us/seq", flush=True)
    if not args.no_gc_freeze:
        gc.collect()
        gc.freeze()
        points = {s: time_one(llm, s, "ours", vocab, args.reps) for s in sizes}
        a, b = fit(points) if len(points) > 1 else (float("nan"), float("nan"))
        result["variants"]["ours_gc_frozen"] = {"ms_per_step": points, "fixed_ms": a, "per_sequence_ms": b}
        print("[decode probe] ours+gcfreeze " + " ".join(f"{s}: {v:.2f} ms" for s, v in points.items())
              + f"  -> {a:.2f} ms + {b * 1e3:.1f} us/seq", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
