"""Megatron model-parallel state of one worker process: groups, seeds and what the controller needs.

The caller (a Ray worker, torchrun, or a test) owns torch.distributed; `init_megatron` only builds
megatron's tp/pp/cp/dp groups on top of it. megatron-core keeps ONE layout per process, so a second
call with another layout is an error rather than a silent re-initialisation.
"""
from __future__ import annotations

import datetime
import os
from typing import Optional

import torch
import torch.distributed as dist

from hybridrl.adapters.base import DispatchInfo
from hybridrl.config.layout import ParallelLayout

from . import compat

_LAYOUT: Optional[ParallelLayout] = None


def ensure_process_group(timeout_s: float = 600.0) -> None:
    """Initialise torch.distributed from the torchrun environment if nobody has (tests, CLIs)."""
    if dist.is_initialized():
        return
    compat.apply()
    if "RANK" not in os.environ:
        # A lone process (e.g. the mcore-to-hf converter): a one-rank group on a free local port.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    _select_gpu()
    dist.init_process_group(backend=compat.dist_backend(), timeout=datetime.timedelta(seconds=timeout_s))


def init_megatron(layout: ParallelLayout, seed: int, timeout_s: Optional[float] = None) -> None:
    """Build megatron's parallel groups for `layout` and seed every RNG (torch.distributed must be up).

    The groups' collective timeout is `timeout_s`, by default the one the default process group was
    created with (trainer.dist_timeout_s in the workers): megatron's tp/pp/dp groups carry the gradient
    all-reduces, so a hung peer must fail them as soon as it fails the default group.
    Raises ValueError naming the mismatch when the world size differs from tp*pp*cp*dp, or when this
    process was already initialised with another layout.
    """
    global _LAYOUT
    if not dist.is_initialized():
        raise RuntimeError("init_megatron: torch.distributed is not initialised; the worker must call "
                           "torch.distributed.init_process_group first (or parallel.ensure_process_group)")
    compat.apply()  # before megatron's first import in this process (compat._import_megatron_without_compile)
    from megatron.core import parallel_state

    _check_world(layout)
    if _LAYOUT is not None:
        if _same_groups(_LAYOUT, layout):
            return
        raise ValueError(f"init_megatron: this process already runs layout {_describe(_LAYOUT)}; megatron-core keeps "
                         f"one layout per process, cannot switch to {_describe(layout)}")
    _select_gpu()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
        # megatron only builds timedelta(minutes=...) from it: a fraction keeps sub-minute timeouts
        distributed_timeout_minutes=(default_group_timeout_s() if timeout_s is None else timeout_s) / 60.0,
    )
    compat.install_memory_buffer()
    compat.without_transformer_engine()
    if layout.vpp:
        compat.fix_two_stage_interleaving()
    compat.model_parallel_seed(seed)
    _LAYOUT = layout


def destroy_megatron() -> None:
    """Tear down megatron's groups (tests that rebuild another layout in the same process)."""
    global _LAYOUT
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    _LAYOUT = None


def current_layout() -> ParallelLayout:
    if _LAYOUT is None:
        raise RuntimeError("megatron is not initialised in this process; call init_megatron(layout, seed) first")
    return _LAYOUT


def dispatch_info() -> DispatchInfo:
    """dp rank/size of this process; collect = tp rank 0 and cp rank 0 on the last pipeline stage."""
    from megatron.core import parallel_state as ps

    collect = (ps.get_tensor_model_parallel_rank() == 0 and ps.get_context_parallel_rank() == 0
               and ps.is_pipeline_last_stage(ignore_virtual=True))
    return DispatchInfo(dp_rank=ps.get_data_parallel_rank(), dp_size=ps.get_data_parallel_world_size(),
                        is_collect=collect)


def cp_rank_and_size() -> tuple[int, int]:
    from megatron.core import parallel_state as ps

    return ps.get_context_parallel_rank(), ps.get_context_parallel_world_size()


def layout_for(world_size: int, tp: int = 1, pp: int = 1, vpp: Optional[int] = None,
               dtype: str = "float32", sequence_parallel: bool = False, ep: int = 1,
               etp: Optional[int] = None) -> ParallelLayout:
    """A ParallelLayout from plain sizes (converters and tests; the trainer gets one from validate())."""
    if world_size % (tp * pp):
        raise ValueError(f"tp*pp = {tp}*{pp} does not divide the world size {world_size}")
    if (world_size // pp) % (ep * (etp or tp)):
        raise ValueError(f"ep*etp = {ep}*{etp or tp} does not divide the {world_size // pp} ranks of a pipeline stage")
    return ParallelLayout(world_size=world_size, tp=tp, pp=pp, cp=1, vpp=vpp, dp=world_size // (tp * pp),
                          sequence_parallel=sequence_parallel and tp > 1, dtype=dtype, ep=ep, etp=etp)


# ------------------------------------------------------------------------------------------ helpers
def default_group_timeout_s(fallback: float = 600.0) -> float:
    """The collective timeout of the default process group (torch keeps it on the backend's options)."""
    try:
        group = dist.distributed_c10d._get_default_group()
        device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
        return group._get_backend(device).options._timeout.total_seconds()
    except (AttributeError, RuntimeError, ValueError):  # private API: keep working if it moves
        return fallback


def _check_world(layout: ParallelLayout) -> None:
    world = dist.get_world_size()
    want = layout.tp * layout.pp * layout.cp * layout.dp
    if world != want:
        raise ValueError(f"init_megatron: torch.distributed has {world} ranks but the layout needs tp*pp*cp*dp = "
                         f"{layout.tp}*{layout.pp}*{layout.cp}*{layout.dp} = {want} (rank {dist.get_rank()})")


def _same_groups(a: ParallelLayout, b: ParallelLayout) -> bool:
    return (a.tp, a.pp, a.cp, a.vpp, a.dp, a.ep, a.expert_tp) == (b.tp, b.pp, b.cp, b.vpp, b.dp, b.ep, b.expert_tp)


def _describe(layout: ParallelLayout) -> str:
    return (f"tp={layout.tp} pp={layout.pp} cp={layout.cp} vpp={layout.vpp} dp={layout.dp} ep={layout.ep} "
            f"etp={layout.expert_tp}")


def _select_gpu() -> None:
    if compat.cuda_in_use():
        local = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        torch.cuda.set_device(local)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
