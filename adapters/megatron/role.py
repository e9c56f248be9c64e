"""What actor, reference and critic share: build from the HF folder, engine, weights, memory, checkpoints."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import math
import time
from typing import Any, Collection, Iterator, Optional

import torch

from hybridrl.adapters.base import DispatchInfo, OffloadReport, WeightBucket, WeightRegion
from hybridrl.config.layout import ParallelLayout
from hybridrl.config.schema.common import MegatronConfig, OptimConfig

from . import checkpoint, lora_io, offload, overlap, parallel
from . import lora as lora_mod
from .batching import micro_batches, mini_batch_rows, row_lengths, split_tokens
from .builder import build_model
from .engine import Engine, broadcast_from_last_stage, main_param_writer, max_over_dp, sum_over_dp
from .hf_config import arch_from_hf, load_hf_config
from .lora import LoraSpec
from .phases import COUNTERS, UPDATE_PARTS, Phases
from .weights import export_hf_weights, load_hf_weights, local_regions, loses_precision

log = logging.getLogger(__name__)


class MegatronRole:
    """One model of one role on this rank. Every public method is collective over the role's ranks."""

    role = "model"

    def __init__(self, hf_path: str, megatron: MegatronConfig, layout: ParallelLayout, *,
                 optim: Optional[OptimConfig], value_head: bool = False, override_config: Optional[dict] = None,
                 recompute: bool = False, load_weight: bool = True, total_training_steps: Optional[int] = None,
                 transformer_overrides: Optional[dict] = None, remove_padding: bool = False,
                 lora: Optional[LoraSpec] = None, head_bias: bool = False) -> None:
        began = time.perf_counter()
        parallel.init_megatron(layout, seed=megatron.seed)
        self.hf_path = hf_path
        self.hf_config = _with_overrides(load_hf_config(hf_path), override_config or {})
        self.arch = dataclasses.replace(arch_from_hf(self.hf_config), source=str(hf_path))
        self.layout = layout
        self.megatron = megatron
        self.value_head = value_head
        self.head_bias = head_bias  # the value/score head has a bias (HF *ForTokenClassification's score.bias)
        self.remove_padding = remove_padding  # micro-batches packed into one THD sequence (forward.pack_thd)
        overrides = {"calculate_per_token_loss": True, **(transformer_overrides or {}),
                     **megatron.override_transformer_config}
        chunks = build_model(self.arch, layout, value_head=value_head, seed=megatron.seed,
                             init_std=getattr(self.hf_config, "initializer_range", 0.02), recompute=recompute,
                             overrides=overrides, transformer_impl=megatron.transformer_impl, head_bias=head_bias)
        rounded: list[torch.nn.Parameter] = []  # params whose checkpoint values their dtype cannot hold
        loading = time.perf_counter()
        if load_weight:
            load_hf_weights(chunks, hf_path, self.arch, layout, value_head=value_head,
                            into=functools.partial(_load_noting_rounding, rounded), head_bias=head_bias)
        load_s = time.perf_counter() - loading
        self.lora = lora  # LoRA: the base is frozen and the optimizer holds the adapters only (lora.py)
        self._lora_entries = []  # this rank's adapter parameters (mapping.lora_plan rows)
        if lora is not None:
            self._lora_entries = lora_mod.attach(chunks, self.arch, layout, lora, seed=megatron.seed)
            rounded = []  # the frozen base has no master weights to start from the checkpoint's values
        self.engine = Engine(chunks, layout, optim, megatron.use_distributed_optimizer and optim is not None,
                             total_training_steps, megatron.override_ddp_config)
        if rounded and self.engine.optimizer is not None:
            loading = time.perf_counter()
            self._master_weights_from_checkpoint(len(rounded))
            load_s += time.perf_counter() - loading
        # the build's two parts (hybridrl.trainer.startup): megatron-core's import and groups, the model and its
        # optimizer; the checkpoint read into it
        self.build_seconds = {"model_build": time.perf_counter() - began - load_s, "weight_load": load_s}
        self.updates = 0  # update calls so far (the LR scheduler counts the same steps)
        self._offloaded = offload.State()
        self._onload = overlap.Moved()  # the current update's optimizer-state onload (_optimizer_on_device)
        self._onload_budget: Optional[overlap.OverlapBudget] = None  # overlap_onload(); None: after the backward
        self._regions: Optional[list[WeightRegion]] = None  # weight_regions(), built on first use
        self._adapter_export: Optional[lora_io.AdapterExport] = None  # export_adapter_weights(), built on first use

    def _master_weights_from_checkpoint(self, rounded: int) -> None:
        """The fp32 master weights take the checkpoint's own (float32) values, not their bf16 rounding: a second
        read of this rank's shards, only for checkpoints finer than the params (engine.main_param_writer: why)."""
        write = main_param_writer(self.engine.optimizer)
        written = [0]

        def into(param: torch.nn.Parameter, shard: torch.Tensor) -> None:
            written[0] += bool(write(param, shard))

        load_hf_weights(self.engine.chunks, self.hf_path, self.arch, self.layout,
                        value_head=self.value_head, into=into, head_bias=self.head_bias)
        if written[0]:
            log.info("%s: %d tensors of %s hold values bf16 rounds away; the fp32 master weights start from the "
                     "checkpoint's values (%d set)", self.role, rounded, self.hf_path, written[0])
        else:
            log.warning("%s: %d tensors of %s hold values bf16 rounds away, and this optimizer keeps its master "
                        "weights where they cannot be set: they start from the bf16 rounding, and small updates "
                        "move the bf16 weights only once they add up to half a bf16 step", self.role, rounded,
                        self.hf_path)

    # ---------------------------------------------------------------------------------- interface
    def dispatch_info(self) -> DispatchInfo:
        return parallel.dispatch_info()

    def export_weights(self, bucket_bytes: int, names: Optional[Collection[str]] = None) -> Iterator[WeightBucket]:
        """Full HF-named tensors in buckets (collective); parameters must be on the device (onload first).

        LoRA: with lora.merge the base weights with the adapters merged in, so the rollout engine computes what the
        actor does; otherwise the frozen base alone, which the engine loads once and completes with the adapters of
        export_adapter_weights() each step (hybridrl/hybrid/adapter_sync.py)."""
        merged = lora_mod.merged_params(self.engine.chunks) if self.lora is not None and self.lora.merge else None
        return export_hf_weights(self.engine.chunks, self.arch, self.layout, bucket_bytes, value_head=self.value_head,
                                 names=names, params=merged, head_bias=self.head_bias)

    def export_adapter_weights(self, bucket_bytes: int) -> Iterator[WeightBucket]:
        """LoRA: the adapters only, as (PEFT name, full tensor) buckets on every rank (collective)."""
        if self.lora is None:
            raise RuntimeError(f"{self.role}: export_adapter_weights needs LoRA (actor_rollout_ref.model.lora_rank > 0)")
        if self._adapter_export is None:  # planned once: the adapters are parameters whose storage stays put
            self._adapter_export = lora_io.AdapterExport(self.engine.chunks, self.arch, self.layout, self.lora)
        return self._adapter_export.buckets(bucket_bytes)

    def weight_regions(self) -> Optional[list[WeightRegion]]:
        # Views stay valid across offload/onload: that resizes the storages the views share.
        if self.lora is not None:  # merged: the live params are not what the engine needs; adapters: the base syncs once
            return None
        if self._regions is None:
            self._regions = local_regions(self.engine.chunks, self.arch, self.layout, value_head=self.value_head,
                                          head_bias=self.head_bias) or []
        return self._regions or None

    def offload(self, params: bool, grads: bool, optimizer: bool) -> OffloadReport:
        return offload.offload(self.engine, self._offloaded, params, grads, optimizer)

    def onload(self, params: bool, grads: bool, optimizer: bool) -> OffloadReport:
        return offload.onload(self.engine, self._offloaded, params, grads, optimizer)

    def prepare_offload(self, params: bool, grads: bool, optimizer: bool, *,
                        onload_reserve: Optional[int] = None) -> None:
        """Pin the host arenas of params / optimizer state in the background from now on (pinned.HostReserve), and
        with `onload_reserve` let the optimizer state come back during the forward/backward (overlap_onload)."""
        kinds = [kind for kind, on in (("params", params), ("optimizer", optimizer)) if on]
        offload.reserve_host(self.engine, self._offloaded, kinds)
        if optimizer and onload_reserve is not None:
            self.overlap_onload(onload_reserve)

    def begin_offload(self, params: bool, optimizer: bool) -> None:
        offload.begin_offload(self.engine, self._offloaded, params, optimizer)

    def overlap_onload(self, reserve_bytes: Optional[int]) -> None:
        """Let an offloaded optimizer state come back while the forward/backward runs, as far as the device's free
        memory at the update's start, less `reserve_bytes` for the forward/backward itself
        (hybridrl.plan.memory.onload_reserve), allows; None: it comes back after the backward (serial)."""
        self._onload_budget = None if reserve_bytes is None else overlap.OverlapBudget(int(reserve_bytes))

    def startup_times(self) -> dict[str, float]:
        """host_pin_wait: start-up waited for the host arenas pinned in the background (prepare_offload);
        host_pin_background: the pinning's own time, beside other start-up work; ROLE_model_build and
        ROLE_weight_load: the parts of this role's build."""
        out = {f"{self.role}_{k}": v for k, v in getattr(self, "build_seconds", {}).items()}
        reserve = self._offloaded.reserve
        if reserve is None:
            return out
        out["host_pin_wait"] = reserve.waited
        if reserve.done:
            out["host_pin_background"] = reserve.seconds
        return out

    def save_checkpoint(self, path: str) -> None:
        self._optimizer_on_device()
        checkpoint.save(path, self)

    def load_checkpoint(self, path: str) -> None:
        self._optimizer_on_device()
        checkpoint.load(path, self)

    def _optimizer_on_device(self) -> None:
        """The optimizer state back from the host if it was left there (weight_sync.py, step 9): it is needed
        only from the optimizer step on, so a one-step update's forward/backward runs without it, or beside the
        part of it _begin_optimizer_onload sent for. The compute stream waits for every copy."""
        state = self._offloaded
        if state.offloaded["optimizer"] or state.arriving.get("optimizer") or "optimizer" in state.leaving:
            self._onload = self._onload + overlap.finish_onload(state, "optimizer")

    def _begin_optimizer_onload(self) -> None:
        """At the update's start: an offload still in flight stops (the state never left), and as much of an
        offloaded state as overlap_onload's budget allows starts back on the side stream (overlap.py)."""
        state = self._offloaded
        if not state.active():
            return
        overlap.cancel_offload(state, "optimizer")
        if self._onload_budget is not None and state.offloaded["optimizer"]:
            allowed = self._onload_budget.allowed()
            sent = overlap.begin_onload(state, "optimizer", allowed)
            if not getattr(self, "_onload_logged", False):  # once: how the budget played out on this device
                self._onload_logged = True
                total = sent + sum(n for _, n in state.offloaded["optimizer"].values())
                log.info("%s: %.1f of %.1f GiB of optimizer state come back beside the forward/backward (%.1f GiB free "
                         "beyond the %.1f GiB kept for it); the rest before the optimizer step", self.role, sent / 2**30,
                         total / 2**30, allowed / 2**30, self._onload_budget.reserve / 2**30)

    def _onload_metrics(self) -> dict[str, float]:
        """timing_s/optimizer_onload: the copies' own time; _exposed: the part the optimizer step waited for;
        offload/optimizer_onload_overlap: the share of the bytes sent for before the backward ended (0: the serial
        path, the budget left no room)."""
        m = self._onload
        if not m.nbytes:
            return {}
        return {"timing_s/optimizer_onload": m.copy_seconds, "timing_s/optimizer_onload_exposed": m.exposed_seconds,
                "offload/optimizer_onload_overlap": m.overlapped_bytes / m.nbytes}

    # ---------------------------------------------------------------------------------- helpers
    def _shuffle_seed(self, epoch: int) -> Optional[int]:
        """Per-update, per-epoch shuffle seed (None: keep order); the same on every rank."""
        if not getattr(self.cfg, "shuffle", False):
            return None
        seed = self.cfg.data_loader_seed
        base = seed if seed is not None else self.megatron.seed
        return base * 1_000_003 + self.updates * 1_009 + epoch

    def _update(self, data, keys: list[str], make_loss_fn, metric_names: list[str]) -> dict[str, float]:
        """One update call: ppo_epochs x mini-batches of this dp rank, one optimizer step each.

        `make_loss_fn(mini)` gives the loss of one mini-batch. Returns the means over the optimizer steps of
        `metric_names`, `{role}/grad_norm` and `{role}/update_applied` (0 where a non-finite step was skipped), and
        where the time went (_phase_metrics).
        """
        plan = self.batch
        phases = Phases()
        self.updates += 1
        self._onload = overlap.Moved()
        self.engine.scheduler.step(1)  # this update runs at lr(step); warm-up starts above lr_warmup_init
        history: list[list[float]] = []
        begun = False
        for epoch in range(plan.ppo_epochs):
            for rows in mini_batch_rows(len(data), plan.mini_batch_per_dp, self._shuffle_seed(epoch)):
                mini = data[rows]
                mbs = self._micro_batches(mini, keys, plan.micro_batch_per_gpu,
                                          plan.max_token_len_per_gpu if plan.use_dynamic_bsz else None, training=True)
                loss_fn = make_loss_fn(mini)
                phases.mark("micro_batches")
                if not begun:  # after the inputs' copies and allocations: none of them queues behind the state's
                    self._begin_optimizer_onload()
                    phases.mark("onload_begin")
                    begun = True
                with self._routing(mini) as prepare:
                    per_micro, grad_norm, applied = self.engine.train_step(mbs, loss_fn, prepare,
                                                                           self._optimizer_on_device, phases)
                router = list(self.engine.router_losses.values())  # MoE models: load-balancing and z-loss
                history.append(self._rank_metrics(per_micro, metric_names) + [grad_norm, float(applied)] + router)
                phases.mark("metrics")
        names = metric_names + [f"{self.role}/grad_norm", f"{self.role}/update_applied"]
        names += [f"{self.role}/{k}" for k in self.engine.router_losses]
        out = {k: sum(h[i] for h in history) / len(history) for i, k in enumerate(names)}
        out[f"{self.role}/lr"] = self.engine.lr()
        out.update(self._phase_metrics(phases))
        out.update(self._onload_metrics())
        self._learn_onload_budget(phases)
        return out

    def _phase_metrics(self, phases: Phases) -> dict[str, float]:
        """timing_s/{role}_{phase}: micro_batches (mini-batch rows, micro-batching, the inputs' copies to the device,
        the loss's global sizes), onload_begin (the optimizer state sent for at the start), stream_wait (work the
        compute stream had queued before the step; MoE: the routing's set-up), forward_backward, onload_wait (the rest
        of the optimizer state, ~timing_s/optimizer_onload_exposed), optimizer_step, metrics (the per-micro-batch
        metrics to the host, once); they add up to timing_s/{role}_update, the whole call. On a GPU also
        memory/{role}_{counter}_{part}: the caching allocator's alloc_retries, cuda_mallocs and cuda_frees before
        the forward, during the forward/backward and after it (phases.py: why they matter)."""
        out = {f"timing_s/{self.role}_{name}": s for name, s in phases.seconds.items()}
        out[f"timing_s/{self.role}_update"] = phases.elapsed()
        if any(phases.counts.values()):
            for counter in COUNTERS:
                for part, names in UPDATE_PARTS.items():
                    out[f"memory/{self.role}_{counter}_{part}"] = float(phases.count(counter, names))
        return out

    def _learn_onload_budget(self, phases: Phases) -> None:
        """An overlapped onload whose forward/backward retried an allocation lost its overlap: send for less next
        time (overlap.OverlapBudget.observe)."""
        budget = self._onload_budget
        if budget is None:
            return
        retries = phases.count("alloc_retries", ("forward_backward",))
        step = budget.observe(self._onload.overlapped_bytes, retries)
        if step:
            log.warning("%s: the forward/backward retried %d allocations beside %.1f GiB of optimizer state sent for at "
                        "its start (each retry frees the allocator's cache and waits for the copies); keeping %.1f GiB "
                        "more free from the next update on (%.1f GiB in all)", self.role, retries,
                        self._onload.overlapped_bytes / 2**30, step / 2**30, budget.backoff / 2**30)

    @contextlib.contextmanager
    def _routing(self, data, measure: bool = False):
        """MoE policy: replay the rollout's routing (router_replay R3) and/or measure agreement with it;
        yields the engine's per-micro-batch `prepare` (None otherwise). Roles without routing: None."""
        routing = getattr(self, "routing", None)
        if routing is None:
            yield None
            return
        with routing.session(data, measure) as session:
            self._routing_session = session
            yield routing.prepare if session is not None else None

    def _mb_multiple(self) -> int:
        """The interleaved pipeline schedule needs a multiple of pp micro-batches."""
        return self.layout.pp if self.layout.vpp else 1

    def _micro_batches(self, data, keys: list[str], max_rows: Optional[int], max_tokens: Optional[int],
                       training: bool = False):
        """Micro-batches for this layout; under sequence parallelism (transformer-engine only) megatron
        splits the sequence over tp, so lengths are rounded to a multiple of tp, and FP8 GEMMs want token
        counts in multiples of 16. Token-budget micro-batches: every dp rank runs as many as the rank that
        needs the most, so the ranks' schedules stay in step. To train with virtual stages, at least 2*pp
        (engine.check_interleaved_count)."""
        config = self.engine.config
        seq_multiple = math.lcm(self.layout.tp if config.sequence_parallel else 1, 16 if config.fp8 else 1)
        min_count = 2 * self.layout.pp if training and self.layout.vpp else 1
        if max_tokens is not None:
            mine = len(split_tokens(row_lengths(data), max_tokens, self._mb_multiple(), min_count))
            min_count = max_over_dp(mine)
        return micro_batches(data, keys, max_rows, max_tokens, self._mb_multiple(), seq_multiple,
                             thd=self.remove_padding, min_count=min_count, cp=parallel.cp_rank_and_size())

    def _rank_metrics(self, per_micro: list[dict[str, torch.Tensor]], names: list[str]) -> list[float]:
        """Sum weighted per-micro-batch metrics on the last stage, then over dp; same values on every rank."""
        local = None
        if per_micro:
            local = torch.tensor(host_sums(per_micro, names), dtype=torch.float64)
        local = broadcast_from_last_stage(local, (len(names),), torch.float64)
        return sum_over_dp(local.tolist())

    def _gather_rows(self, per_micro: list[dict[str, torch.Tensor]], micro_batches, key: str,
                     shape: tuple[int, int]) -> torch.Tensor:
        """Reassemble a per-row output [B, R] from micro-batch results, on every pipeline stage."""
        out = None
        if per_micro:
            out = torch.zeros(shape, dtype=torch.float32)
            for mb, m in zip(micro_batches, per_micro):
                out[mb.rows] = m[key].detach().float().cpu()
        return broadcast_from_last_stage(out, shape, torch.float32).cpu()


