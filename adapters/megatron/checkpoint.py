"""Role checkpoints with megatron dist_checkpointing, loadable into another tp/pp/vpp/dp layout.

Folder layout (one per role, e.g. CKPT/global_step_10/actor):
    meta.json          format/version, role, step, optimizer steps, LR-scheduler state, layout it was
                       saved from, the ModelArch and the full HF config
    dist/              megatron dist_checkpointing (torch_dist): "model" (+ "optimizer")
    rng/rank_XXXXX.safetensors
                       RNG states of each rank: the torch (and CUDA) generator states, the megatron
                       tracker states and numpy's MT19937 key as tensors; python's random state and
                       numpy's pos/has_gauss/cached_gaussian as JSON in the file's metadata (no pickle:
                       loading a checkpoint must not run code; older rank_XXXXX.pt files are ignored)
    huggingface/       config.json + tokenizer files copied from the HF folder (for the merger)
Model tensors are keyed by GLOBAL layer index (megatron's sharded_state_dict), and all chunks of a
rank go under one "model" entry, so the same files load at any tp/pp/vpp (the padded vocab size is
layout-independent, see hf_config.VOCAB_PAD_MULTIPLE). The distributed optimizer is saved with
"fully_reshardable" sharding. RNG states only make sense for the same layout and are skipped
(with a log line) otherwise.

Step-counter pitfall (megatron-core 0.16.1 with torch Adam, see the CPU notes): after loading, the
distributed optimizer resets Adam's per-parameter `step` and makes all parameters share ONE step
tensor (so it advances once per parameter per update). We save the true optimizer step count in
meta.json and give every parameter its own step tensor with that value after loading.
Saving is synchronous: megatron forks short-lived writer processes (one per write bucket) that end with
the save; no process outlives it (see _in_process_writer_queue for why that matters).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from . import compat, lora_io
from .builder import unwrap
from .hf_io import copy_side_files

log = logging.getLogger(__name__)

FORMAT = "hybridrl-megatron"
VERSION = 1
OPTIM_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}
RNG_SUFFIX = ".safetensors"
RNG_FORMAT = "hybridrl-rng-v1"


def save(path: str, role: Any) -> None:
    """Collective: every rank of the role calls it with the same path."""
    from megatron.core import dist_checkpointing

    dist_dir = os.path.join(path, "dist")
    if dist.get_rank() == 0:
        os.makedirs(dist_dir, exist_ok=True)
        os.makedirs(os.path.join(path, "rng"), exist_ok=True)
    dist.barrier()
    engine = role.engine
    sharded = {"model": _model_sharded(role)}
    if engine.optimizer is not None:
        # No update applied yet (e.g. every step so far skipped as non-finite): torch Adam has no state,
        # and megatron's distributed optimizer cannot save that (it asserts on the missing step count).
        # The state torch would create at the first step (step 0, zero moments) saves and loads fine.
        _init_adam_state(engine.optimizer)
        sharded["optimizer"] = engine.optimizer.sharded_state_dict(sharded["model"], is_loading=False,
                                                                   metadata=OPTIM_METADATA)
    _in_process_writer_queue()
    dist_checkpointing.save(sharded, dist_dir)
    save_rng_state(os.path.join(path, "rng", f"rank_{dist.get_rank():05d}{RNG_SUFFIX}"))
    if dist.get_rank() == 0:
        _write_meta(path, role)
        copy_side_files(role.hf_path, os.path.join(path, "huggingface"))
    dist.barrier()


def load(path: str, role: Any) -> None:
    """Collective: restore model (+ optimizer, scheduler, counters, RNG when the layout matches)."""
    from megatron.core import dist_checkpointing

    meta = read_meta(path)
    check_compatible(meta, role, path)
    engine = role.engine
    sharded = {"model": _model_sharded(role)}
    with_optim = engine.optimizer is not None and meta["has_optimizer"]
    if with_optim:
        _init_adam_state(engine.optimizer)
        sharded["optimizer"] = engine.optimizer.sharded_state_dict(sharded["model"], is_loading=True,
                                                                   metadata=OPTIM_METADATA)
    elif engine.optimizer is not None:
        log.warning("%s has no optimizer state: loading the model only (optimizer starts fresh)", path)
    state = dist_checkpointing.load(sharded, os.path.join(path, "dist"))
    if _lora(role) is not None:
        lora_io.load_state_dict(engine.chunks, state["model"])
    for i, chunk in enumerate(engine.chunks if _lora(role) is None else []):
        unwrap(chunk).load_state_dict(state["model"][f"chunk{i}"], strict=True)
    if with_optim:
        _load_optimizer(engine.optimizer, state["optimizer"])
        _set_adam_steps(engine.optimizer, meta["optimizer_steps"])
        engine.optimizer_steps = meta["optimizer_steps"]
    elif engine.optimizer is not None:
        engine.optimizer.reload_model_params()
    if engine.scheduler is not None and meta.get("scheduler"):
        engine.scheduler.load_state_dict(meta["scheduler"])
    role.updates = meta["step"]
    _maybe_load_rng(path, meta)
    dist.barrier()


def read_meta(path: str) -> dict:
    meta_path = os.path.join(path, "meta.json")
    if not os.path.isfile(meta_path):
        raise FileNotFoundError(f"{path}: no meta.json; not a hybridrl megatron checkpoint (expected meta.json, "
                                "dist/, rng/, huggingface/)")
    with open(meta_path) as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT or meta.get("version", 0) > VERSION:
        raise ValueError(f"{meta_path}: format {meta.get('format')!r} version {meta.get('version')} is not "
                         f"{FORMAT!r} <= {VERSION}")
    if not os.path.isdir(os.path.join(path, "dist")):
        raise FileNotFoundError(f"{path}/dist is missing: the checkpoint is incomplete")
    return meta


def check_compatible(meta: dict, role: Any, path: str) -> None:
    """The checkpoint's architecture must equal the role's; the layout may differ."""
    saved = meta["arch"]
    mine = {k: v for k, v in dataclasses.asdict(role.arch).items() if k not in ("source", "hf_dtype")}
    diff = [f"{k}: checkpoint {saved.get(k)!r} vs model {v!r}" for k, v in mine.items()
            if _jsonable(v) != saved.get(k)]
    if diff:
        raise ValueError(f"{path}: checkpoint architecture differs from {role.arch.source}: " + "; ".join(diff))
    saved_lora, mine_lora = meta.get("lora"), _lora_meta(role)
    if saved_lora != mine_lora:
        raise ValueError(f"{path}: saved with LoRA {saved_lora} but this actor has {mine_lora}; resume with the same "
                         "actor_rollout_ref.model.lora_rank, lora_alpha and target_modules")
    if meta["value_head"] != role.value_head:
        kind = "critic (value head)" if meta["value_head"] else "language model"
        raise ValueError(f"{path}: is a {kind} checkpoint; it cannot load into the {role.role}")
    saved_bias, mine_bias = bool(meta.get("head_bias", False)), bool(getattr(role, "head_bias", False))
    if meta["value_head"] and saved_bias != mine_bias:
        has = {True: "with", False: "without"}
        raise ValueError(f"{path}: the value head was saved {has[saved_bias]} a bias (score.bias), this {role.role} "
                         f"from {role.arch.source} has one {has[mine_bias]} (a *ForTokenClassification folder's head "
                         "has a bias); resume from the model folder the checkpoint was trained from")
    mine_do = role.megatron.use_distributed_optimizer
    if role.engine.optimizer is not None and meta["has_optimizer"] and meta["distributed_optimizer"] != mine_do:
        raise ValueError(f"{path}: optimizer state was saved with use_distributed_optimizer="
                         f"{meta['distributed_optimizer']}; resume with the same *.megatron.use_distributed_optimizer "
                         f"(now {mine_do}): the two optimizers store their state differently")
    padded = role.arch.padded_vocab(role.layout.tp)
    if meta["padded_vocab"] != padded:
        raise ValueError(f"{path}: saved with padded vocab {meta['padded_vocab']} (tp={meta['layout']['tp']}); "
                         f"this layout pads to {padded} (tp={role.layout.tp}); use a tp that is a power of two. "
                         f"Checkpoints written before the padding became a multiple of 64 (was 1024) do not load: "
                         f"start again from the HF folder")


# ------------------------------------------------------------------------------------------ pieces
def _model_sharded(role: Any) -> dict:
    """The model's sharded tensors; under LoRA the adapters only (keyed by PEFT name): the frozen base is the
    HF folder's, recorded in meta.json (lora.base)."""
    engine = role.engine
    if _lora(role) is not None:
        return lora_io.sharded_state_dict(engine.chunks, role.arch, role.layout, role.lora)
    return {f"chunk{i}": unwrap(c).sharded_state_dict() for i, c in enumerate(engine.chunks)}


