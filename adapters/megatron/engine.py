"""The training engine shared by actor, critic and reference: model chunks, optimizer, schedules.

Loss scaling contract (why `calculate_per_token_loss` and our own finalize): the loss a micro-batch
returns is ALREADY its exact share of the mini-batch loss across all micro-batches and dp ranks
(actor.py / critic.py aggregate with agg_loss's global token / row counts, whose result is that share
times dp_size for an averaging reduce, and divide by dp_size). So the schedule must not
divide by the number of micro-batches, DDP must SUM (not average) over dp, and nothing may divide by
a token count afterwards: calculate_per_token_loss=True gives the first two, and `_finalize` calls
megatron's finalize_model_grads without num_tokens for the third. The update is then invariant to
micro-batch size and to dp.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterable, Optional

import torch
import torch.distributed as dist

from hybridrl.config.layout import ParallelLayout
from hybridrl.config.schema.common import OptimConfig

from . import compat, moe
from .builder import unwrap, wrap_ddp
from .forward import MicroBatch
from .phases import Phases

# (model output of the last stage [b, L, X], micro-batch) -> (loss scalar, {metric: detached scalar tensor})
LossFn = Callable[[torch.Tensor, MicroBatch], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def check_interleaved_count(count: int, pp: int, chunks: int, group: Optional[int]) -> None:
    """Refuse a training pass that megatron-core 0.16's interleaved schedule would deadlock in.

    With virtual stages the first pipeline stage runs 2*(pp-1) + (chunks-1)*group forward passes before its first
    backward (get_pp_rank_microbatches; group = microbatch_group_size_per_vp_stage, pp by default). When that covers
    all count*chunks of them, it never posts the receive for the first gradient in its warm-up, while the last
    stage, already in 1F1B, sends that gradient. With variable sequence lengths (builder.py) every send is preceded
    by a blocking exchange of shapes that waits on its sends too: the last stage waits for the first to take the
    gradient's shape, the first waits for the last to take its next activation, and neither returns. With count a
    multiple of pp (batching.py) this is exactly count == pp; 2*pp or more never deadlocks. Seen on gloo
    (tests/dist/test_megatron_interleaved.py); refused on every device, as the same exchange runs over NCCL.
    """
    if chunks <= 1 or pp <= 1:
        return
    warmup = 2 * (pp - 1) + (chunks - 1) * (group or pp)
    if warmup >= count * chunks:
        raise ValueError(f"{count} micro-batches cannot train with pipeline_model_parallel_size={pp} and "
                         f"virtual_pipeline_model_parallel_size={chunks}: megatron-core's interleaved schedule would "
                         f"deadlock (its first stage runs them all in warm-up); give each dp rank at least {2 * pp} "
                         "micro-batches per mini-batch (a larger ppo_mini_batch_size) or unset "
                         "virtual_pipeline_model_parallel_size")


class Engine:
    """Model chunks of one role on this rank, with (optionally) DDP, optimizer and LR scheduler."""

    def __init__(self, chunks: list[torch.nn.Module], layout: ParallelLayout, optim: Optional[OptimConfig] = None,
                 use_distributed_optimizer: bool = False, total_training_steps: Optional[int] = None,
                 ddp_overrides: Optional[dict[str, Any]] = None) -> None:
        self.layout = layout
        self.config = unwrap(chunks[0]).config
        self.optimizer = self.scheduler = None
        self.optim = optim
        self.optimizer_steps = 0  # applied updates (restored from checkpoints: see checkpoint.py)
        self.router_losses: dict[str, float] = {}  # MoE: the last train_step's router losses (moe.py)
        self.step_seconds: dict[str, float] = {}  # the last train_step's: forward_backward, optimizer_step
        # torch's peak allocated bytes read right after the last train_step's backward (GPU only; since the caller's
        # last reset_peak_memory_stats: train_bench resets it per update to measure the forward/backward's own peak)
        self.backward_peak_bytes = 0
        if optim is None:
            for c in chunks:
                c.requires_grad_(False)
            self.chunks = chunks
            return
        self.chunks = wrap_ddp(chunks, use_distributed_optimizer, ddp_overrides)
        self.optimizer = build_optimizer(self.chunks, optim, self.config, use_distributed_optimizer)
        self.scheduler = build_scheduler(self.optimizer, optim, total_training_steps)
        self.config.no_sync_func = [c.no_sync for c in self.chunks] if len(self.chunks) > 1 else self.chunks[0].no_sync
        self.config.finalize_model_grads_func = _finalize
        self.config.grad_scale_func = self.optimizer.scale_loss

    # ---------------------------------------------------------------------------------- schedules
    def run(self, micro_batches: list[MicroBatch], loss_fn: LossFn, forward_only: bool,
            prepare: Optional[Callable[[MicroBatch], None]] = None) -> list[dict[str, torch.Tensor]]:
        """Forward (and backward) over all micro-batches with megatron's schedule (1F1B under PP).

        `prepare(mb)` runs before each micro-batch's forward on every stage (MoE: router-loss weights, replay).
        Returns the loss_fn metrics per micro-batch on the last pipeline stage, [] elsewhere.
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if not forward_only:
            check_interleaved_count(len(micro_batches), self.layout.pp, len(self.chunks),
                                    self.config.microbatch_group_size_per_vp_stage)
        routed = {"padding_mask": None} if moe.is_moe(self.config) else {}

        def step(data_iterator, model):
            mb = next(data_iterator)
            if routed:  # MoE: padding tokens are routed but do not count in the router losses
                routed["padding_mask"] = mb.padding_mask
            if prepare is not None:
                prepare(mb)
            out = model(input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None,
                        packed_seq_params=mb.packed_seq_params(), **routed)
            return out, functools.partial(_loss, mb)

        def _loss(mb, out):
            loss, metrics = loss_fn(out, mb)
            return loss, torch.ones((), dtype=torch.int, device=loss.device), metrics

        iters = [iter(micro_batches) for _ in self.chunks]
        for c in self.chunks:
            c.train(not forward_only)
        ctx = torch.no_grad() if forward_only else _nullcontext()
        with ctx:
            return get_forward_backward_func()(
                forward_step_func=step,
                data_iterator=iters if len(iters) > 1 else iters[0],
                model=self.chunks,
                num_microbatches=len(micro_batches),
                seq_length=max(mb.input_ids.shape[1] for mb in micro_batches),
                micro_batch_size=max(mb.input_ids.shape[0] for mb in micro_batches),
                forward_only=forward_only,
            )

    def train_step(self, micro_batches: list[MicroBatch], loss_fn: LossFn,
                   prepare: Optional[Callable[[MicroBatch], None]] = None,
                   before_step: Optional[Callable[[], None]] = None,
                   phases: Optional[Phases] = None) -> tuple[list[dict], float, bool]:
        """One optimizer step over `micro_batches`: (per-micro-batch metrics, grad norm, applied?).
        `before_step()` runs between the backward passes and the optimizer step (the role's optimizer onload).
        `phases` (the caller's clock, running since its last mark) gets stream_wait (the compute stream's work queued
        before the step), forward_backward, onload_wait (before_step) and optimizer_step.

        MoE models: the router losses of the step are in `self.router_losses` (moe.router_loss_values)."""
        assert self.optimizer is not None, "train_step on a role built without an optimizer (reference)"
        # The parts are timed apart (MFU of the forward/backward alone: train_bench), on the compute stream only:
        # offload's copies on their side stream overlap it (overlap.py) and are timed by their owner.
        phases = Phases() if phases is None else phases
        compat.synchronize_stream()
        phases.mark("stream_wait")
        for c in self.chunks:
            c.zero_grad_buffer()
        self.optimizer.zero_grad()
        if moe.is_moe(self.config):
            moe.clear_router_losses()
            tokens = sum_over_dp([sum(float((~mb.padding_mask).sum()) for mb in micro_batches)])[0]
            with moe.RouterLossWeights(self.config, tokens) as weights:
                metrics = self.run(micro_batches, loss_fn, forward_only=False, prepare=_both(weights.weigh, prepare))
            self.router_losses = moe.router_loss_values(self.config, len(micro_batches))
        else:
            metrics = self.run(micro_batches, loss_fn, forward_only=False, prepare=prepare)
        compat.synchronize_stream()
        forward_backward = phases.mark("forward_backward")
        if compat.cuda_in_use():
            self.backward_peak_bytes = torch.cuda.max_memory_allocated()
        if before_step is not None:  # timed by its owner too (the role's optimizer onload)
            before_step()
        phases.mark("onload_wait")
        if not has_state(self.optimizer):
            # The first step creates the optimizer's state (Adam's moments, 8 bytes a parameter, made lazily by
            # torch's and TE's Adam). With the forward/backward's freed blocks still cached (the logits' segments,
            # GBs each) the allocator would carve the state out of them and pin those segments for the rest of the
            # run: no later empty_cache returns them (issue 42's H100 run: reserved - allocated 0.25 GB before the
            # first update, 9.3 GB in every phase after it). Handing them back first gives the state its own.
            compat.empty_cache()
        grad_norm, applied = optimizer_step(self.optimizer, self.optim.clip_grad)
        compat.synchronize_stream()
        self.step_seconds = {"forward_backward": forward_backward, "optimizer_step": phases.mark("optimizer_step")}
        self.optimizer_steps += int(applied)
        return metrics, grad_norm, applied

    def lr(self) -> float:
        groups = self.optimizer.param_groups if self.optimizer is not None else []
        return float(groups[0]["lr"]) if groups else 0.0

    def module(self, i: int = 0) -> torch.nn.Module:
        return unwrap(self.chunks[i])