def host_sums(per_micro: list[dict[str, Any]], names: list[str]) -> list[float]:
    """Per name, the sum over the micro-batches that have it of their values (device tensors or floats), in float64
    and in micro-batch order, with ONE device->host copy for all the tensors: a float() per value was a host
    synchronization each (about 150 for a 7B update of 29 micro-batches)."""
    flat = [(n, m[n]) for m in per_micro for n in names if n in m]
    tensors = [v.detach().reshape(()).to(torch.float64) for _, v in flat if isinstance(v, torch.Tensor)]
    host = iter(torch.stack(tensors).tolist() if tensors else [])
    sums = dict.fromkeys(names, 0.0)
    for n, v in flat:
        sums[n] += next(host) if isinstance(v, torch.Tensor) else float(v)
    return [sums[n] for n in names]


def _load_noting_rounding(rounded: list, param: torch.nn.Parameter, shard: torch.Tensor) -> None:
    """load_hf_weights' copy, noting the params whose dtype rounds the checkpoint's values."""
    if loses_precision(param, shard):
        rounded.append(param)
    with torch.no_grad():
        param.copy_(shard)


def _with_overrides(hf_config: Any, overrides: dict) -> Any:
    if not overrides:
        return hf_config
    cfg = copy.deepcopy(hf_config)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg
