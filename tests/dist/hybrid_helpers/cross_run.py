"""Driver run by every torchrun rank (gloo): the cross-GPU direct copy (hybridrl.hybrid.remote) from a
MegatronActor (tp, pp, dp) into the torch rollout engine, whose every rank holds the full model, so every
layout here needs pieces that other ranks hold.

    python -m torch.distributed.run --nproc_per_node=4 --standalone cross_run.py OUT_DIR HF_DIR

For each layout in LAYOUTS: build the actor, a WeightSync per rollout tp_g (view to view or staged); the first sync of each goes the
bucketed way and proves the copies; one PPO update; then each WeightSync syncs again (local + cross-GPU copies,
no export) and the rank records: the engine's weights against the actor's bucketed export of the trained weights
(full HF tensors, collective: an independent path through the tp all-gathers and pp broadcasts), the rollout
log-probs against the actor's, the metrics. Then a remote piece is corrupted on one rank after it landed: that
rank's sync check must name it. Last, direct_weight_copy=false must stream everything. Writes OUT_DIR/rank<R>.json.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from reshard_run import SAMPLING, actor_log_probs, build_actor, gather_replicas, make_prompts, ppo_update
from transformers import AutoConfig

from hybridrl.hybrid import ReshardPlan, SyncOptions, WeightSync, WeightSyncError, generate_sequences, logprob_gap
from hybridrl.rollout.torch_engine import TorchRolloutEngine

# (tp, pp, ((rollout tp_g, zero copy), ...)): tp2 x dp2 -> tp_g1 x dp_g4 view to view and staged; pp2 x dp2 -> tp_g2
# view to view, tp_g1 staged; tp2 x pp2 -> tp_g2 view to view
LAYOUTS = ((2, 1, ((1, True), (1, False))), (1, 2, ((2, True), (1, False))), (2, 2, ((2, True),)))
BUCKET_BYTES = 48 * 1024  # small: several rounds of staging for a tiny model
CORRUPT_RANK = 1


def sync_once(sync: WeightSync, plan: ReshardPlan, actor, vocab: int, step: int):
    replica = plan.placement(dist.get_rank()).replica
    prompts = make_prompts(vocab)
    chunk = prompts[plan.prompt_slice(len(prompts), replica)]
    start = time.perf_counter()
    out, metrics = generate_sequences(sync, chunk, SAMPLING.with_(seed=1000 * step + replica), step=step)
    seconds = time.perf_counter() - start
    full, _ = gather_replicas(out, plan)
    part, logp = actor_log_probs(actor, full)
    gap = logprob_gap(part.batch["rollout_log_probs"], logp, part.batch["response_mask"])
    return part, logp, metrics, gap, seconds


def exported(actor) -> dict[str, torch.Tensor]:
    return {n: t.clone() for bucket in actor.export_weights(1 << 30) for n, t in bucket}


def run_layout(hf_dir, hf_cfg, engine, tp, pp, tp_gs, step) -> list[dict]:
    from hybridrl.adapters.megatron.parallel import destroy_megatron, layout_for

    world = dist.get_world_size()
    layout = layout_for(world, tp=tp, pp=pp)
    actor = build_actor(hf_dir, layout)
    syncs = {(tp_g, zc): (WeightSync(actor, engine, SyncOptions(bucket_bytes=BUCKET_BYTES, zero_copy=zc)),
                          ReshardPlan(world, layout.tp, layout.pp, layout.dp, tp_g)) for tp_g, zc in tp_gs}
    first = {}
    for key, (sync, plan) in syncs.items():
        first[key] = sync_once(sync, plan, actor, hf_cfg.vocab_size, step)
        step += 1
    part, logp = first[tp_gs[0]][:2]
    update = ppo_update(actor, part, logp, step)
    results = []
    for (tp_g, zc), (sync, plan) in syncs.items():
        _, _, metrics, gap, seconds = sync_once(sync, plan, actor, hf_cfg.vocab_size, step)
        ref = exported(actor)
        weights = engine.named_weights()
        results.append({
            "tp": tp, "pp": pp, "dp": layout.dp, "tp_g": tp_g, "zero_copy": zc, "seconds": seconds,
            "update_applied": update.get("actor/update_applied"),
            "first_metrics": {k: v for k, v in first[(tp_g, zc)][2].items() if not k.startswith("timing")},
            "metrics": {k: v for k, v in metrics.items() if not k.startswith("timing")},
            "gap": gap, "first_gap": first[(tp_g, zc)][3],
            "mismatches": sorted(n for n, t in ref.items() if not torch.equal(weights[n], t)),
            "reference_tensors": len(ref),
            "remote_names": sorted(sync._remote.names) if sync._remote is not None else [],
        })
        step += 1
    sync, plan = syncs[tp_gs[0]]
    results[0]["corruption_caught"] = corrupt_and_sync(sync, plan, actor, hf_cfg.vocab_size, step)
    off = WeightSync(actor, engine, SyncOptions(bucket_bytes=BUCKET_BYTES, direct=False))
    metrics = [sync_once(off, plan, actor, hf_cfg.vocab_size, step + s)[2] for s in (1, 2)]
    results[0]["direct_off_metrics"] = {k: v for k, v in metrics[-1].items() if k.startswith("reshard/")}
    del actor, syncs, sync, off
    destroy_megatron()
    return results


def corrupt_and_sync(sync: WeightSync, plan: ReshardPlan, actor, vocab: int, step: int) -> str:
    """One rank adds 1 to the last piece it received (view to view or staged), after the copy: its check must name
    that piece."""
    remote = sync._remote
    if dist.get_rank() == CORRUPT_RANK and remote is not None:
        run = remote.run

        def run_then_corrupt(compare=False):
            failed = run(compare)
            remote._views[max(remote._views)].add_(1.0)
            return failed
        remote.run = run_then_corrupt
    try:
        sync.push(step)
        caught = ""
    except WeightSyncError as e:
        caught = str(e)
    finally:
        remote.run = type(remote).run.__get__(remote)
        sync.release()
    dist.barrier()
    return caught


def run(out_dir: str, hf_dir: str) -> None:
    """Every layout (the process group is up); this rank's reports in OUT_DIR/rank<RANK>.json."""
    hf_cfg = AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    engine = TorchRolloutEngine(hf_cfg, pad_token_id=0)
    results = []
    for i, (tp, pp, tp_gs) in enumerate(LAYOUTS):
        results += run_layout(hf_dir, hf_cfg, engine, tp, pp, tp_gs, step=100 * i)
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()


def main() -> None:
    from hybridrl.adapters.megatron.parallel import ensure_process_group

    torch.set_num_threads(1)
    ensure_process_group(timeout_s=120)
    run(sys.argv[1], sys.argv[2])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
