"""One torchrun process: a megatron actor's optimizer state through the hybrid engine's round trip, four ways.

The actor trains with bf16 params as on a GPU (builder.model_dtype; the fp32 main params are then storages of their
own) on the CPU; the moves run on host storages standing in for the device (offload.State(device_type="cpu")) with
the HeldCopier (tests/fixtures/held_copier.py): a copy runs only when something waits for it, and until then its
destination reads NaN. After a first update (Adam's state exists), two more updates, each after a round trip:
  resident  no offload at all (the reference)
  serial    after_update's begin_offload, push's offload, release's onload without the optimizer; the update brings
            the state back before its step (budget None: today's path)
  overlap   the same, with a budget of half the state: that half is sent for at the update's start, the rest
            before the step (overlap.py)
  cancel    begin_offload after the update, then straight into the next update (the offload stops in flight)
Writes rank0.json: per way, every model param, main param and Adam state tensor as a list, the update metrics,
and the host bytes predicted before the first step against what the arena needed after it.

    python -m torch.distributed.run --standalone --nproc_per_node=1 overlap_run.py --models DIR --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import run_layout  # noqa: E402
import tiny  # noqa: E402

from hybridrl.adapters.megatron import builder, offload, overlap, parallel  # noqa: E402
from hybridrl.config.layout import BatchPlan  # noqa: E402
from hybridrl.config.schema.actor import ModelConfig  # noqa: E402
from tests.fixtures.held_copier import HeldCopier  # noqa: E402

WAYS = ("resident", "serial", "overlap", "cancel")


def state_tensors(actor) -> dict[str, torch.Tensor]:
    """Every model param, fp32 main param and Adam state tensor, by a stable name."""
    out = {f"param.{n}": p.detach() for n, p in actor.engine.chunks[0].named_parameters()}
    for i, inner in enumerate(offload._inner_optimizers(actor.engine)):
        for g, group in enumerate(inner.param_groups):
            for j, p in enumerate(group["params"]):
                out[f"main.{i}.{g}.{j}"] = p.detach()
                for k, v in inner.state[p].items():
                    out[f"state.{i}.{g}.{j}.{k}"] = v.detach()
    return out


def one_way(way: str, path: str, layout, plan: BatchPlan, data) -> dict:
    from hybridrl.adapters.megatron.actor import MegatronActor

    cfg = run_layout.actor_cfgs(SimpleNamespace(tp=1, pp=1, vpp=None, sp=False, ep=1), micro=4, dynamic=False,
                                distributed_optimizer=True)
    actor = MegatronActor(ModelConfig(path=path), cfg, layout, plan)
    copier = HeldCopier()
    actor._offloaded = offload.State(device_type="cpu", _copier=copier)
    predicted = offload.host_bytes(actor.engine, "optimizer", "cpu")
    metrics = [actor.update_policy(data)]
    after_first = {k: s.nbytes() for k, s in overlap.unique_storages(
        offload._optimizer_tensors(actor.engine, "cpu"), set(), "cpu").items()}
    state_bytes = []
    for _ in range(2):
        if way != "resident":
            actor.begin_offload(params=False, optimizer=True)  # WeightSync.after_update
        if way in ("serial", "overlap"):
            actor.offload(params=False, grads=True, optimizer=True)  # push, step 1
            actor.onload(params=False, grads=True, optimizer=False)  # release, step 9: the state stays on the host
            offloaded = sum(n for _, n in actor._offloaded.offloaded["optimizer"].values())
            state_bytes.append(offloaded)
            if way == "overlap":
                actor._onload_budget = overlap.OverlapBudget(reserve=0, free=lambda half=offloaded // 2: half)
        metrics.append(actor.update_policy(data))
    tensors = state_tensors(actor)
    return {"tensors": {k: v.float().flatten().tolist() for k, v in tensors.items()},
            "nan": sum(int(v.float().isnan().sum()) for v in tensors.values()),
            "metrics": metrics, "predicted": predicted,
            "arena_after_first_step": offload.HostArena.layout(after_first)[1], "state_bytes": state_bytes,
            "copies_pending": copier.pending}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    parallel.ensure_process_group(timeout_s=300)
    layout = parallel.layout_for(1, tp=1, pp=1)
    parallel.init_megatron(layout, seed=7)
    builder.model_dtype = lambda layout: torch.bfloat16  # the GPU's params: fp32 main params of their own
    path = tiny.make_model("qwen2", args.models)
    # one optimizer step per update (the case whose state waits on the host through the forward/backward)
    n = run_layout.N_SAMPLES
    plan = BatchPlan(samples_per_step=n, mini_batch_samples=n, mini_batches_per_epoch=1, ppo_epochs=1,
                     mini_batch_per_dp=n, micro_batch_per_gpu=4, grad_accum=n // 4, use_dynamic_bsz=False,
                     max_token_len_per_gpu=40, forward_micro_batch_per_gpu=4, forward_max_token_len_per_gpu=40)
    data = run_layout.ppo_data(layout)
    out = {"rank": dist.get_rank(), **{way: one_way(way, path, layout, plan, data) for way in WAYS}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
