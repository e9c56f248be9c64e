"""GPU memory of torch's AdamW step beyond its state: foreach (torch's default on CUDA) vs fused vs the for-loop, with
fp32 grads and with bf16 grads copied to fp32 the way megatron's distributed optimizer does.

    python3 benchmarks/adam_mem.py 2e9 [--out benchmarks/results/adam_mem.json]

Bytes are per parameter; step 0 includes the lazy creation of the state (exp_avg + exp_avg_sq, 8 bytes).
"""
from __future__ import annotations

import argparse
import datetime
import json
import time

import torch

TENSORS = 300  # like megatron's per-parameter fp32 main shards


def measure(n: int, mode: str, grad_dtype: torch.dtype) -> list[dict]:
    torch.cuda.empty_cache()
    params = [torch.zeros(n // TENSORS, device="cuda", requires_grad=True) for _ in range(TENSORS)]
    model_grads = [torch.full((n // TENSORS,), 1e-3, device="cuda", dtype=grad_dtype) for _ in range(TENSORS)]
    flags = {"foreach": {"foreach": True}, "fused": {"fused": True}, "loop": {"foreach": False}}[mode]
    opt = torch.optim.AdamW(params, lr=1e-3, **flags)
    rows = []
    for step in range(2):
        before = torch.cuda.memory_allocated()
        for p, g in zip(params, model_grads):
            p.grad = g.float()  # megatron: main_param.grad = model_grad.float(), a copy only for bf16 grads
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        rows.append(dict(mode=mode, grads=str(grad_dtype).removeprefix("torch."), step=step,
                         grad_copy_bytes_per_param=(base - before) / n,
                         step_transient_bytes_per_param=(torch.cuda.max_memory_allocated() - base) / n,
                         state_added_bytes_per_param=(torch.cuda.memory_allocated() - base) / n, seconds=seconds))
        print(json.dumps(rows[-1]), flush=True)
        for p in params:
            p.grad = None
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("params", type=float, nargs="?", default=2e9)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    n = int(args.params)
    rows = [r for mode in ("foreach", "fused", "loop") for dtype in (torch.float32, torch.bfloat16)
            for r in measure(n, mode, dtype)]
    pick = {(r["mode"], r["grads"], r["step"]): r for r in rows}
    metrics = {
        "foreach_step_transient_bytes_per_param": pick["foreach", "float32", 1]["step_transient_bytes_per_param"],
        "fused_step_transient_bytes_per_param": pick["fused", "float32", 1]["step_transient_bytes_per_param"],
        "bf16_grad_fp32_copy_bytes_per_param": pick["fused", "bfloat16", 1]["grad_copy_bytes_per_param"],
        "fused_vs_foreach_step_seconds": pick["fused", "float32", 1]["seconds"] / pick["foreach", "float32", 1]["seconds"],
    }
    print(json.dumps(metrics))
    if args.out:
        result = {"command": f"python3 benchmarks/adam_mem.py {args.params:g}",
                  "device": f"{torch.cuda.get_device_name()} (torch {torch.__version__})",
                  "date": datetime.date.today().isoformat(), "metrics": metrics, "rows": rows}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
