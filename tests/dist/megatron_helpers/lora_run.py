"""One torchrun launch of the LoRA checks in one layout (tp = world size / pp), or in several one after the other
(their argument lists separated by --next; megatron's groups rebuilt for each, as run_layout.py does); writes
rank<N>.json in each layout's --out.

    python -m torch.distributed.run --nproc_per_node=N --standalone lora_run.py --models DIR --out DIR [--pp P --vpp V]
        [--save-ckpt DIR] [--export DIR] [--resume-ckpt DIR] [--next --models DIR --out DIR2 ...]

With the PEFT adapter the test saved (models/adapter, random non-zero A and B) loaded through lora_adapter_path:
log-probs vs peft's (lora_refs.pt), the reference (adapters off) vs the base model's, the adapters' gradients of
L = sum w * log-prob vs peft's autograd (each rank's shard cut from the full gradient by the one mapping), no
gradient on any base parameter, the optimizer's parameters = the adapters; then one PPO update (metrics, log-probs
after it, the base bitwise unchanged), a checkpoint, a PEFT export and a second update; with --resume-ckpt a fresh
actor loads that checkpoint (saved in another layout) and gives its log-probs and its second update.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import tiny  # noqa: E402
from run_layout import actor_cfgs, batch_plan, ppo_data, write_results  # noqa: E402

from hybridrl.adapters.megatron import parallel  # noqa: E402
from hybridrl.config.schema.actor import ModelConfig, RefConfig  # noqa: E402
from hybridrl.protocol import DataProto  # noqa: E402

RANK, ALPHA = 4, 8.0


def lora_model(args, adapter: bool, recompute: bool = False) -> ModelConfig:
    return ModelConfig(path=os.path.join(args.models, "qwen2"), lora_rank=RANK, lora_alpha=ALPHA,
                       target_modules="all-linear", enable_gradient_checkpointing=recompute,
                       lora_adapter_path=os.path.join(args.models, "adapter") if adapter else None)


def build(args, layout, adapter: bool, recompute: bool = False):
    from hybridrl.adapters.megatron.actor import MegatronActor

    cfg = dataclasses.replace(actor_cfgs(args, 2, False, True), entropy_coeff=0.0)
    return MegatronActor(lora_model(args, adapter, recompute), cfg, layout, batch_plan(layout, 2, False))


def log_probs(actor, refs) -> torch.Tensor:
    data = DataProto.from_dict(refs["batch"], meta_info={"temperature": refs["temperature"]})
    return actor.compute_log_prob(data).batch["log_probs"]


def check_grads(actor, refs, layout) -> dict:
    """Adapter gradients vs peft's (max |diff| / max |want| over all adapters); base parameters with a gradient."""
    from megatron.core import parallel_state as ps

    from hybridrl.adapters.megatron.forward import response_log_probs
    from hybridrl.adapters.megatron.lora import adapter_params
    from hybridrl.adapters.megatron.mapping import hf_to_shard

    batch, weights = refs["batch"], refs["weights"]
    mbs = actor._micro_batches(DataProto.from_dict(batch), [], 2, None)  # 4: the interleaved schedule hangs at 2

    def loss_fn(logits, mb):
        logp = response_log_probs(logits, mb, tiny.VOCAB, refs["temperature"], with_entropy=False).log_probs
        return (logp * weights[mb.rows]).sum(), {}

    engine = actor.engine
    for c in engine.chunks:
        c.zero_grad_buffer()
    engine.run(mbs, loss_fn, forward_only=False)
    chunks = [dict(engine.module(i).named_parameters()) for i in range(len(engine.chunks))]
    params = {(i, n): p for i, c in enumerate(chunks) for n, p in c.items()}
    grads = refs["grads"]

    def read(name, rows=None, cols=None):
        t = grads[name]
        t = t[rows] if rows is not None else t
        return t[:, cols] if cols is not None else t

    worst, scale = 0.0, max(float(g.abs().max()) for g in grads.values())
    tp_rank = ps.get_tensor_model_parallel_rank()
    for entry in actor._lora_entries:
        want = hf_to_shard(entry, read, actor.arch, tp_rank, layout.tp)
        worst = max(worst, float((params[entry.vp_stage, entry.mcore].main_grad - want).abs().max()) / scale)
    adapters = {id(p) for p in adapter_params(engine.chunks)}
    base_with_grad = [n for (_, n), p in params.items() if id(p) not in adapters
                      and (p.requires_grad or p.grad is not None or getattr(p, "main_grad", None) is not None)]
    optimizer_numel = sum(p.numel() for p in engine.optimizer.get_parameters())
    return {"grad_rel_diff": worst, "base_with_grad": base_with_grad, "optimizer_numel": optimizer_numel,
            "adapter_numel": sum(p.numel() for p in adapter_params(engine.chunks)),
            "adapter_entries": len(actor._lora_entries)}


def base_checksum(actor) -> float:
    from hybridrl.adapters.megatron.lora import adapter_params

    adapters = {id(p) for p in adapter_params(actor.engine.chunks)}
    return sum(float(p.double().abs().sum()) for c in actor.engine.chunks for p in c.parameters()
               if id(p) not in adapters)