def _lora(role: Any) -> Any:
    return getattr(role, "lora", None)


def _lora_meta(role: Any) -> Any:
    spec = _lora(role)
    return None if spec is None else {"rank": spec.rank, "alpha": spec.alpha, "targets": list(spec.targets)}


def _write_meta(path: str, role: Any) -> None:
    layout = role.layout
    engine = role.engine
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "role": role.role,
        "step": role.updates,
        "optimizer_steps": getattr(engine, "optimizer_steps", 0),
        "has_optimizer": engine.optimizer is not None,
        "distributed_optimizer": role.megatron.use_distributed_optimizer and engine.optimizer is not None,
        "scheduler": engine.scheduler.state_dict() if engine.scheduler is not None else None,
        "value_head": role.value_head,
        "head_bias": bool(getattr(role, "head_bias", False)),  # the value head has score.bias (mcore_to_hf builds it)
        "layout": {"world_size": layout.world_size, "tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp,
                   "dp": layout.dp, "dtype": layout.dtype},
        "padded_vocab": role.arch.padded_vocab(layout.tp),
        "arch": {k: _jsonable(v) for k, v in dataclasses.asdict(role.arch).items() if k not in ("source", "hf_dtype")},
        "hf_dtype": role.arch.hf_dtype,
        "hf_source": str(role.hf_path),
        "lora": _lora_meta(role),  # the base weights of a LoRA checkpoint are hf_source's
        "hf_config": role.hf_config.to_dict(),
    }
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, default=str)


