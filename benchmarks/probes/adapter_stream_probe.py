"""Where do the LoRA adapter sync's 71 ms go? (issue 40: lora_7b_lora on an H100, timing_s/adapter_stream 0.071 s for
161 MB of adapters in 392 tensors, one bucket)

The engine side's in-place write is already one _foreach_copy_ a bucket (vllm_lora.write_places). Around it, per
tensor: the sender's checksums (SentChecksums.record: tensor_checksum + tensor_abs_sum, about 7 kernels a tensor) and,
at the check, the engine's slot sums (a float64 copy and a sum a slot). This times each part on the 7B's adapter
shapes (Qwen2.5-7B, rank 32, all seven modules, 28 layers: A [32, in], B [out, 32] in bf16, slots as vLLM's
lora_a_stacked / lora_b_stacked views) with plain torch, no vLLM or Megatron:
  sender_per_tensor   SentChecksums.record, one tensor at a time (before; the torch engine's bitwise path still)
  sender_batched      SentChecksums.record_many (checksum.checksums: stacked by shape, a few kernels)
  write_places        the in-place write of the bucket into the slot views
  engine_per_slot     the engine's slot sums as before (stack of dst.double().sum()), read to the host
  engine_batched      checksum.checksums over the slot views, read to the host
  as_held_scaled      adapter_as_held with lora_alpha / r != 1: a multiply a B tensor (the 7B row has scaling 1)
Medians of 20 timed runs after 3 warm-ups, each ended by torch.cuda.synchronize().

    PYTHONPATH=$PWD python3 benchmarks/probes/adapter_stream_probe.py --out $OUT/adapter_stream_probe.json

Answer: see benchmarks/results (not run when written).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

H, F, Q, KV, LAYERS, R = 3584, 18944, 3584, 512, 28, 32
MODULES = {"q_proj": (H, Q), "k_proj": (H, KV), "v_proj": (H, KV), "o_proj": (Q, H), "gate_proj": (H, F),
           "up_proj": (H, F), "down_proj": (F, H)}  # (in, out)


def adapters(device: str) -> tuple[list[tuple[str, torch.Tensor]], list[torch.Tensor]]:
    """The 392 PEFT-named tensors and a slot view for each (a [1, 1, R, in] / [1, 1, out, R] buffer per tensor)."""
    g = torch.Generator(device=device).manual_seed(0)
    items, slots = [], []
    for layer in range(LAYERS):
        for module, (fan_in, fan_out) in MODULES.items():
            block = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            name = f"base_model.model.model.layers.{layer}.{block}.{module}"
            for which, shape in (("A", (R, fan_in)), ("B", (fan_out, R))):
                t = (torch.randn(shape, generator=g, device=device) * 0.02).to(torch.bfloat16)
                items.append((f"{name}.lora_{which}.weight", t))
                slots.append(torch.zeros(1, 1, *shape, dtype=torch.bfloat16, device=device)[0, 0])
    return items, slots


def timed(fn, runs: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    from hybridrl.hybrid.checks import SentChecksums
    from hybridrl.rollout.vllm_lora import _SlotPlace, write_places
    from hybridrl.utils.checksum import checksums

    items, slots = adapters("cuda")
    places = [_SlotPlace(dst, None, 0, t.shape[0], 1.0, t.numel(), 1) for dst, (_, t) in zip(slots, items)]
    pairs = [(place, t) for place, (_, t) in zip(places, items)]
    write_places(pairs)

    def sender_per_tensor():
        sent = SentChecksums(1, 1.0)
        for name, t in items:
            sent.record(name, t)
        sent.values()

    def sender_batched():
        sent = SentChecksums(1, 1.0)
        sent.record_many(items)
        sent.values()

    def engine_per_slot():
        torch.stack([dst.double().sum() for dst in slots]).cpu()

    def engine_batched():
        checksums(slots)[0].cpu()

    def as_held_scaled():
        [t * 1.5 if n.endswith("lora_B.weight") else t for n, t in items]

    old = torch.stack([dst.double().sum() for dst in slots])
    new = checksums(slots)[0]
    result = {
        "device": torch.cuda.get_device_name(), "tensors": len(items),
        "adapter_bytes": sum(t.numel() * t.element_size() for _, t in items),
        "seconds": {name: timed(fn) for name, fn in (
            ("sender_per_tensor", sender_per_tensor), ("sender_batched", sender_batched),
            ("write_places", lambda: write_places(pairs)), ("engine_per_slot", engine_per_slot),
            ("engine_batched", engine_batched), ("as_held_scaled", as_held_scaled))},
        "engine_sums_max_rel_diff": float(((old - new).abs() / old.abs().clamp_min(1e-30)).max()),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
