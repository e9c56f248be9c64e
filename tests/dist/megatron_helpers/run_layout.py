"""One torchrun launch runs every check of a megatron layout and writes JSON per rank; several layouts of the same
number of ranks can share the launch, their argument lists separated by --next.

    python -m torch.distributed.run --nproc_per_node=N --standalone run_layout.py \
        --models DIR --out DIR --tp T --pp P [--vpp V] [--ep E --sp] --tasks parity,packed,ppo,resume,moe_ppo \
        [--packed] [--save-ckpt DIR] [--resume-ckpt DIR] [--next --models DIR --out DIR2 ...]

Batching many checks into one launch keeps the CPU suite fast (start-up is ~5-11 s per launch, more with 4 ranks
on 2 cores: each rank imports torch, transformers and megatron-core). Layouts of one launch run one after the
other in the same process group; megatron's groups are torn down and built again for each (parallel.destroy_megatron,
as hybrid_helpers/reshard_run.py does), and what a layout's checks set in a module (forward.CHUNK_TOKENS) is put back
before the next one, so each layout runs as it would in a launch of its own.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import tiny  # noqa: E402

from hybridrl.adapters.megatron import parallel  # noqa: E402
from hybridrl.config.layout import BatchPlan  # noqa: E402
from hybridrl.config.schema.actor import ActorConfig, ModelConfig, RefConfig  # noqa: E402
from hybridrl.config.schema.common import MegatronConfig, OptimConfig  # noqa: E402
from hybridrl.config.schema.critic import CriticConfig, CriticModelConfig  # noqa: E402
from hybridrl.protocol import DataProto  # noqa: E402

N_SAMPLES = 12  # global batch of the PPO checks
MINI = 6  # global samples per optimizer step -> 2 optimizer steps per update


# Router losses on, so that their gradients and metrics are compared too.
MOE_LOSSES = {"moe_aux_loss_coeff": 0.05, "moe_z_loss_coeff": 0.01}


def megatron_cfg(args, distributed_optimizer: bool, overrides: dict | None = None) -> MegatronConfig:
    return MegatronConfig(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                          virtual_pipeline_model_parallel_size=args.vpp, sequence_parallel=args.sp,
                          expert_model_parallel_size=args.ep, use_distributed_optimizer=distributed_optimizer, seed=7,
                          override_transformer_config=overrides or {})


def dp_slice(batch: dict, layout) -> dict:
    """This dp rank's rows, arranged so that its k-th local mini-batch is its share of the 1-process
    run's k-th mini-batch (each rank splits its own rows into mini-batches, as verl's workers do)."""
    info = parallel.dispatch_info()
    per_dp = MINI // info.dp_size
    rows = [k * MINI + info.dp_rank * per_dp + i for k in range(N_SAMPLES // MINI) for i in range(per_dp)]
    return {k: v[rows] for k, v in batch.items()}


# ------------------------------------------------------------------------------------------ parity
def check_parity(args, layout, name: str) -> dict:
    """Log-probs, entropy and raw logits vs the transformers references saved by the test (refs.pt)."""
    from megatron.core import parallel_state as ps

    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.adapters.megatron.forward import gather_response

    path = os.path.join(args.models, name)
    ref = torch.load(os.path.join(path, "refs.pt"))
    batch, temperature = ref["batch"], ref["temperature"]
    ref_cfg = RefConfig(megatron=megatron_cfg(args, False), log_prob_micro_batch_size_per_gpu=3,
                        log_prob_use_dynamic_bsz=False, log_prob_max_token_len_per_gpu=4096)
    actor = MegatronActor.reference(ModelConfig(path=path), ref_cfg, layout, micro_batch=3)
    from hybridrl.adapters.megatron import forward

    forward.CHUNK_TOKENS = 5  # several chunks per micro-batch (and a ragged last one): the chunking is exercised
    data = DataProto.from_dict(batch, meta_info={"temperature": temperature, "calculate_sum_pi_squared": True})
    out = actor.compute_log_prob(data, calculate_entropy=True)
    actor.remove_padding = True  # the same weights, micro-batches packed into THD sequences
    packed = actor.compute_log_prob(data, calculate_entropy=True)
    actor.remove_padding = False
    mask = batch["response_mask"].bool()
    # sum of squared probabilities in float64 from the transformers logits (raw: the sampling temperature applies)
    probs = torch.softmax(ref["logits"].double() / temperature, dim=-1)
    res = {
        "logp_max_diff": float((out.batch["log_probs"] - ref["log_probs"])[mask].abs().max()),
        "entropy_max_diff": float((out.batch["entropys"] - ref["entropy"])[mask].abs().max()),
        "sum_pi_squared_max_diff": float((out.batch["sum_pi_squared"].double() - probs.square().sum(-1))[mask].abs().max()),
        "sum_pi_squared_off_mask": float(out.batch["sum_pi_squared"][~mask].abs().max()),
        "packed_logp_vs_padded": float((packed.batch["log_probs"] - out.batch["log_probs"]).abs().max()),
        "packed_entropy_vs_padded": float((packed.batch["entropys"] - out.batch["entropys"]).abs().max()),
    }
    # Raw logits at the response positions, gathered over tp here (the test only; the adapter never does).
    mbs = actor._micro_batches(DataProto.from_dict(batch), [], 3, None)  # sequences padded for sequence parallelism
    diffs = []

    def loss_fn(logits, mb):
        local = gather_response(logits, mb)
        parts = [torch.empty_like(local) for _ in range(args.tp)]
        dist.all_gather(parts, local.contiguous(), group=ps.get_tensor_model_parallel_group())
        full = torch.cat(parts, -1)[..., : tiny.VOCAB]
        m = batch["response_mask"][mb.rows].bool()
        diffs.append(float((full - ref["logits"][mb.rows])[m].abs().max()))
        return logits.new_zeros(()), {}

    actor.engine.run(mbs, loss_fn, forward_only=True)
    if diffs:
        res["logits_max_diff"] = max(diffs)
    res["export_mismatches"] = check_export(actor, path)
    return res


def check_export(role, path: str) -> list[str]:
    """Names that differ from the HF file, plus any tensor of the last bucket that the export itself still
    holds when it gathers the next one."""
    import sys
    import weakref

    from safetensors.torch import load_file

    from hybridrl.adapters.megatron import weights

    want = load_file(os.path.join(path, "model.safetensors"))
    if role.arch.tie_embeddings:
        want.pop("lm_head.weight", None)
    seen, bad, previous = set(), [], []
    gather = weights._gather_on_owner

    def gather_after_the_export_let_go(*args, **kwargs):
        # The export's own frames (from the role down to here) are what must let go. Whether the storage is
        # freed at once is not checked: gloo's worker threads drop their last collectives' buffers when they
        # get to it, which is what made a liveness check flaky.
        held, frame = set(), sys._getframe(1)
        while frame is not None and frame.f_code is not check_export.__code__:
            held |= _tensors_in(frame.f_locals.values())
            frame = frame.f_back
        kept = [name for name, ref in previous if ref() is not None and id(ref()) in held]
        if kept:
            bad.append(f"export still holds the last bucket: {kept[:3]}")
        return gather(*args, **kwargs)

    weights._gather_on_owner = gather_after_the_export_let_go
    try:
        for bucket in role.export_weights(bucket_bytes=64 << 10):
            previous = [(name, weakref.ref(t)) for name, t in bucket]
            seen.update(name for name, _ in bucket)
            bad.extend(name for name, t in bucket if name not in want or not torch.equal(t.cpu(), want[name]))
            del bucket  # what weight_sync does
    finally:
        weights._gather_on_owner = gather
    bad += [f"missing {n}" for n in sorted(set(want) - seen)]
    return bad


def _tensors_in(values, depth: int = 3) -> set[int]:
    """ids of the tensors in `values`, looking into lists, tuples and dicts `depth` levels down."""
    out: set[int] = set()
    for v in values:
        if isinstance(v, torch.Tensor):
            out.add(id(v))
        elif depth and isinstance(v, (list, tuple)):
            out |= _tensors_in(v, depth - 1)
        elif depth and isinstance(v, dict):
            out |= _tensors_in(v.values(), depth - 1)
    return out


# ------------------------------------------------------------------------------------------ packed
def check_packed(args, layout) -> dict:
    """Packed (THD) vs padded micro-batches of one mini-batch on the same weights: every loss metric and
    every gradient after one forward-backward (actor: qwen2, PPO + KL + entropy loss; critic: llama, value
    loss), and the critic's values. Max abs differences."""
    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.adapters.megatron.critic import MegatronCritic

    data = ppo_data(layout)
    plan = batch_plan(layout, args.micro, args.dynamic, args.packed_max_tokens or args.max_tokens)
    n = plan.mini_batch_per_dp
    mini = data[torch.arange(n, 2 * n)]  # the second mini-batch: with 24-token micro-batches on dp2 its ranks need 2 and 1
    actor = MegatronActor(ModelConfig(path=os.path.join(args.models, "qwen2")),
                          actor_cfgs(args, args.micro, args.dynamic, False), layout, plan)
    out = {"actor": packed_vs_padded(actor, mini, actor._input_keys(mini), actor._loss_fn(mini, 0.9), plan)}
    critic = MegatronCritic(critic_cfg(args, args.micro, args.dynamic, False), layout, plan)
    out["critic"] = packed_vs_padded(critic, mini, ["response_mask", "values", "returns"], critic._loss_fn(mini), plan)
    values = []
    for packed in (False, True):
        critic.remove_padding = packed
        values.append(critic.compute_values(data).batch["values"])
    out["critic"]["values"] = float((values[1] - values[0]).abs().max())
    return out


