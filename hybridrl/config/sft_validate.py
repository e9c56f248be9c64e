"""The one validation pass of an SFT job: checks a built SFTConfig and derives the sizes the job needs.

It reuses RL's layout and engine checks (validate.py), so a Megatron layout that RL refuses is refused here with
the same message, under engine.* (verl's SFT key) instead of actor_rollout_ref.actor.megatron.*.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from .layout import BatchPlan, ParallelLayout, describe_machine
from .problems import Problems, choices
from .schema.sft import SFTConfig
from .validate import (
    DECAY_STYLES,
    LOGGERS,
    _check_transformer_impl,
    _check_transformer_overrides,
    _cuda_available,
    _device,
    _divisor_near,
    _layout,
    _te_available,
)

TRUNCATION = ("error", "left", "right")
NO_EFFECT = {"data.balance_dp_token": False, "data.use_shm": False, "trainer.default_hdfs_dir": None}


@dataclass(frozen=True)
class SFTDerived:
    device: str
    world_size: int
    layout: ParallelLayout
    batch: BatchPlan
    model_path: str  # model.path or model.partial_pretrain, whichever is set
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class SFTRun:
    """A validated SFT job: the frozen user config plus the derived sizes."""

    cfg: SFTConfig
    derived: SFTDerived

    def summary(self) -> str:
        d, c = self.derived, self.cfg
        a, b = d.layout, d.batch
        lines = [describe_machine(d.device, d.world_size, c.trainer), f"layout: {a.describe()}",
                 f"batch: {b.samples_per_step} sequences/step, {b.mini_batch_per_dp} per dp rank, "
                 f"{b.describe_micro_batches()}"]
        return "\n".join(lines + [f"note: {n}" for n in d.notes])


def validate_sft(cfg: SFTConfig, cuda_available: Optional[Callable[[], bool]] = None,
                 te_available: Optional[Callable[[], bool]] = None) -> SFTRun:
    """Check `cfg` and derive its sizes; raises ConfigError listing every problem, each naming its key."""
    cuda_available = cuda_available or _cuda_available
    te_available = te_available or _te_available
    p = Problems()
    device = _device(cfg, p, cuda_available)
    t = cfg.trainer
    world = max(t.nnodes, 1) * max(t.n_gpus_per_node, 1)
    layout = _layout("engine", cfg.engine, world, device, p)
    _check_transformer_overrides("engine", cfg.engine, p)
    _check_transformer_impl("engine", cfg.engine, device, te_available, p)
    model_path = _model_path(cfg, p)
    _check_data(cfg, p)
    _check_optim(cfg, p)
    _check_trainer(cfg, p)
    batch = _batch_plan(cfg, layout, p)
    for key, default in NO_EFFECT.items():
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) != default:
            p.notes.append(f"{key} is accepted for verl compatibility and has no effect")
    p.raise_if_any()
    return SFTRun(cfg, SFTDerived(device, world, layout, batch, model_path, tuple(p.notes)))


def _model_path(cfg: SFTConfig, p: Problems) -> str:
    m = cfg.model
    p.check(m.path is not None or m.partial_pretrain is not None,
            "model.path is not set (verl's fsdp SFT trainer calls it model.partial_pretrain); give the HF model folder")
    p.check(m.path is None or m.partial_pretrain is None or m.path == m.partial_pretrain,
            f"model.path={m.path} and model.partial_pretrain={m.partial_pretrain} differ; they are one setting: keep one")
    p.check(m.lora_rank == 0, f"model.lora_rank={m.lora_rank}: LoRA SFT is not supported yet; set it to 0")
    return os.path.expanduser(m.path or m.partial_pretrain or "")


def _check_data(cfg: SFTConfig, p: Problems) -> None:
    d = cfg.data
    p.check(bool(d.train_files), "data.train_files is empty; give one or more parquet/arrow/jsonl files")
    p.check(d.max_length >= 2, f"data.max_length={d.max_length} must be >= 2")
    choices("data.truncation", d.truncation, list(TRUNCATION), p)
    p.check(d.train_batch_size >= 1, f"data.train_batch_size={d.train_batch_size} must be >= 1")
    p.check((d.custom_cls.path is None) == (d.custom_cls.name is None),
            "data.custom_cls needs both path and name (a .py file and the class in it)")
    choices("data.pad_mode", d.pad_mode, ["right", "no_padding"], p)


def _check_optim(cfg: SFTConfig, p: Problems) -> None:
    o = cfg.optim
    p.check(o.lr >= 0, f"optim.lr={o.lr} must be >= 0")
    p.check(0 <= o.lr_warmup_steps_ratio <= 1, f"optim.lr_warmup_steps_ratio={o.lr_warmup_steps_ratio} must be in [0, 1]")
    choices("optim.lr_decay_style", o.lr_decay_style, list(DECAY_STYLES), p)
    choices("optim.optimizer", o.optimizer, ["adam", "sgd"], p)
    p.check(len(o.betas) == 2, "optim.betas must have two values")


def _check_trainer(cfg: SFTConfig, p: Problems) -> None:
    t = cfg.trainer
    p.check(t.nnodes >= 1 and t.n_gpus_per_node >= 1, "trainer.nnodes and trainer.n_gpus_per_node must be >= 1")
    p.check(t.total_epochs >= 1, f"trainer.total_epochs={t.total_epochs} must be >= 1")
    p.check(t.total_training_steps is None or t.total_training_steps >= 1, "trainer.total_training_steps must be null or >= 1")
    choices("trainer.resume_mode", t.resume_mode, ["auto", "disable", "resume_path"], p)
    p.check(t.resume_mode != "resume_path" or bool(t.resume_from_path),
            "trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N folder)")
    for name in t.logger:
        choices("trainer.logger", name, list(LOGGERS), p)
    choices("trainer.backend", t.backend, ["local", "ray"], p)
    p.check(t.max_ckpt_to_keep is None or t.max_ckpt_to_keep >= 1, "trainer.max_ckpt_to_keep must be null or >= 1")
    if t.backend == "local":
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        world = max(t.nnodes, 1) * max(t.n_gpus_per_node, 1)
        p.check(launched == world, f"trainer.backend=local runs one process per rank under torchrun, which started "
                                   f"{launched}, but trainer.nnodes * trainer.n_gpus_per_node = {world}: launch with "
                                   f"`torchrun --nproc_per_node={t.n_gpus_per_node} -m hybridrl.trainer.main_sft ...` "
                                   "or set trainer.backend=ray")


def _batch_plan(cfg: SFTConfig, layout: ParallelLayout, p: Problems) -> BatchPlan:
    d, dp = cfg.data, layout.dp
    micro = d.micro_batch_size_per_gpu
    if d.micro_batch_size is not None:
        ok = p.check(d.micro_batch_size % dp == 0,
                     f"data.micro_batch_size={d.micro_batch_size} (global) is not a multiple of dp={dp}; "
                     "set data.micro_batch_size_per_gpu instead")
        micro = d.micro_batch_size // dp if ok else micro
        p.notes.append("data.micro_batch_size is deprecated in verl; data.micro_batch_size_per_gpu is used as "
                       f"{micro} (data.micro_batch_size / dp)")
    per_dp = max(d.train_batch_size // dp, 1)
    ok = p.check(d.train_batch_size % dp == 0,
                 f"data.train_batch_size={d.train_batch_size} cannot be split evenly over dp={dp} ranks; make it a "
                 f"multiple of {dp}")
    accum = None
    if d.use_dynamic_bsz:
        p.check(d.max_token_len_per_gpu >= d.max_length,
                f"data.max_token_len_per_gpu={d.max_token_len_per_gpu} is below data.max_length={d.max_length}; "
                "raise it")
    elif p.check(micro >= 1, f"data.micro_batch_size_per_gpu={micro} must be >= 1") and ok:
        if p.check(per_dp % micro == 0,
                   f"data.micro_batch_size_per_gpu={micro} does not divide the {per_dp} sequences each rank gets "
                   f"per step (data.train_batch_size / dp = {d.train_batch_size}/{dp}); e.g. set it to "
                   f"{_divisor_near(per_dp, micro)}"):
            accum = per_dp // micro
    p.check(not layout.vpp or per_dp >= 2 * layout.pp,
            f"engine.virtual_pipeline_model_parallel_size={layout.vpp}: megatron-core's interleaved schedule trains on "
            f"a multiple of pp={layout.pp} micro-batches and hangs on exactly {layout.pp}, so each rank needs at least "
            f"{2 * layout.pp} sequences per step but gets {per_dp}; raise data.train_batch_size to >= "
            f"{2 * layout.pp * dp} or unset engine.virtual_pipeline_model_parallel_size")
    return BatchPlan(samples_per_step=d.train_batch_size, mini_batch_samples=d.train_batch_size,
                     mini_batches_per_epoch=1, ppo_epochs=1, mini_batch_per_dp=per_dp,
                     micro_batch_per_gpu=None if d.use_dynamic_bsz else micro, grad_accum=accum,
                     use_dynamic_bsz=d.use_dynamic_bsz, max_token_len_per_gpu=d.max_token_len_per_gpu,
                     forward_micro_batch_per_gpu=micro, forward_max_token_len_per_gpu=d.max_token_len_per_gpu)
