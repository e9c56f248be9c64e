"""Driver run by every torchrun rank (gloo): MegatronActor (tp, pp) -> WeightSync -> torch rollout engine.

    python -m torch.distributed.run --nproc_per_node=4 --standalone reshard_run.py OUT_DIR HF_DIR...

For each HF folder and each training layout (tp, pp) in LAYOUTS (dp = world / (tp*pp)); for a mixture-of-
experts model (tp, pp, ep) in MOE_LAYOUTS (sequence parallel with tp > 1, as MoE training needs), every rank
builds the policy MegatronActor (DDP + distributed optimizer) from the folder, then
  1. for each rollout tp_g in (1, 2): checks the ReshardPlan's placement of this rank against
     megatron's parallel_state; streams the weights through WeightSync into a TorchRolloutEngine
     (full weights on every rank), comparing every streamed tensor with the HF safetensors bitwise as
     it passes; generates its replica's prompt chunk and compares it with an engine loaded straight
     from the safetensors; gathers all replicas' outputs (so the test can check that the ranks of a
     replica agree) and recomputes their log-probs with the actor (its dp slice): rollout vs actor;
  2. runs one PPO update on those samples, syncs again (tp_g = 2) and repeats the log-prob check:
     the engine follows the trained weights, not the file.
Each rank writes OUT_DIR/rank<RANK>.json with what it saw; the test asserts on it.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from transformers import AutoConfig

from hybridrl.adapters.base import ActorModel
from hybridrl.adapters.megatron import weights as megatron_weights
from hybridrl.config.layout import BatchPlan
from hybridrl.config.schema.actor import ActorConfig, ModelConfig
from hybridrl.config.schema.common import MegatronConfig, OptimConfig
from hybridrl.hybrid import ReshardPlan, SyncOptions, WeightSync, generate_sequences, logprob_gap
from hybridrl.protocol import DataProto
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.torch_engine import TorchRolloutEngine

LAYOUTS = ((2, 1, 1), (1, 2, 1), (2, 2, 1))
MOE_LAYOUTS = ((1, 1, 2), (2, 1, 2))  # ep=2 (dp 4), ep=2 x tp=2 with the experts split over etp=2
TP_G = (1, 2)
PROMPTS = 4
BUCKET_BYTES = 24 * 1024  # small: a tiny model still streams in many buckets
# and several fused tp all-gathers per bucket (the layout tests export with the default: one per bucket)
GATHER_BYTES = 6 * 1024
# top-k/top-p off: the rollout's processed log-probs are then the actor's log-probs at this temperature
SAMPLING = SamplingParams(n=2, temperature=0.7, max_tokens=6)


class CheckingActor(ActorModel):
    """Test-only wrapper: compares every exported tensor with the HF file as it streams past."""

    def __init__(self, actor: ActorModel, reference: dict[str, torch.Tensor]):
        self.actor, self.reference = actor, reference
        self.names: list[str] = []
        self.mismatches: list[str] = []

    def export_weights(self, bucket_bytes, names=None):
        for bucket in self.actor.export_weights(bucket_bytes, names):
            for name, t in bucket:
                self.names.append(name)
                ref = self.reference.get(name)
                if ref is None or ref.dtype != t.dtype or ref.shape != t.shape or not torch.equal(ref, t):
                    self.mismatches.append(name)
            yield bucket

    def weight_regions(self):
        return self.actor.weight_regions()

    def offload(self, params, grads, optimizer):
        return self.actor.offload(params, grads, optimizer)

    def onload(self, params, grads, optimizer):
        return self.actor.onload(params, grads, optimizer)

    def dispatch_info(self):
        return self.actor.dispatch_info()

    def compute_log_prob(self, data, calculate_entropy=False):
        return self.actor.compute_log_prob(data, calculate_entropy)

    def update_policy(self, data):
        return self.actor.update_policy(data)

    def save_checkpoint(self, path):
        raise NotImplementedError

    def load_checkpoint(self, path):
        raise NotImplementedError


# ------------------------------------------------------------------------------------------ setup
def build_actor(hf_dir: str, layout):
    from hybridrl.adapters.megatron.actor import MegatronActor

    megatron = MegatronConfig(tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
                              expert_model_parallel_size=layout.ep, sequence_parallel=layout.sequence_parallel,
                              use_distributed_optimizer=True, seed=7)
    actor_cfg = ActorConfig(ppo_mini_batch_size=PROMPTS, ppo_micro_batch_size_per_gpu=2, use_kl_loss=False,
                            optim=OptimConfig(lr=1e-2, clip_grad=1.0, total_training_steps=10), megatron=megatron)
    rows = PROMPTS * SAMPLING.n // layout.dp
    plan = BatchPlan(samples_per_step=PROMPTS * SAMPLING.n, mini_batch_samples=PROMPTS * SAMPLING.n,
                     mini_batches_per_epoch=1, ppo_epochs=1, mini_batch_per_dp=rows, micro_batch_per_gpu=2,
                     grad_accum=rows // 2, use_dynamic_bsz=False, max_token_len_per_gpu=64,
                     forward_micro_batch_per_gpu=2, forward_max_token_len_per_gpu=64)
    return MegatronActor(ModelConfig(path=hf_dir), actor_cfg, layout, plan)


def make_prompts(vocab: int) -> DataProto:
    g = torch.Generator().manual_seed(7)
    lengths = [3, 6, 1, 5]
    ids = torch.zeros(PROMPTS, 6, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, 6 - n:] = torch.randint(2, vocab, (n,), generator=g)
        mask[i, 6 - n:] = 1
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask,
                                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)})


def reference_engine(hf_cfg, reference: dict[str, torch.Tensor]) -> TorchRolloutEngine:
    eng = TorchRolloutEngine(hf_cfg, pad_token_id=0)
    eng.load_weights(reference.items())
    eng.finish_weight_sync()
    return eng


# ------------------------------------------------------------------------------------------ one step
def check_placement(plan: ReshardPlan, rank: int) -> list[str]:
    from megatron.core import parallel_state as ps

    p = plan.placement(rank)
    real = (ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank(), ps.get_data_parallel_rank())
    return [] if (p.tp_rank, p.pp_rank, p.dp_rank) == real else [f"plan {p} vs megatron tp/pp/dp {real}"]


def gather_replicas(out: DataProto, plan: ReshardPlan) -> tuple[DataProto, list]:
    """All replicas' outputs in replica order (from each replica's collect rank), plus every rank's tokens."""
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, out)
    full = DataProto.concat([parts[r] for r in plan.collect_ranks()])
    return full, [p.batch["responses"].tolist() for p in parts]