def packed_vs_padded(role, mini, keys: list[str], loss_fn, plan) -> dict:
    from hybridrl.adapters.megatron.builder import unwrap

    runs = []
    for packed in (False, True):
        role.remove_padding = packed
        mbs = role._micro_batches(mini, keys, plan.micro_batch_per_gpu,
                                  plan.max_token_len_per_gpu if plan.use_dynamic_bsz else None)
        assert all(mb.packed == packed for mb in mbs)
        for c in role.engine.chunks:
            c.zero_grad_buffer()
        metrics = role.engine.run(mbs, loss_fn, forward_only=False)  # dp-reduced grads in main_grad
        grads = {f"{i}.{n}": p.main_grad.detach().clone() for i, c in enumerate(role.engine.chunks)
                 for n, p in unwrap(c).named_parameters()}
        sums = {k: sum(float(m[k]) for m in metrics) for k in (metrics[0] if metrics else {})}
        runs.append((grads, sums))
    (g0, m0), (g1, m1) = runs
    role.remove_padding = False
    return {"micro_batches": len(mbs), "grad_max_diff": max(float((g1[n] - g0[n]).abs().max()) for n in g0),
            "grad_max": max(float(g.abs().max()) for g in g0.values()),
            "metric_max_diff": max([abs(m1[k] - m0[k]) for k in m0], default=0.0), "metrics": m0}


