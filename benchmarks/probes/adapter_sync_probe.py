"""Where does the adapter-only sync's per-tensor time go? (issue 40: on an H200 the 7B shape's LoRA rank 32 on all
linear layers, 392 adapter tensors, 161 MB, took timing_s/adapter_stream 28-30 ms and its checks ~4 ms a step, where
154 MiB at memory bandwidth is well under 1 ms: the time is per-tensor work on the CPU side.)

The real sync path end to end on one process: a Megatron LoRA actor (megatron-core, a one-rank gloo/nccl world, tp 1,
random weights, no checkpoint read) with `--layers` layers and LoRA `--rank` on all seven linear modules, its
export_adapter_weights -> hybridrl.hybrid.adapter_sync.stream_adapters -> check_adapters into a receiver:
  vllm    VLLMLoraEngine's own adapter code (load_adapter / write_places, finish_adapter_sync, adapter_as_held,
          adapter_checksums, _prove) over vLLM-shaped slot buffers (lora_a_stacked [1, 1, max_rank, in] /
          lora_b_stacked [1, 1, out, max_rank] per packed member, as vLLM 0.26 allocates them) and a stand-in for
          vllm.LLM whose first-version loader does what vLLM's does (cast, B *= scaling, set_lora into slot 0): vLLM
          is not needed, so this runs on CPU and on a GPU host without the bundle;
  torch   TorchRolloutEngine with adapters (tiny shape only: it builds the HF model too).
Shapes: `tiny` (hidden 64, the CPU default: the per-tensor overhead alone) or `7b` (Qwen2-7B-like: hidden 3584,
ffn 18944, 28 heads, 4 kv heads; GPU: the actor is the whole 7B in bf16, ~15 GB).

Per step (one sync of a new version after the first, which went through the loader and proved the slots), medians
of --steps timed steps after 2 warm-ups, each part ended by a device synchronize:
  export       iterating actor.export_adapter_weights alone
  stream       stream_adapters (export + sender checksums + load_adapter + finish_adapter_sync)
  check        check_adapters (engine slot sums vs the sender's)
  sync         stream + check: what lora_bench's lora_sync_seconds_vs_full counts for the adapters
and per tensor: aten ops dispatched in a stream + check (a TorchDispatchMode count, views included) and Python
function calls (cProfile) of one step. --profile prints cProfile's top functions by own time.

    PYTHONPATH=$PWD python benchmarks/probes/adapter_sync_probe.py                     # CPU, tiny, vllm
    PYTHONPATH=$PWD python benchmarks/probes/adapter_sync_probe.py --device cuda --shape 7b --out $OUT/probe.json

  floor        the same device work on one flat tensor of the adapters' size (one copy, each side's stacked copy
               and sums): the sync with no per-tensor work

Answer (CPU, 2 cores shared with other jobs, one torch thread, tiny shape, 28 layers, rank 32: 392 tensors, 3.3 MiB
fp32; ms a step, medians of 5 steps, the range over 7 runs alternated with the code before; the CPU's numbers carry
megatron's CPU shim, a TorchFunctionMode on every torch call and attribute, and float64 sums that are slow on a CPU):
                     before (1735856)            after (issue 40's per-tensor cut)
  export             13-22 (median 13.7)          1.4-2.5 (median 1.6)
  stream             27-45 (median 28.7)          13-21 (median 15.5)
  check              8-14 (median 8.7)            7-12 (median 8.3)
  sync               35-57 (median 39)            19-31 (median 23)
  floor              5-7 (runs 6-7 only)          8-11 (noise: the same work)
  Python calls/tensor 204, views/tensor 4.0       33, 0.03
Inside (each part synchronized, medians): export 14.5 -> 1.5, record 11 -> 7, load 3.3 -> 3.0, engine sums
8 -> 6, the stream's own loop 1.8 -> 0.9, compare 0.8 -> 0.3. What is left on the CPU is mostly its floor (the sums'
arithmetic) and the shim. GPU: not run yet (row probe_adapter_sync in benchmarks/runs.py).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any, Callable

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHAPES = {  # hidden, ffn, heads, kv heads, vocab
    "tiny": (64, 112, 4, 2, 1001),
    "7b": (3584, 18944, 28, 4, 152064),
}


def sync_device(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------ the actor
def write_config(folder: str, shape: str, layers: int) -> str:
    from transformers import Qwen2Config

    hidden, ffn, heads, kv, vocab = SHAPES[shape]
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg.save_pretrained(folder)
    return folder


def build_actor(path: str, rank: int, alpha: float, dtype: str) -> Any:
    from hybridrl.adapters.megatron import parallel
    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.config.layout import BatchPlan
    from hybridrl.config.schema.actor import ActorConfig, ModelConfig
    from hybridrl.config.schema.common import MegatronConfig, OptimConfig

    parallel.ensure_process_group(timeout_s=300)
    layout = parallel.layout_for(1, dtype=dtype)
    parallel.init_megatron(layout, seed=7)
    model = ModelConfig(path=path, lora_rank=rank, lora_alpha=alpha, target_modules="all-linear")
    actor = ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1, optim=OptimConfig(lr=1e-4),
                        megatron=MegatronConfig(use_distributed_optimizer=True, seed=7), load_weight=False)
    plan = BatchPlan(samples_per_step=2, mini_batch_samples=2, mini_batches_per_epoch=1, ppo_epochs=1,
                     mini_batch_per_dp=2, micro_batch_per_gpu=1, grad_accum=2, use_dynamic_bsz=False,
                     max_token_len_per_gpu=64, forward_micro_batch_per_gpu=1, forward_max_token_len_per_gpu=64)
    return MegatronActor(model, actor, layout, plan)


def perturb(actor: Any, seed: int) -> None:
    """A new version of the adapters, as an optimizer step makes one (in place: the parameters stay where they are)."""
    from hybridrl.adapters.megatron.lora import adapter_params

    params = adapter_params(actor.engine.chunks)
    g = torch.Generator(device=params[0].device).manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype) * 0.01)


# ------------------------------------------------------------------------------------------ receivers
class _Layer:
    """vLLM 0.26's LoRA layer buffers for one slot: lora_a_stacked[i] [1, 1, max_rank, in_local],
    lora_b_stacked[i] [1, 1, out_local, max_rank] per packed member i."""

    def __init__(self, max_rank: int, fan_in: int, outs: list[int], dtype: torch.dtype, device: str) -> None:
        self.lora_a_stacked = tuple(torch.zeros(1, 1, max_rank, fan_in, dtype=dtype, device=device) for _ in outs)
        self.lora_b_stacked = tuple(torch.zeros(1, 1, o, max_rank, dtype=dtype, device=device) for o in outs)


def vllm_receiver(shape: str, layers: int, rank: int, alpha: float, device: str, dtype: torch.dtype) -> Any:
    """VLLMLoraEngine (its real adapter methods) over vLLM-shaped slots; `register` stands in for vLLM's loader."""
    from hybridrl.rollout import vllm_lora
    from hybridrl.rollout.lora import RolloutLora, peft_name

    hidden, ffn, heads, kv, _ = SHAPES[shape]
    d = hidden // heads
    max_rank = next(r for r in vllm_lora.VLLM_LORA_RANKS if r >= rank)
    modules, packed = {}, {}
    for i in range(layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        modules[f"{attn}.qkv_proj"] = _Layer(max_rank, hidden, [heads * d, kv * d, kv * d], dtype, device)
        modules[f"{attn}.o_proj"] = _Layer(max_rank, heads * d, [hidden], dtype, device)
        modules[f"{mlp}.gate_up_proj"] = _Layer(max_rank, hidden, [ffn, ffn], dtype, device)
        modules[f"{mlp}.down_proj"] = _Layer(max_rank, ffn, [hidden], dtype, device)
        packed[f"{attn}.qkv_proj"] = [f"{attn}.{m}" for m in ("q_proj", "k_proj", "v_proj")]
        packed[f"{mlp}.gate_up_proj"] = [f"{mlp}.gate_proj", f"{mlp}.up_proj"]
    manager = SimpleNamespace(modules=modules, packed_modules=packed, lora_index_to_id=[None],
                              lora_config=SimpleNamespace(lora_dtype=dtype))

    def register(mgr, tensors, lora, lora_id):  # vLLM's from_lora_tensors + set_lora, for the first version
        mgr.lora_index_to_id[0] = lora_id
        for path, layer in mgr.modules.items():
            for j, m in enumerate(mgr.packed_modules.get(path, [path])):
                a = tensors[peft_name(m, "A")].to(dtype)
                b = tensors[peft_name(m, "B")].to(dtype) * lora.scaling
                layer.lora_a_stacked[j][0, 0, : a.shape[0], : a.shape[1]].copy_(a)
                layer.lora_b_stacked[j][0, 0, : b.shape[0], : b.shape[1]].copy_(b)

    vllm_lora.register = register  # this process only: no vLLM here
    engine = vllm_lora.VLLMLoraEngine.__new__(vllm_lora.VLLMLoraEngine)
    engine.llm = SimpleNamespace(apply_model=lambda fn: [fn(SimpleNamespace(lora_manager=manager))])
    engine.tp_size, engine.lora, engine.checksum_rtol = 1, RolloutLora(rank, alpha, ALL), 1e-6
    engine._names = vllm_lora.adapter_names(manager, ALL)
    engine._dtype, engine._shapes, engine._pending, engine._written = dtype, {}, {}, set()
    engine._places, engine._in_place, engine._version = None, False, None
    engine._tp_rank = lambda: 0
    return engine


def torch_receiver(path: str, rank: int, alpha: float, device: str, dtype: torch.dtype) -> Any:
    from transformers import AutoConfig

    from hybridrl.rollout.lora import RolloutLora
    from hybridrl.rollout.torch_engine import TorchRolloutEngine

    return TorchRolloutEngine(AutoConfig.from_pretrained(path), dtype=dtype, device=device,
                              lora=RolloutLora(rank, alpha, ALL))


# ------------------------------------------------------------------------------------------ counting
class _OpCount(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        key = str(func.overloadpacket)
        self.ops[key] = self.ops.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


VIEWS = {"aten.view", "aten.alias", "aten.as_strided", "aten.slice", "aten.select", "aten.narrow", "aten.reshape",
         "aten._reshape_alias", "aten.detach", "aten.t", "aten.transpose", "aten.unsqueeze", "aten.squeeze",
         "aten.expand", "aten.split", "aten.split_with_sizes", "aten.unbind", "aten.permute", "aten.unflatten"}


# ------------------------------------------------------------------------------------------ the parts
def inner_parts(actor: Any, engine: Any, bucket_bytes: int, version: list, fraction: float, steps: int,
                device: str) -> dict[str, float]:
    """Median ms a step of each part inside stream + check, each ended by a device synchronize (separate steps from
    the totals: the synchronizes cost their own time): export (the generator's own time), record (adapters_as_held
    + the sender's sums), load (load_adapter: the in-place write), finish, engine_sums (adapter_checksums),
    compare (the rest of check_adapters)."""
    from hybridrl.hybrid import adapter_sync, checks

    spent: dict[str, float] = {}

    def wrap(owner: Any, attr: str, part: str) -> None:
        fn = getattr(owner, attr)

        def timed_fn(*a, **k):
            sync_device(device)
            t0 = time.perf_counter()
            out = fn(*a, **k)
            if part == "export":
                out = list(out)
            sync_device(device)
            spent[part] = spent.get(part, 0.0) + time.perf_counter() - t0
            return iter(out) if part == "export" else out
        setattr(owner, attr, timed_fn)
        undo.append((owner, attr, fn))

    undo: list = []
    wrap(actor, "export_adapter_weights", "export")
    wrap(adapter_sync, "_record", "record")
    wrap(engine, "load_adapter", "load")
    wrap(engine, "finish_adapter_sync", "finish")
    wrap(engine, "adapter_checksums", "engine_sums")
    seen: dict[str, list[float]] = {}
    try:
        for i in range(steps + 2):
            perturb(actor, 2000 + i)
            version[0] += 1
            sent = checks.SentChecksums(version[0], fraction)
            spent.clear()
            sync_device(device)
            t0 = time.perf_counter()
            adapter_sync.stream_adapters(actor, engine, bucket_bytes, version[0], sent)
            sync_device(device)
            t1 = time.perf_counter()
            adapter_sync.check_adapters(engine, sent)
            sync_device(device)
            t2 = time.perf_counter()
            spent["stream_other"] = (t1 - t0) - sum(spent.get(k, 0.0) for k in ("export", "record", "load", "finish"))
            spent["compare"] = (t2 - t1) - spent.get("engine_sums", 0.0)
            if i >= 2:
                for k, v in spent.items():
                    seen.setdefault(k, []).append(v)
    finally:
        for owner, attr, fn in reversed(undo):
            if owner is actor or owner is engine:
                delattr(owner, attr)
            else:
                setattr(owner, attr, fn)
    return {k: 1e3 * statistics.median(v) for k, v in seen.items()}


def device_floor(numel: int, dtype: torch.dtype, device: str, steps: int) -> float:
    """Median ms of the sync's device work with no per-tensor work at all: the adapters as one flat tensor copied
    into one destination, and each side's sums as checksum.checksums takes them (a stacked copy, the row sums of it
    and of its magnitudes)."""
    from hybridrl.utils.checksum import _row_sums

    src = torch.randn(numel, device=device).to(dtype)
    dst = torch.empty_like(src)

    def work() -> None:
        dst.copy_(src)
        for side in (src, dst):
            rows = side.clone().view(1, -1)
            _row_sums(rows)
            _row_sums(rows.abs())
        sync_device(device)

    times = []
    for i in range(steps + 2):
        sync_device(device)
        t0 = time.perf_counter()
        work()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


# ------------------------------------------------------------------------------------------ the run
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--shape", default="tiny", choices=tuple(SHAPES))
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--alpha", type=float, default=32.0, help="lora_alpha (the 7B row's 32: scaling 1)")
    p.add_argument("--engine", default="vllm", choices=("vllm", "torch"))
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                   help="the actor's dtype on a GPU (megatron builds fp32 on CPU); the receiver holds the adapters' dtype, "
                        "as the 7B row's vLLM does (bf16 both sides: adapter_as_held casts nothing)")
    p.add_argument("--bucket-mb", type=int, default=512, help="the sync's bucket_bytes in MiB (trainer default 512)")
    p.add_argument("--fraction", type=float, default=1.0, help="sync_check.sample_fraction")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--profile", action="store_true", help="print cProfile's top functions of one step")
    p.add_argument("--out", default=None, help="write the result as JSON here too")
    args = p.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        torch.set_num_threads(1)  # 2 shared cores: two OpenMP threads spin against each other (x500 a small sum)
    if args.engine == "torch" and args.shape != "tiny":
        p.error("--engine torch builds the HF model too: tiny shape only")

    from hybridrl.hybrid.adapter_sync import check_adapters, stream_adapters
    from hybridrl.hybrid.checks import SentChecksums

    folder = write_config(tempfile.mkdtemp(prefix="adapter_probe_"), args.shape, args.layers)
    start = time.perf_counter()
    actor = build_actor(folder, args.rank, args.alpha, args.dtype)
    built = time.perf_counter() - start
    from hybridrl.adapters.megatron.lora import adapter_params

    some = adapter_params(actor.engine.chunks)[0]
    device, dtype = str(some.device), some.dtype
    if args.engine == "vllm":
        engine = vllm_receiver(args.shape, args.layers, args.rank, args.alpha, device, dtype)
    else:
        engine = torch_receiver(folder, args.rank, args.alpha, device, dtype)
    bucket_bytes = args.bucket_mb << 20
    version = [0]

    def step() -> tuple[dict, SentChecksums]:
        version[0] += 1
        perturb(actor, version[0])
        sync_device(device)
        sent = SentChecksums(version[0], args.fraction)
        return stream_adapters(actor, engine, bucket_bytes, version[0], sent), sent

    def export_only() -> None:
        for bucket in actor.export_adapter_weights(bucket_bytes):
            del bucket

    first, sent = step()  # the loader's version; the slots are proven after it
    if args.engine == "vllm" and not engine._in_place:
        raise SystemExit("the stand-in's slots did not prove: the in-place path would not run")
    check_adapters(engine, sent)
    tensors = int(first["reshard/adapter_tensors"])

    def timed(fn: Callable[[], Any]) -> float:
        sync_device(device)
        t0 = time.perf_counter()
        fn()
        sync_device(device)
        return time.perf_counter() - t0

    parts: dict[str, list[float]] = {"export": [], "stream": [], "check": [], "sync": []}
    for i in range(args.steps + 2):
        perturb(actor, 1000 + i)
        export_s = timed(export_only)
        version[0] += 1
        sent = SentChecksums(version[0], args.fraction)
        stream_s = timed(lambda s=sent: stream_adapters(actor, engine, bucket_bytes, version[0], s))
        check_s = timed(lambda s=sent: check_adapters(engine, s))
        if i >= 2:
            for k, v in (("export", export_s), ("stream", stream_s), ("check", check_s), ("sync", stream_s + check_s)):
                parts[k].append(v)
    ms = {k: 1e3 * statistics.median(v) for k, v in parts.items()}
    inner = inner_parts(actor, engine, bucket_bytes, version, args.fraction, args.steps, device)
    floor = device_floor(int(first["reshard/adapter_bytes"]) // dtype.itemsize, dtype, device, args.steps)

    # one more step, counted: aten ops and Python calls
    version[0] += 1
    sent = SentChecksums(version[0], args.fraction)
    with _OpCount() as count:
        stream_adapters(actor, engine, bucket_bytes, version[0], sent)
        check_adapters(engine, sent)
    views = sum(n for k, n in count.ops.items() if k in VIEWS)
    compute = sum(count.ops.values()) - views
    version[0] += 1
    sent = SentChecksums(version[0], args.fraction)
    prof = cProfile.Profile()
    prof.enable()
    stream_adapters(actor, engine, bucket_bytes, version[0], sent)
    check_adapters(engine, sent)
    sync_device(device)
    prof.disable()
    stats = pstats.Stats(prof)
    calls = sum(v[1] for v in stats.stats.values())  # primitive + recursive calls of every function

    result = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
              "shape": args.shape, "layers": args.layers, "rank": args.rank, "engine": args.engine,
              "dtype": str(dtype).replace("torch.", ""), "tensors": tensors, "adapter_bytes": first["reshard/adapter_bytes"],
              "buckets": first["reshard/adapter_buckets"], "actor_build_s": round(built, 1),
              "ms": {k: round(v, 3) for k, v in ms.items()},
              "us_per_tensor": {k: round(1e3 * v / tensors, 2) for k, v in ms.items()},
              "inner_ms": {k: round(v, 3) for k, v in inner.items()}, "floor_ms": round(floor, 3),
              "aten_ops_per_tensor": {"compute": round(compute / tensors, 2), "views": round(views / tensors, 2)},
              "aten_ops": dict(sorted(count.ops.items(), key=lambda kv: -kv[1])[:12]),
              "python_calls_per_tensor": round(calls / tensors, 1),
              "torch_threads": torch.get_num_threads()}
    print(f"{'part':<8}{'ms/step':>10}{'us/tensor':>11}   ({tensors} tensors, {first['reshard/adapter_bytes'] / 2**20:.1f} "
          f"MiB {result['dtype']}, {args.shape}, {args.engine}, {result['device']}, median of {args.steps})")
    for k in parts:
        print(f"{k:<8}{ms[k]:>10.2f}{1e3 * ms[k] / tensors:>11.1f}")
    print(f"{'floor':<8}{floor:>10.2f}{1e3 * floor / tensors:>11.1f}   (the same device work on one flat tensor: "
          f"no per-tensor work)")
    print("inside, each part synchronized: " + ", ".join(f"{k} {v:.2f}" for k, v in inner.items()) + " ms")
    print(f"per tensor (stream + check): {compute / tensors:.2f} compute aten ops, {views / tensors:.2f} views, "
          f"{calls / tensors:.1f} Python calls")
    if args.profile:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