def run(args, layout) -> dict:
    refs = torch.load(os.path.join(args.models, "lora_refs.pt"))
    mask = refs["batch"]["response_mask"].bool()
    out: dict = {}
    fresh = build(args, layout, adapter=False)  # PEFT's init: B = 0, so the model starts as the base
    out["fresh_vs_base"] = float((log_probs(fresh, refs) - refs["base_log_probs"])[mask].abs().max())
    actor = build(args, layout, adapter=True)
    out["peft_diff"] = float((log_probs(actor, refs) - refs["peft_log_probs"])[mask].abs().max())
    actor.remove_padding = True  # use_remove_padding: the adapters see packed THD micro-batches
    out["packed_peft_diff"] = float((log_probs(actor, refs) - refs["peft_log_probs"])[mask].abs().max())
    actor.remove_padding = False
    ref_cfg = RefConfig(log_prob_micro_batch_size_per_gpu=3, log_prob_use_dynamic_bsz=False)
    off = actor.adapters_off(ref_cfg).compute_log_prob(DataProto.from_dict(
        refs["batch"], meta_info={"temperature": refs["temperature"]})).batch["log_probs"]
    out["adapters_off_vs_base"] = float((off - refs["base_log_probs"])[mask].abs().max())
    out.update(check_grads(actor, refs, layout))
    # full activation recompute: the frozen embedding's output needs no grad, yet the adapters inside the
    # recomputed layers must get theirs
    recomputed = check_grads(build(args, layout, adapter=True, recompute=True), refs, layout)
    out["recompute_grad_rel_diff"] = recomputed["grad_rel_diff"]
    list(actor.export_adapter_weights(1 << 16))  # the adapter export's plan is cut here, before the update moves them
    before = base_checksum(actor)
    out["update"] = actor.update_policy(ppo_data(layout))
    out["base_unchanged"] = base_checksum(actor) == before
    out["log_probs_after"] = log_probs(actor, refs).tolist()
    if args.save_ckpt:
        actor.save_checkpoint(args.save_ckpt)
    if args.export:
        from hybridrl.adapters.megatron.lora_io import write_peft_adapter

        write_peft_adapter(actor.engine.chunks, actor.arch, layout, actor.lora, args.export, actor.hf_path)
    # the adapter-only export every rank receives (tp/pp gathered): the test compares it with tp1's PEFT file
    adapter = {n: t.detach().float().cpu() for b in actor.export_adapter_weights(1 << 16) for n, t in b}
    os.makedirs(args.out, exist_ok=True)
    torch.save(adapter, os.path.join(args.out, f"adapter_rank{dist.get_rank()}.pt"))
    out["update2"] = actor.update_policy(ppo_data(layout))
    if args.resume_ckpt:
        resumed = build(args, layout, adapter=False)
        resumed.load_checkpoint(args.resume_ckpt)
        out["resumed_log_probs"] = log_probs(resumed, refs).tolist()
        out["resumed_update2"] = resumed.update_policy(ppo_data(layout))  # the optimizer state came along
    out.update(check_adapter_export(actor, layout))  # last: it gives one adapter new storage
    return out


def check_adapter_export(actor, layout) -> dict:
    """actor.export_adapter_weights (lora_io.AdapterExport: at tp 1, pp 1 views planned once, before the updates)
    against the unplanned export_adapter, bitwise: after two updates moved the adapters in place, and after one
    adapter parameter got new storage, where a view planned before would send the old values (which the sync's
    checksums, taken from what is sent, could not tell)."""
    from hybridrl.adapters.megatron.lora import adapter_params
    from hybridrl.adapters.megatron.lora_io import export_adapter

    def exported(buckets) -> dict:
        return {n: t.detach().clone() for b in buckets for n, t in b}

    def same() -> bool:
        planned = exported(actor.export_adapter_weights(1 << 16))
        plain = exported(export_adapter(actor.engine.chunks, actor.arch, layout, actor.lora, 1 << 16))
        return sorted(planned) == sorted(plain) and all(torch.equal(planned[n], plain[n]) for n in plain)

    out = {"export_planned_after_updates": same()}
    p = adapter_params(actor.engine.chunks)[0]
    old = p.data
    with torch.no_grad():
        p.data = old.clone() + 1.0
    out["export_planned_after_new_storage"] = same()
    out["new_storage_differs"] = not torch.equal(old, p.data)
    return out


def main() -> None:
    layouts: list[list[str]] = [[]]
    for a in sys.argv[1:]:
        if a == "--next":
            layouts.append([])
        else:
            layouts[-1].append(a)
    parallel.ensure_process_group(timeout_s=300)
    for argv in layouts:
        run_layout(argv)
    dist.destroy_process_group()


def run_layout(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--save-ckpt", default=None)
    p.add_argument("--export", default=None)
    p.add_argument("--resume-ckpt", default=None)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--vpp", type=int, default=None)
    args = p.parse_args(argv)
    world = dist.get_world_size()
    args.tp, args.sp, args.ep = world // args.pp, False, 1
    layout = parallel.layout_for(world, tp=args.tp, pp=args.pp, vpp=args.vpp)
    parallel.init_megatron(layout, seed=7)
    write_results(args.out, {"rank": dist.get_rank(), **run(args, layout)})
    parallel.destroy_megatron()
    gc.collect()


if __name__ == "__main__":
    main()