def _both(first: Callable[[MicroBatch], None], second: Optional[Callable[[MicroBatch], None]]):
    return first if second is None else (lambda mb: (first(mb), second(mb)))


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _finalize(model, num_tokens=None, pg_collection=None, force_all_reduce=False):
    """megatron's grad finalisation (dp reduce, tied-embedding and layernorm syncs) without 1/num_tokens."""
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(model, None, pg_collection=pg_collection, force_all_reduce=force_all_reduce)


# ---------------------------------------------------------------------------------- optimizer
def build_optimizer(chunks: list[torch.nn.Module], optim: OptimConfig, model_config: Any,
                    use_distributed_optimizer: bool) -> Any:
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    kwargs = dict(
        optimizer=optim.optimizer,
        lr=optim.lr,
        min_lr=optim.min_lr,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        clip_grad=optim.clip_grad,
        bf16=model_config.bf16,
        fp16=model_config.fp16,
        params_dtype=model_config.params_dtype,
        use_distributed_optimizer=use_distributed_optimizer,
    )
    kwargs.update(optim.override_optimizer_config)
    optimizer = get_megatron_optimizer(OptimizerConfig(**kwargs), chunks)
    use_fused_torch_adam(optimizer)
    return optimizer


def use_fused_torch_adam(optimizer: Any) -> int:
    """Switch the torch AdamW that megatron falls back to (no transformer-engine or apex) from foreach to fused;
    returns the number of param groups switched.

    foreach allocates a temporary as large as all the fp32 state it updates (4 bytes a parameter: 30 GB for
    a 7.6B model) at every step; fused updates in place and was 2.4x faster on an H200 (2B parameters:
    0.020 s vs 0.048 s; benchmarks/results/adam_mem.md). torch reads the two flags from the param group at
    every step, so switching after megatron built the optimizer is enough; a checkpoint saved from either
    form loads into the other (torch moves the `step` counters where the flags want them)."""
    switched = 0
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if type(inner) not in (torch.optim.Adam, torch.optim.AdamW):
            continue  # TE / apex FusedAdam, CPU offload's hybrid optimizer: fused already, or not torch's
        for group in inner.param_groups:
            params = group["params"]
            if params and not group.get("fused") and all(_fusable(p) for p in params):
                group["fused"], group["foreach"] = True, False
                inner.defaults.update(fused=True, foreach=False)  # for param groups added later
                switched += 1
    return switched