def _jsonable(v: Any) -> Any:
    return json.loads(json.dumps(v, default=str)) if isinstance(v, (dict, list, tuple)) else v


def _in_process_writer_queue() -> None:
    """Give megatron's checkpoint writer a plain in-process results queue instead of a Manager's.

    megatron collects write results through a multiprocessing Manager().Queue(), i.e. a manager
    PROCESS that lives as long as this worker. Started with "spawn" (megatron's choice) it re-imports
    __main__ (5-10 s per saving rank); started with "fork" it inherits this worker's sockets: its Ray
    connection and its gloo connections to the other ranks. Then a worker that dies (kill -9, OOM) is
    not seen as dead by Ray or by its peers, whose collectives wait for the full timeout, and the
    orphaned manager outlives everything. Our saves are synchronous (no async_sharded_save): the
    writer puts its results into the queue in this very process, so a queue.Queue serves and no
    process is needed at all.
    """
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not isinstance(getattr(filesystem_async, "_results_queue", None), queue.Queue):
        filesystem_async._results_queue = queue.Queue()


def _load_optimizer(optimizer: Any, state: dict) -> None:
    """optimizer.load_state_dict, working around megatron-core 0.16.1's fully_reshardable loader.

    Its DistributedOptimizer copies every entry of the torch Adam state from the loaded tensors but
    the checkpoint (rightly) has no per-parameter `step` there: KeyError. So the parameter state is
    loaded in a second call after the `step` entries are taken out; _set_adam_steps restores them.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    subs = getattr(optimizer, "chained_optimizers", [optimizer])
    states = [state] if len(subs) == 1 else [v for _, v in sorted(state.items())]
    for opt, st in zip(subs, states):
        if not (isinstance(opt, DistributedOptimizer) and st.get("param_state_sharding_type") == "fully_reshardable"):
            opt.load_state_dict(st)
            continue
        st = dict(st)
        param_state = st.pop("param_state")
        st.pop("param_state_sharding_type")
        opt.load_state_dict(st)
        for per_param in opt.optimizer.state.values():
            per_param.pop("step", None)
        opt.load_parameter_state_from_fully_reshardable(param_state)


def _init_adam_state(optimizer: Any) -> None:
    """Allocate empty Adam state (as torch would at the first step): megatron's loaders expect it."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if not isinstance(inner, torch.optim.Adam):
            continue
        for group in inner.param_groups:
            for p in group["params"]:
                st = inner.state[p]
                if not st:
                    st["step"] = torch.tensor(0.0)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _set_adam_steps(optimizer: Any, steps: int) -> None:
    """One `step` tensor per parameter (torch's float32 CPU scalar), holding the true step count."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if not isinstance(inner, torch.optim.Adam):
            continue
        for st in inner.state.values():
            if st:
                st["step"] = torch.tensor(float(steps), dtype=torch.float32)


def _rng_state() -> dict:
    from megatron.core.tensor_parallel import random as mrandom

    tracker = mrandom.get_cuda_rng_tracker()
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if compat.cuda_in_use() else None,
        "tracker": {k: v.clone() for k, v in tracker.get_states().items()},
    }


def save_rng_state(file: str, state: dict | None = None) -> None:
    """This rank's RNG states as one safetensors file: tensors as tensors, the rest as JSON metadata."""
    from safetensors.torch import save_file

    state = _rng_state() if state is None else state
    kind, key, pos, has_gauss, cached_gaussian = state["numpy"]
    tensors = {"torch": state["torch"], "numpy_key": torch.from_numpy(np.asarray(key, dtype=np.int64))}
    if state["cuda"] is not None:
        tensors["cuda"] = state["cuda"]
    names = sorted(state["tracker"])
    for i, name in enumerate(names):
        tensors[f"tracker.{i}"] = state["tracker"][name]
    version, internal, gauss_next = state["python"]
    meta = {"format": RNG_FORMAT, "python": [version, list(internal), gauss_next], "tracker": names,
            "numpy": {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss),
                      "cached_gaussian": float(cached_gaussian)}}
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, file,
              metadata={"hybridrl": json.dumps(meta)})