def actor_log_probs(actor, full: DataProto) -> tuple[DataProto, torch.Tensor]:
    """This rank's dp slice of the samples and the actor's log-probs of it at the sampling temperature."""
    info = actor.dispatch_info()
    n = len(full) // info.dp_size
    part = full[info.dp_rank * n:(info.dp_rank + 1) * n]
    part.meta_info["temperature"] = SAMPLING.temperature
    return part, actor.compute_log_prob(part).batch["log_probs"]


def sync_generate_check(actor, engine, ref_engine, reference, hf_cfg, layout, tp_g: int, step: int, syncs: dict):
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = ReshardPlan(world, layout.tp, layout.pp, layout.dp, tp_g)
    replica = plan.placement(rank).replica
    if tp_g not in syncs:  # kept per tp_g: a second sync copies the proven weights directly
        checking = CheckingActor(actor, reference)
        syncs[tp_g] = WeightSync(checking, engine, SyncOptions(bucket_bytes=BUCKET_BYTES), plan)
    sync = syncs[tp_g]
    checking = sync.actor
    checking.names, checking.mismatches = [], []  # this sync's (reports keep the previous lists)
    # what this sync copies directly: from this rank's shards, or (remote) from other ranks' (hybridrl.hybrid.remote)
    direct = sorted((sync._direct.names if sync._direct is not None else set())
                    | (sync._remote.names if sync._remote is not None else set()))
    prompts = make_prompts(hf_cfg.vocab_size)
    chunk = prompts[plan.prompt_slice(len(prompts), replica)]
    sampling = SAMPLING.with_(seed=1000 * step + replica)  # one seed per replica: its ranks must agree
    out, metrics = generate_sequences(sync, chunk, sampling, step=step)
    expected = ref_engine.generate(chunk, sampling)
    full, by_rank = gather_replicas(out, plan)
    part, logp = actor_log_probs(actor, full)
    gap = logprob_gap(part.batch["rollout_log_probs"], logp, part.batch["response_mask"])
    tied = {"lm_head.weight"} if hf_cfg.tie_word_embeddings else set()
    report = {
        "tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "tp_g": tp_g, "replica": replica, "step": step,
        "replica_ranks": list(plan.replica_ranks(replica)), "placement_errors": check_placement(plan, rank),
        "streamed": len(checking.names), "mismatches": checking.mismatches,
        "missing": sorted(set(reference) - set(checking.names) - set(direct) - tied), "direct": direct,
        "duplicates": len(checking.names) - len(set(checking.names)),
        "same_as_hf_engine": all(torch.equal(out.batch[k], expected.batch[k]) for k in ("responses", "rollout_log_probs")),
        "engine_equals_hf": all(torch.equal(engine.named_weights()[k], v) for k, v in reference.items()),
        "reference_names": sorted(reference),
        "responses_by_rank": by_rank, "bucket_bytes": BUCKET_BYTES, "gap": gap,
        "metrics": {k: v for k, v in metrics.items() if not k.startswith("timing")},
    }
    return report, part, logp