# ------------------------------------------------------------------------------------------ ppo
def actor_cfgs(args, micro: int, dynamic: bool, distributed_optimizer: bool, overrides: dict | None = None):
    optim = OptimConfig(lr=1e-3, weight_decay=0.01, clip_grad=1.0, lr_warmup_steps=1, total_training_steps=10,
                        lr_decay_style="cosine", min_lr=1e-4)
    actor = ActorConfig(ppo_mini_batch_size=MINI, ppo_micro_batch_size_per_gpu=micro, use_dynamic_bsz=dynamic,
                        ppo_max_token_len_per_gpu=40, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl",
                        entropy_coeff=0.01, loss_agg_mode="token-mean", optim=optim,
                        megatron=megatron_cfg(args, distributed_optimizer, overrides), data_loader_seed=3,
                        shuffle=False)
    return actor


def batch_plan(layout, micro: int, dynamic: bool, max_tokens: int = 40) -> BatchPlan:
    per_dp = MINI // layout.dp
    return BatchPlan(samples_per_step=N_SAMPLES, mini_batch_samples=MINI, mini_batches_per_epoch=N_SAMPLES // MINI,
                     ppo_epochs=1, mini_batch_per_dp=per_dp, micro_batch_per_gpu=None if dynamic else micro,
                     grad_accum=None if dynamic else per_dp // micro, use_dynamic_bsz=dynamic,
                     max_token_len_per_gpu=max_tokens, forward_micro_batch_per_gpu=micro,
                     forward_max_token_len_per_gpu=max_tokens)


