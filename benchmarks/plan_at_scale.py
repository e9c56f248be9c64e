"""docs/plan_at_scale.md: `hybridrl plan --search` for Qwen2.5-72B and Qwen3-30B-A3B on 64 to 512 GPUs (issue 43).

    .venv/bin/python benchmarks/plan_at_scale.py [--net-gbps 400 100] [--out docs/plan_at_scale.md]

Predictions, not measurements: the step-time model (hybridrl/plan/step_time.py) calibrated on 1- to 4-GPU H200 runs
(benchmarks/results/plan_calibration.json), the memory plan of `hybridrl plan`, and an assumed network between nodes.
The models' shapes come from their published config.json files, kept in benchmarks/plan_models/ (no hub access).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {"Qwen2.5-72B": "benchmarks/plan_models/Qwen2.5-72B", "Qwen3-30B-A3B": "benchmarks/plan_models/Qwen3-30B-A3B"}
GPU_COUNTS = (64, 128, 256, 512)
# One GRPO job for every row: 512 prompts x 16 samples, prompts up to 1k tokens and responses up to 4k, packed
# micro-batches of 16k tokens, a KL loss against the reference (a DAPO/GSM8K-scale job of the peers' tables).
JOB = ["data.train_batch_size=512", "actor_rollout_ref.actor.ppo_mini_batch_size=128", "actor_rollout_ref.rollout.n=16",
       "data.max_prompt_length=1024", "data.max_response_length=4096", "actor_rollout_ref.actor.use_kl_loss=true",
       "actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.actor.use_dynamic_bsz=true",
       "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384", "actor_rollout_ref.rollout.gpu_memory_utilization=0.5"]


def search(model: str, gpus: int, net_gbps: float) -> dict:
    from hybridrl.plan.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["--search", "--json", "--config-name", "grpo_trainer", "--model-config", os.path.join(ROOT, MODELS[model]),
                     "--gpus", str(gpus), "--gpu-mem-gb", "139.8", "--gpu-type", "H200", "--net-gbps", str(net_gbps),
                     *JOB])
    out = json.loads(buf.getvalue())
    out["exit"] = code
    return out


def row(model: str, gpus: int, net: float, out: dict) -> str:
    if not out["ranked"]:
        return f"| {model} | {gpus} | {net:g} | nothing fits | | | | | |"
    b = out["ranked"][0]
    s = b["predicted_seconds"]
    layout = f"tp{b['tp']} pp{b['pp']} cp{b['cp']} ep{b['ep']} dp{b['dp']}"
    knobs = "+".join(k for k, on in (("opt-offload", b["optimizer_offload"]), ("recompute", b["recompute"])) if on) or "-"
    return (f"| {model} | {gpus} | {net:g} | {layout} | tp_g{b['tp_g']} x dp_g{b['dp_g']} | {knobs} | {s['step']:.1f} | "
            f"{s['gen']:.1f} / {s['sync'] + s['sync_check']:.2f} / {s['log_probs']:.1f} / {s['update']:.1f} | "
            f"{b['peak_bytes'] / 2**30:.0f} | {len(out['ranked'])} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--net-gbps", type=float, nargs="+", default=[400.0, 100.0])
    p.add_argument("--gpus", type=int, nargs="+", default=list(GPU_COUNTS))
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "plan_at_scale.md"))
    args = p.parse_args(argv)
    lines = []
    for model in MODELS:
        for net in args.net_gbps:
            for gpus in args.gpus:
                lines.append(row(model, gpus, net, search(model, gpus, net)))
                print(lines[-1], flush=True)
    with open(args.out, "w") as f:
        f.write(HEADER + "\n".join(lines) + "\n" + FOOTER)
    return 0


HEADER = """# The plan at scale: Qwen2.5-72B and Qwen3-30B-A3B on 64 to 512 GPUs

Predictions of `hybridrl plan --search` (written by `benchmarks/plan_at_scale.py`; not measured: no run here used more
than 4 GPUs). Each row is the layout the search ranks first for one GRPO job, with its predicted step time by phase.