def _fusable(p: torch.Tensor) -> bool:
    """torch's fused AdamW: floating-point tensors on CUDA or CPU, no sparse or complex (its own checks)."""
    return p.device.type in ("cuda", "cpu") and p.is_floating_point() and not p.is_sparse


def build_scheduler(optimizer: Any, optim: OptimConfig, total_training_steps: Optional[int]) -> Any:
    """megatron's OptimizerParamScheduler, counted in training steps (one per update call, as verl)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    total = total_training_steps if total_training_steps and total_training_steps > 0 else optim.total_training_steps
    warmup = optim.lr_warmup_steps
    if warmup is None or warmup < 0:
        warmup = int(optim.lr_warmup_steps_ratio * total) if total > 0 else 0
    if total <= 0 and optim.lr_decay_style != "constant":
        raise ValueError(f"optim.lr_decay_style={optim.lr_decay_style!r} needs the number of training steps: set "
                         "optim.total_training_steps (or pass total_training_steps)")
    decay = optim.lr_decay_steps or (total if total > 0 else warmup + 1)
    decay = max(decay, warmup + 1)
    return OptimizerParamScheduler(
        optimizer, init_lr=optim.lr_warmup_init, max_lr=optim.lr, min_lr=optim.min_lr,
        lr_warmup_steps=warmup, lr_decay_steps=decay, lr_decay_style=optim.lr_decay_style,
        start_wd=optim.weight_decay, end_wd=optim.weight_decay, wd_incr_steps=decay,
        wd_incr_style=optim.weight_decay_incr_style,
        use_checkpoint_opt_param_scheduler=optim.use_checkpoint_opt_param_scheduler,
        override_opt_param_scheduler=not optim.use_checkpoint_opt_param_scheduler,
        wsd_decay_steps=optim.lr_wsd_decay_steps, lr_wsd_decay_style=optim.lr_wsd_decay_style,
    )


def main_param_writer(optimizer: Any) -> Callable[[torch.nn.Parameter, torch.Tensor], bool]:
    """`write(model_param, full)`: set the fp32 main param (this rank's shard of it under the distributed
    optimizer) of a bf16/fp16 model param from `full`, a tensor of the model param's shape; False for a param
    without a separate main param (float32 params are their own).

    Why: megatron builds its main params by copying the model params, so a float32 checkpoint loaded into bf16
    params starts its master weights on the bf16 grid. There, a weight's bf16 value stays put until the Adam
    steps add up to half a bf16 step (about 49 steps of lr 1e-5 for SmolLM2's median weight), while an fp32
    master holding the checkpoint's own values moves the bf16 weights in proportion from the first step, as an
    fp32 trainer (verl's FSDP) does. benchmarks/results/peer_verl.md shows the 2x slower climb it caused."""
    targets: dict[int, tuple[torch.Tensor, Optional[slice]]] = {}
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        config = getattr(opt, "config", None)
        if type(getattr(opt, "optimizer", None)).__name__ == "HybridDeviceOptimizer" or \
                getattr(config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8", False):
            continue  # the master weights live inside that optimizer (megatron does not reach them either)
        if hasattr(opt, "shard_fp32_from_float16_groups"):  # DistributedOptimizer: a range of the flat param
            for models, mains in zip(opt.model_float16_groups, opt.shard_fp32_from_float16_groups):
                for p, main in zip(models, mains):
                    r = opt._get_model_param_range_map(p)["param"]
                    targets[id(p)] = (main, slice(r.start, r.end))
        elif hasattr(opt, "fp32_from_float16_groups"):  # Float16OptimizerWithFloat16Params: whole params
            for models, mains in zip(opt.float16_groups, opt.fp32_from_float16_groups):
                for p, main in zip(models, mains):
                    targets[id(p)] = (main, None)

    @torch.no_grad()
    def write(param: torch.nn.Parameter, full: torch.Tensor) -> bool:
        target = targets.get(id(param))
        if target is None:
            return False
        main, span = target
        if tuple(full.shape) != tuple(param.shape):
            raise AssertionError(f"main_param_writer: {tuple(full.shape)} for a param of {tuple(param.shape)}")
        src = full.to(main.device, torch.float32)
        main.copy_(src.reshape(-1)[span] if span is not None else src.reshape(main.shape))
        return True

    return write


def has_state(optimizer: Any) -> bool:
    """Whether the optimizer's state exists yet (torch's optimizers make it at their first step; a checkpoint's
    load makes it too; an offloaded state still counts). Stub members (no parameters on this rank) have none to make."""
    inner = [getattr(o, "optimizer", None) for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    inner = [m for m in inner if m is not None]
    return not inner or any(len(m.state) for m in inner)


@torch.no_grad()
def optimizer_step(optimizer: Any, clip_grad: float) -> tuple[float, bool]:
    """megatron's ChainedOptimizer.step, but the grad norm is always computed (also with clip_grad=0)
    and a non-finite norm skips the update instead of writing NaN into the weights."""
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    found_inf = optimizer.prepare_grads()
    grad_norm = float(optimizer.get_grad_norm())
    if found_inf or not math.isfinite(grad_norm):
        return grad_norm, False
    if clip_grad > 0:
        for opt in optimizer.chained_optimizers:
            params = opt.get_parameters()
            if getattr(opt, "is_stub_optimizer", False) or not params:
                continue
            clip_grad_by_total_norm_fp32(params, max_norm=clip_grad, total_norm=grad_norm,
                                         use_decoupled_grad=opt.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8)
    return grad_norm, bool(optimizer.step_with_ready_grads())


# ---------------------------------------------------------------------------------- collectives
def sum_over_dp(values: Iterable[float]) -> list[float]:
    """All-reduce (sum) a few floats over the data-parallel group (float64 for exact-ish sums)."""
    from megatron.core import parallel_state as ps

    from . import compat

    t = torch.tensor(list(values), dtype=torch.float64, device=compat.device())
    if ps.get_data_parallel_world_size() > 1:
        dist.all_reduce(t, group=ps.get_data_parallel_group())
    return t.tolist()


def max_over_dp(value: int) -> int:
    """The largest of one integer over the data-parallel group."""
    from megatron.core import parallel_state as ps

    from . import compat

    if ps.get_data_parallel_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=compat.device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ps.get_data_parallel_group())
    return int(t.item())


def broadcast_from_last_stage(t: Optional[torch.Tensor], shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor computed on the last pipeline stage, on every stage (others pass None)."""
    from megatron.core import parallel_state as ps

    from . import compat

    if ps.get_pipeline_model_parallel_world_size() == 1:
        return t
    buf = t.to(compat.device(), dtype).contiguous() if t is not None else torch.empty(shape, dtype=dtype, device=compat.device())
    dist.broadcast(buf, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group())
    return buf