def ppo_data(layout) -> DataProto:
    batch = tiny.make_batch(N_SAMPLES, seed=5)
    batch.update(tiny.ppo_inputs(batch))
    return DataProto.from_dict(dp_slice(batch, layout), meta_info={"temperature": 0.9})


def run_ppo(args, layout) -> dict:
    """Two PPO updates of actor and critic per optimizer kind; with --resume-ckpt also update 2 resumed
    from the 1-process run's checkpoint (saved after update 1), i.e. resumed in another layout."""
    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.adapters.megatron.critic import MegatronCritic

    micro, dynamic = args.micro, args.dynamic
    results = {}
    data = ppo_data(layout)
    model = ModelConfig(path=os.path.join(args.models, "qwen2"), use_remove_padding=args.packed)
    plan = batch_plan(layout, micro, dynamic, args.max_tokens)
    for do in args.dist_opt:
        t0 = time.time()
        actor = MegatronActor(model, actor_cfgs(args, micro, dynamic, do == 1), layout, plan)
        steps = [actor.update_policy(data)]
        if args.save_ckpt:
            actor.save_checkpoint(os.path.join(args.save_ckpt, f"actor_do{do}"))
        steps.append(actor.update_policy(data))
        results[f"actor_do{do}"] = steps
        if args.resume_ckpt:
            resumed = MegatronActor(model, actor_cfgs(args, micro, dynamic, do == 1), layout, plan)
            resumed.load_checkpoint(os.path.join(args.resume_ckpt, f"actor_do{do}"))
            results[f"actor_resumed_do{do}"] = resumed.update_policy(data)
        critic = MegatronCritic(critic_cfg(args, micro, dynamic, do == 1), layout, plan)
        results[f"critic_values_do{do}"] = critic.compute_values(data).batch["values"].tolist()
        results[f"critic_do{do}"] = [critic.update_critic(data), critic.update_critic(data)]
        results[f"seconds_do{do}"] = time.time() - t0
    return results


def run_moe_ppo(args, layout) -> dict:
    """Two PPO updates of a Qwen3-MoE actor (router losses on) per optimizer kind, and its log-probs after them.
    One row per micro-batch: the router losses depend on which tokens share a micro-batch."""
    from hybridrl.adapters.megatron.actor import MegatronActor

    results = {}
    data = ppo_data(layout)
    model = ModelConfig(path=os.path.join(args.models, "qwen3_moe"))
    plan = batch_plan(layout, 1, False)
    for do in args.dist_opt:
        actor = MegatronActor(model, actor_cfgs(args, 1, False, do == 1, MOE_LOSSES), layout, plan)
        steps = [actor.update_policy(data)]
        if args.save_ckpt:
            actor.save_checkpoint(os.path.join(args.save_ckpt, f"moe_actor_do{do}"))
        steps.append(actor.update_policy(data))
        results[f"actor_do{do}"] = steps
        results[f"log_probs_do{do}"] = actor.compute_log_prob(data).batch["log_probs"].tolist()
        if args.resume_ckpt:  # update 2 from the 1-process run's checkpoint, resumed in this layout
            resumed = MegatronActor(model, actor_cfgs(args, 1, False, do == 1, MOE_LOSSES), layout, plan)
            resumed.load_checkpoint(os.path.join(args.resume_ckpt, f"moe_actor_do{do}"))
            results[f"actor_resumed_do{do}"] = resumed.update_policy(data)
    return results