def ppo_update(actor, part: DataProto, logp: torch.Tensor, step: int) -> dict:
    g = torch.Generator().manual_seed(step)  # same on every rank of a dp group
    advantages = torch.randn(part.batch["responses"].shape, generator=g) * part.batch["response_mask"]
    data = DataProto.from_dict({**part.batch, "old_log_probs": logp, "advantages": advantages},
                               meta_info={"temperature": SAMPLING.temperature})
    return actor.update_policy(data)


# ------------------------------------------------------------------------------------------ driver
def run_layout(hf_dir, hf_cfg, reference, engine, ref_engine, tp, pp, ep, step) -> list[dict]:
    from hybridrl.adapters.megatron.parallel import destroy_megatron, layout_for

    layout = layout_for(dist.get_world_size(), tp=tp, pp=pp, ep=ep, sequence_parallel=ep > 1)
    actor = build_actor(hf_dir, layout)
    results, syncs = [], {}
    for tp_g in TP_G:
        start = time.perf_counter()
        report, part, logp = sync_generate_check(actor, engine, ref_engine, reference, hf_cfg, layout, tp_g, step, syncs)
        report["seconds"] = time.perf_counter() - start
        results.append(report)
        step += 1
    update = ppo_update(actor, part, logp, step)
    report, _, _ = sync_generate_check(actor, engine, ref_engine, reference, hf_cfg, layout, 2, step, syncs)
    report.update(after_update=True, update_applied=update.get("actor/update_applied"))
    results.append(report)
    del actor
    destroy_megatron()
    return results


def run(out_dir: str, hf_dirs: list[str]) -> None:
    """Every layout of every model (the process group is up); this rank's reports in OUT_DIR/rank<RANK>.json."""
    default_gather = megatron_weights.GATHER_BYTES
    megatron_weights.GATHER_BYTES = GATHER_BYTES
    results: list = []
    try:
        for hf_dir in hf_dirs:
            hf_cfg = AutoConfig.from_pretrained(hf_dir, local_files_only=True)
            reference = load_file(os.path.join(hf_dir, "model.safetensors"))
            engine = TorchRolloutEngine(hf_cfg, pad_token_id=0)  # one engine per model, re-synced every step
            ref_engine = reference_engine(hf_cfg, reference)
            layouts = MOE_LAYOUTS if "moe" in hf_cfg.model_type else LAYOUTS
            for i, (tp, pp, ep) in enumerate(layouts):
                for r in run_layout(hf_dir, hf_cfg, reference, engine, ref_engine, tp, pp, ep, step=10 * i):
                    r.update(model=os.path.basename(hf_dir), ep=ep)
                    results.append(r)
    finally:
        megatron_weights.GATHER_BYTES = default_gather
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()


def main() -> None:
    from hybridrl.adapters.megatron.parallel import ensure_process_group

    torch.set_num_threads(1)
    ensure_process_group(timeout_s=120)
    run(sys.argv[1], sys.argv[2:])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