def load_rng_state(file: str) -> dict:
    """The dict save_rng_state wrote (the same shape as _rng_state())."""
    from safetensors import safe_open

    with safe_open(file, framework="pt") as f:
        header = (f.metadata() or {}).get("hybridrl")
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta = json.loads(header) if header else {}
    if meta.get("format") != RNG_FORMAT:
        raise ValueError(f"{file}: not a hybridrl RNG state file (format {meta.get('format')!r}, "
                         f"expected {RNG_FORMAT!r})")
    version, internal, gauss_next = meta["python"]
    n = meta["numpy"]
    key = tensors["numpy_key"].numpy().astype(np.uint32)
    return {
        "python": (version, tuple(internal), gauss_next),
        "numpy": (n["kind"], key, n["pos"], n["has_gauss"], n["cached_gaussian"]),
        "torch": tensors["torch"],
        "cuda": tensors.get("cuda"),
        "tracker": {name: tensors[f"tracker.{i}"] for i, name in enumerate(meta["tracker"])},
    }


def _maybe_load_rng(path: str, meta: dict) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import random as mrandom

    saved = meta["layout"]
    same = (saved["world_size"] == dist.get_world_size() and saved["tp"] == ps.get_tensor_model_parallel_world_size()
            and saved["pp"] == ps.get_pipeline_model_parallel_world_size())
    stem = os.path.join(path, "rng", f"rank_{dist.get_rank():05d}")
    if same and not os.path.isfile(stem + RNG_SUFFIX) and os.path.isfile(stem + ".pt"):
        log.warning("%s.pt: RNG state in the old pickle format is not loaded (unpickling can run code); RNG "
                    "streams continue from the seed instead", stem)
        return
    if not same or not os.path.isfile(stem + RNG_SUFFIX):
        log.info("%s: layout differs from the saved one (or no RNG file): RNG states not restored", path)
        return
    state = load_rng_state(stem + RNG_SUFFIX)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and compat.cuda_in_use():
        torch.cuda.set_rng_state(state["cuda"])
    mrandom.get_cuda_rng_tracker().set_states(state["tracker"])