def check_routing(args, layout) -> dict:
    """A rollout's routing with a quarter of its choices changed (tiny.save_routing_references): the actor's
    agreement with it per response token, its log-probs without replay (the model's own routing) and with
    replay (R3: the changed routing), and one update with replay."""
    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.config.schema.actor import RouterReplayConfig

    path = os.path.join(args.models, "qwen3_moe")
    ref, routing = torch.load(os.path.join(path, "refs.pt")), torch.load(os.path.join(path, "routing_refs.pt"))
    batch = {**ref["batch"], "routed_experts": routing["routed_experts"]}
    mask = batch["response_mask"].bool()
    out = {}
    for mode in ("disabled", "R3"):
        cfg = dataclasses.replace(actor_cfgs(args, 4, False, True), router_replay=RouterReplayConfig(mode=mode))
        plan = dataclasses.replace(batch_plan(layout, 4, False), mini_batch_per_dp=8 // layout.dp)
        actor = MegatronActor(ModelConfig(path=path), cfg, layout, plan)
        data = DataProto.from_dict(batch, meta_info={"temperature": ref["temperature"]})
        got = actor.compute_log_prob(data)
        want = ref["log_probs"] if mode == "disabled" else routing["replayed_log_probs"]
        out[mode] = {"logp_max_diff": float((got.batch["log_probs"] - want)[mask].abs().max()),
                     "agreement_max_diff": float((got.batch["routing_agreement"] - routing["agreement"]).abs().max()),
                     "agreement_mean": float(got.batch["routing_agreement"][mask].mean())}
        if mode == "R3":
            info = parallel.dispatch_info()
            rows = slice(info.dp_rank * 8 // info.dp_size, (info.dp_rank + 1) * 8 // info.dp_size)
            train = DataProto.from_dict({k: v[rows] for k, v in {**batch, **tiny.ppo_inputs(batch)}.items()},
                                        meta_info={"temperature": ref["temperature"]})
            out[mode]["update"] = actor.update_policy(train)
    return out


def check_moe_grads(args, layout) -> dict:
    """Gradients of L = sum over response tokens of w * log-prob (fixed random w), router losses off, against
    transformers' autograd (tiny.save_grad_references) for the router, two routed experts and the shared
    expert with its gate: max |diff| / max |want| per parameter (one process, one micro-batch)."""
    from hybridrl.adapters.megatron.actor import MegatronActor
    from hybridrl.adapters.megatron.forward import response_log_probs

    out = {}
    for name in tiny.MOE:
        path = os.path.join(args.models, name)
        ref, grads = torch.load(os.path.join(path, "refs.pt")), torch.load(os.path.join(path, "grad_refs.pt"))
        batch = ref["batch"]
        actor = MegatronActor(ModelConfig(path=path), actor_cfgs(args, 8, False, False, {"moe_aux_loss_coeff": 0.0}),
                              layout, batch_plan(layout, 8, False))
        mbs = actor._micro_batches(DataProto.from_dict(batch), [], 8, None)
        weights = grads["weights"]

        def loss_fn(logits, mb, ref=ref, weights=weights):  # this model's, bound now (run before the next one)
            logp = response_log_probs(logits, mb, tiny.VOCAB, ref["temperature"], with_entropy=False).log_probs
            return (logp * weights[mb.rows]).sum(), {}

        engine = actor.engine
        for c in engine.chunks:
            c.zero_grad_buffer()
        engine.run(mbs, loss_fn, forward_only=False)
        params = dict(engine.module().named_parameters())
        out[name] = {}
        for mcore, hf_name in grads["pairs"].items():
            got = params[mcore].main_grad.float()
            want = grads["grads"][hf_name]
            scale = float(want.abs().max())  # an expert no token chose has zero gradients on both sides
            out[name][hf_name] = float((got - want).abs().max()) / scale if scale > 0 else float(got.abs().max())
    return out


def check_ppo_grads(args, layout) -> dict:
    """The dense actor's PPO gradient, the whole update_policy path up to its optimizer step (which is replaced
    by a copy of the gradients: nothing is applied), against transformers' autograd of the same loss written out
    in tiny.save_ppo_grad_references: max |diff| / max |want| per parameter. One mini-batch of the 8 parity rows in
    two micro-batches of 4."""
    from hybridrl.adapters.megatron import engine as engine_module
    from hybridrl.adapters.megatron.actor import MegatronActor

    path = os.path.join(args.models, "qwen2")
    ref, want = torch.load(os.path.join(path, "refs.pt")), torch.load(os.path.join(path, "ppo_grad_refs.pt"))
    rows = ref["batch"]["input_ids"].shape[0]
    cfg = dataclasses.replace(actor_cfgs(args, 4, False, False), entropy_coeff=0.0, ppo_mini_batch_size=rows)
    plan = BatchPlan(samples_per_step=rows, mini_batch_samples=rows, mini_batches_per_epoch=1, ppo_epochs=1,
                     mini_batch_per_dp=rows, micro_batch_per_gpu=4, grad_accum=rows // 4, use_dynamic_bsz=False,
                     max_token_len_per_gpu=40, forward_micro_batch_per_gpu=4, forward_max_token_len_per_gpu=40)
    actor = MegatronActor(ModelConfig(path=path), cfg, layout, plan)
    got: dict = {}

    def capture(optimizer, clip_grad):
        got.update({n: p.main_grad.detach().float().clone() for n, p in actor.engine.module().named_parameters()})
        return 0.0, False

    step = engine_module.optimizer_step
    engine_module.optimizer_step = capture
    try:
        metrics = actor.update_policy(DataProto.from_dict({**ref["batch"], **want["inputs"]},
                                                          meta_info={"temperature": ref["temperature"]}))
    finally:
        engine_module.optimizer_step = step
    out = {"clipped_fraction": want["clipped_fraction"], "pg_clipfrac": metrics["actor/pg_clipfrac"], "grads": {}}
    for name, w in want["grads"].items():
        g = got[name]  # the embedding has megatron's padded vocab rows: their gradient must be 0
        pad = float(g[w.shape[0]:].abs().max()) if g.shape[0] > w.shape[0] else 0.0
        out["grads"][name] = max(float((g[:w.shape[0]] - w).abs().max()), pad) / float(w.abs().max())
    return out


def critic_cfg(args, micro: int, dynamic: bool, distributed_optimizer: bool) -> CriticConfig:
    optim = OptimConfig(lr=2e-3, weight_decay=0.0, clip_grad=0.5, lr_warmup_steps=0, total_training_steps=10)
    return CriticConfig(rollout_n=1, optim=optim, megatron=megatron_cfg(args, distributed_optimizer),
                        model=CriticModelConfig(path=os.path.join(args.models, "llama"), tokenizer_path="",
                                                external_lib=None, trust_remote_code=False,
                                                use_remove_padding=args.packed),
                        ppo_mini_batch_size=MINI, ppo_micro_batch_size_per_gpu=micro, use_dynamic_bsz=dynamic,
                        forward_max_token_len_per_gpu=40, ppo_epochs=1, shuffle=False,
                        loss_agg_mode="seq-mean-token-mean", data_loader_seed=None)


def run_resume_same_layout(args, layout) -> dict:
    """Uninterrupted update 1, 2 vs (update 1, save, fresh actor, load, update 2) in this layout."""
    from hybridrl.adapters.megatron.actor import MegatronActor

    data = ppo_data(layout)
    model = ModelConfig(path=os.path.join(args.models, "qwen2"))
    do = args.dist_opt[-1] == 1
    ckpt = os.path.join(args.out, "same_layout_ckpt")
    plan = batch_plan(layout, args.micro, args.dynamic, args.max_tokens)
    actor = MegatronActor(model, actor_cfgs(args, args.micro, args.dynamic, do), layout, plan)
    first = actor.update_policy(data)
    actor.save_checkpoint(ckpt)
    second = actor.update_policy(data)
    fresh = MegatronActor(model, actor_cfgs(args, args.micro, args.dynamic, do), layout, plan)
    fresh.load_checkpoint(ckpt)
    resumed = fresh.update_policy(data)
    # The critic (value head, its own checkpoint) the same way.
    from hybridrl.adapters.megatron.critic import MegatronCritic

    critic = MegatronCritic(critic_cfg(args, args.micro, args.dynamic, do), layout, plan)
    critic.update_critic(data)
    critic.save_checkpoint(ckpt + "_critic")
    critic_second = critic.update_critic(data)
    critic_fresh = MegatronCritic(critic_cfg(args, args.micro, args.dynamic, do), layout, plan)
    critic_fresh.load_checkpoint(ckpt + "_critic")
    return {"first": first, "uninterrupted": second, "resumed": resumed,
            "critic_uninterrupted": critic_second, "critic_resumed": critic_fresh.update_critic(data)}


def main() -> None:
    argv, layouts = sys.argv[1:], [[]]
    for a in argv:
        if a == "--next":
            layouts.append([])
        else:
            layouts[-1].append(a)
    parallel.ensure_process_group(timeout_s=300)
    for layout_argv in layouts:
        run_layout(layout_argv)
    dist.destroy_process_group()


def run_layout(argv: list[str]) -> None:
    from hybridrl.adapters.megatron import forward

    chunk_tokens = forward.CHUNK_TOKENS
    p = argparse.ArgumentParser()
    p.add_argument("--models", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--vpp", type=int, default=None)
    p.add_argument("--tasks", default="parity,ppo")
    p.add_argument("--parity-models", default="llama,qwen2,qwen3,mistral")
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism (MoE models with tp > 1 need it)")
    p.add_argument("--micro", type=int, default=1)
    p.add_argument("--dynamic", action="store_true")
    p.add_argument("--packed", action="store_true", help="PPO with use_remove_padding (THD micro-batches)")
    p.add_argument("--packed-max-tokens", type=int, default=None, help="token budget of the packed-vs-padded check")
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--dist-opt", default="0", help="comma list of 0/1: distributed optimizer off/on")
    p.add_argument("--save-ckpt", default=None)
    p.add_argument("--resume-ckpt", default=None)
    args = p.parse_args(argv)
    args.dist_opt = [int(x) for x in args.dist_opt.split(",")]
    layout = parallel.layout_for(dist.get_world_size(), tp=args.tp, pp=args.pp, vpp=args.vpp, ep=args.ep,
                                 sequence_parallel=args.sp)
    parallel.init_megatron(layout, seed=7)
    tasks = args.tasks.split(",")
    info = parallel.dispatch_info()
    out: dict = {"rank": dist.get_rank(), "dp_rank": info.dp_rank, "dp_size": info.dp_size, "timings": {}}
    t0 = time.time()
    if "parity" in tasks:
        out["parity"] = {m: check_parity(args, layout, m) for m in args.parity_models.split(",")}
        out["timings"]["parity"] = time.time() - t0
    if "packed" in tasks:
        t1 = time.time()
        out["packed"] = check_packed(args, layout)
        out["timings"]["packed"] = time.time() - t1
    if "ppo" in tasks:
        t1 = time.time()
        out["ppo"] = run_ppo(args, layout)
        out["timings"]["ppo"] = time.time() - t1
    if "moe_ppo" in tasks:
        t1 = time.time()
        out["moe_ppo"] = run_moe_ppo(args, layout)
        out["timings"]["moe_ppo"] = time.time() - t1
    if "moe_grad" in tasks:
        out["moe_grad"] = check_moe_grads(args, layout)
    if "ppo_grad" in tasks:
        out["ppo_grad"] = check_ppo_grads(args, layout)
    if "routing" in tasks:
        t1 = time.time()
        out["routing"] = check_routing(args, layout)
        out["timings"]["routing"] = time.time() - t1
    if "resume" in tasks:
        t1 = time.time()
        out["resume"] = run_resume_same_layout(args, layout)
        out["timings"]["resume"] = time.time() - t1
    write_results(args.out, out)
    parallel.destroy_megatron()
    forward.CHUNK_TOKENS = chunk_tokens
    gc.collect()


def write_results(out_dir: str, out: dict) -> None:
    """This rank's results as rank<N>.json for the test; returns once every rank has written its own."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(out, f, indent=1)
    dist.barrier()


def finish(out_dir: str, out: dict) -> None:
    """This rank's results as rank<N>.json for the test, then leave the process group together."""
    write_results(out_dir, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