**The job:** 512 prompts x 16 samples a step, prompts up to 1,024 tokens, responses up to 4,096, KL loss against the
reference, packed micro-batches of 16k tokens, mini-batches of 128 prompts (4 optimizer steps a step), rollout memory
share 0.5. **The GPUs:** H200 (139.8 GiB), 8 a node on NVLink (248 GB/s all-gather bus bandwidth, measured on 2 GPUs).
**Between nodes** (an assumption, `--net-gbps`): 400 Gb/s a GPU (one 400G NIC per GPU, an InfiniBand NDR node) and,
for a slower fabric, 100 Gb/s a GPU; collectives over it at 80% of the line rate.
**The model's inputs:** the shapes from the published config.json files (`benchmarks/plan_models/`); the step-time
constants fitted by `benchmarks/plan_calibration.py` on the 23 measured rows of
`benchmarks/results/plan_calibration.json` (1-4 H200s, 0.5B-14B dense models; every row within 0.184 of its measured
step, 0.292 at worst with a row's lease held out of the fit: `benchmarks/results/plan_accuracy.md`); responses taken
at their full length (a real run's EOS makes generation and training shorter).
**Decode** (a replica's step): a fixed 1.85 ms, 17 us a sequence, the slower of the weights' read from HBM and the
GEMMs' 2 N FLOPs a sequence at the GPU's peak (an assumption: left free, the fit put decode's MFU above 1, so the
measured rows do not set it; at the peak a step is compute-bound above ~206 sequences a replica, the H200's peak
FLOPs over its HBM bandwidth, whatever the model), the KV cache's read, 2 all-reduces a layer for tp_g > 1, and 0.82 ms a layer more every step where
a replica decodes more than 512 sequences (vLLM's largest captured CUDA graph; fitted on a 1,024-sequence run and an
eager one).
**The sync** (the weights into the engine, and their check) counts what each GPU receives from other GPUs for its
engine shard: the other pipeline stages' layers (over the network where the pipeline spans nodes) and its tp peers'
pieces, at 0.52 of the link (the cross-GPU copy as measured on 4 x H200), plus the check at 7 ms per GB (measured
before the cheaper checksums of 5f711d7).

What the numbers cannot know: MoE kernels (grouped GEMM efficiency, all-to-all overlap) were never measured here, so the
30B-A3B rows use the dense MFU at its width; vLLM's expert parallelism is not modeled (its rollout is tp_g x dp_g);
efficiency losses of very large dp (the driver's dispatch of 8k samples) are outside the model, and the wait for
the slowest worker around generation is the 1-4-GPU runs' 0.39 s per doubling of the GPUs (fitted) carried on to
64-512 GPUs (2.3-3.5 s of a step).

| model | GPUs | Gb/s a GPU | training layout | rollout | knobs | step s | gen / sync + check / log-probs / update | peak GiB | layouts that fit |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
"""
FOOTER = """
Reading the table: generation is 4k decode steps of a replica, and at these lengths a step reads a KV cache of up to
5k tokens a sequence (30B-A3B, 128 sequences a replica at 64 GPUs: 32 GB a step, 6.7 ms) and, above ~206 sequences,
is compute-bound; it shrinks with dp_g through the sequences a replica holds, which is why the search picks the
smallest tp_g that fits the weights; training shrinks with the GPUs until the gradients' reduce-scatter over the network and the
pipeline's bubble take over. With the slower network the search moves to layouts that keep more of the gradient
traffic inside a node (larger tp or pp, smaller dp). With pp spanning nodes, the sync's weights from the other
stages cross the network too: at 100 Gb/s a GPU the sync and its check take 6.6-11 s of a step.

Qwen3-30B-A3B never gets ep > 1 here: the model counts an MoE layer's compute at the dense MFU of its active
weights, so expert parallelism only adds its all-to-all, and the experts' memory fits without it. Real MoE training
gains from ep through larger grouped GEMMs, which were not measured here; until a measured MoE row is in the
calibration data, take the ep choice from the MoE presets (configs/parallel/qwen3_30b_a3b_*.yaml), not from this table.
"""

if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
