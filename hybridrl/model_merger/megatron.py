"""HF <-> megatron checkpoint conversion (CPU, gloo), built on the adapter's one weight mapping.

    hf_to_mcore(hf_dir, out, tp, pp)   T*P spawned processes each read only their shards from the HF
                                       safetensors and save them as a model-only dist checkpoint
                                       (MoE models: experts spread over ep ranks, split over etp;
                                       *ForTokenClassification / *ForSequenceClassification: with the
                                       value head `score`, a critic checkpoint)
    mcore_to_hf(ckpt_dir, out)          one process loads the dist checkpoint (any saved layout) at
                                       tp=pp=1, streams HF tensors through export_hf_weights and
                                       writes safetensors + config + tokenizer files
Both check their inputs first and fail with the path or field to fix.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import sys
import time
from typing import Any, Optional

import torch

from hybridrl.utils.net import free_port

PREFIX = "[convert]"
LORA_DIR = "lora_adapter"  # merge of a LoRA checkpoint: the PEFT adapter next to the merged model


def log(msg: str) -> None:
    print(f"{PREFIX} {msg}", flush=True)


@dataclasses.dataclass
class ConvertedModel:
    """The parts of a role that checkpoint.save/load use, for a bare model (no optimizer)."""

    engine: Any
    arch: Any
    layout: Any
    hf_path: str
    hf_config: Any
    value_head: bool = False
    head_bias: bool = False  # the value head has score.bias (a critic from a *ForTokenClassification folder)
    role: str = "actor"
    updates: int = 0
    megatron: Any = None
    lora: Any = None  # a LoRA checkpoint's adapters.lora.LoraSpec (the checkpoint holds the adapters only)


# ------------------------------------------------------------------------------------------ HF -> mcore
def hf_to_mcore(hf_dir: str, out: str, tp: int, pp: int, timeout_s: float = 3600.0, ep: int = 1,
                etp: Optional[int] = None) -> None:
    """Convert an HF folder into a model-only megatron dist checkpoint saved from a tp x pp (x ep) layout."""
    from hybridrl.adapters.megatron.hf_config import arch_from_hf, check_expert_layout, check_layout
    from hybridrl.adapters.megatron.hf_io import SafetensorsReader

    hf_dir = os.path.abspath(os.path.expanduser(hf_dir))
    arch = arch_from_hf(hf_dir)  # FileNotFoundError / UnsupportedModelError name the file or field
    check_layout(arch, tp, pp, None, names=("--tp", "--pp", "--vpp"))  # heads, kv heads, layers must divide
    check_expert_layout(arch, tp, ep, etp, names=("--ep", "--etp"))
    reader = SafetensorsReader(hf_dir)  # weights present and indexed
    value_head, head_bias = score_head(hf_dir)
    missing = [n for n in ("score.weight", "score.bias")[:1 + head_bias] if value_head and not reader.has(n)]
    if missing:  # the trainer would start such a head fresh; a conversion must not invent weights
        raise FileNotFoundError(f"{hf_dir}: config.json names a score-head model but its safetensors lack "
                                f"{', '.join(missing)}")
    if os.path.isdir(out) and os.listdir(out):
        raise FileExistsError(f"--out {out} exists and is not empty; choose a new folder")
    world = pp * math.lcm(tp, ep * (etp or tp))  # a stage's experts may span data-parallel ranks
    log(f"{hf_dir} ({arch.model_type}, {arch.num_layers} layers"
        + (", value head score" + (" with bias" if head_bias else "") if value_head else "")
        + f") -> {out} at tp={tp} pp={pp}" + (f" ep={ep} etp={etp or tp}" if arch.is_moe else "") + f": {world} processes")
    start = time.time()
    import torch.multiprocessing as mp

    port = free_port("127.0.0.1")
    ctx = mp.start_processes(_hf_to_mcore_rank, args=(world, port, hf_dir, out, tp, pp, ep, etp, value_head, head_bias),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.time() + timeout_s
    while not ctx.join(timeout=5):
        if time.time() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            raise TimeoutError(f"hf-to-mcore did not finish in {timeout_s:.0f}s")
    log(f"done in {time.time() - start:.1f}s: {out}")


def score_head(hf_dir: str) -> tuple[bool, bool]:
    """(value head, its bias) of an HF folder: a *ForTokenClassification / *ForSequenceClassification model (a critic
    or reward model, verl's critic format) converts with its `score` head, which a causal LM's mapping would drop;
    the reward model's check refuses num_labels != 1."""
    from hybridrl.adapters.megatron.hf_config import load_hf_config
    from hybridrl.adapters.megatron.reward_model import SCORE_ARCHITECTURES, score_head_bias

    cfg = load_hf_config(hf_dir)
    if not any(a.endswith(SCORE_ARCHITECTURES) for a in getattr(cfg, "architectures", None) or []):
        return False, False
    return True, score_head_bias(cfg, hf_dir, key="--hf-dir")


def _hf_to_mcore_rank(rank: int, world: int, port: int, hf_dir: str, out: str, tp: int, pp: int, ep: int,
                      etp: Optional[int], value_head: bool = False, head_bias: bool = False) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    from hybridrl.adapters.megatron import checkpoint, compat, parallel
    from hybridrl.adapters.megatron.builder import build_model
    from hybridrl.adapters.megatron.engine import Engine
    from hybridrl.adapters.megatron.hf_config import arch_from_hf, load_hf_config
    from hybridrl.adapters.megatron.weights import load_hf_weights
    from hybridrl.config.schema.common import MegatronConfig

    compat.apply(force_cpu=True)
    parallel.ensure_process_group(timeout_s=1800)
    hf_config = load_hf_config(hf_dir)
    arch = dataclasses.replace(arch_from_hf(hf_config), source=hf_dir)
    # sequence_parallel: MoE models with tp > 1 need it to train (builder.py); it changes no weight
    layout = parallel.layout_for(world, tp=tp, pp=pp, ep=ep, etp=etp, sequence_parallel=arch.is_moe)
    parallel.init_megatron(layout, seed=0)
    chunks = build_model(arch, layout, value_head=value_head, overrides={"perform_initialization": False},
                         head_bias=head_bias)
    n = load_hf_weights(chunks, hf_dir, arch, layout, value_head=value_head, head_bias=head_bias)
    from megatron.core import parallel_state as ps

    where = f"tp rank {ps.get_tensor_model_parallel_rank()}, pp stage {ps.get_pipeline_model_parallel_rank()}"
    if arch.is_moe:
        where += f", ep rank {ps.get_expert_model_parallel_rank()}"
    print(f"{PREFIX} rank {rank}: read {n} tensors for {where}", flush=True)
    model = ConvertedModel(Engine(chunks, layout), arch, layout, hf_dir, hf_config, value_head=value_head,
                           head_bias=head_bias, role="critic" if value_head else "actor",
                           megatron=MegatronConfig(use_distributed_optimizer=False))
    checkpoint.save(out, model)
    if rank == 0:
        log(f"saved dist checkpoint to {out}")
    torch.distributed.destroy_process_group()


# ------------------------------------------------------------------------------------------ mcore -> HF
def mcore_to_hf(ckpt_dir: str, out: str, hf_config_dir: Optional[str] = None, bucket_bytes: int = 1 << 30) -> None:
    """Write the model of a hybridrl megatron checkpoint as an HF folder (safetensors + config + tokenizer)."""
    from hybridrl.adapters.megatron import checkpoint, compat, lora, parallel
    from hybridrl.adapters.megatron.builder import DTYPES, build_model
    from hybridrl.adapters.megatron.engine import Engine
    from hybridrl.adapters.megatron.hf_config import arch_from_hf, load_hf_config
    from hybridrl.adapters.megatron.hf_io import SafetensorsWriter, copy_side_files
    from hybridrl.adapters.megatron.weights import export_hf_weights
    from hybridrl.config.schema.common import MegatronConfig
    from hybridrl.trainer.checkpoint_files import DamagedCheckpointError, check_part

    ckpt_dir = os.path.abspath(os.path.expanduser(ckpt_dir))
    check_part(ckpt_dir)  # a trainer step records its files: a truncated one is named here, not met as EOFError
    meta = checkpoint.read_meta(ckpt_dir)
    config_dir = hf_config_dir or os.path.join(ckpt_dir, "huggingface")
    _check_checkpoint_files(ckpt_dir, meta, config_dir)
    compat.apply(force_cpu=True)
    parallel.ensure_process_group(timeout_s=1800)
    layout = parallel.layout_for(1)
    parallel.init_megatron(layout, seed=0)
    hf_config = load_hf_config(config_dir)
    arch = dataclasses.replace(arch_from_hf(hf_config), source=config_dir)
    saved = meta["layout"]
    log(f"{ckpt_dir}: {meta['role']} step {meta['step']}, saved at tp={saved['tp']} pp={saved['pp']} "
        f"dp={saved['dp']}; loading at tp=1 pp=1")
    head_bias = bool(meta.get("head_bias", False))  # absent from checkpoints written before it was recorded
    chunks = build_model(arch, layout, value_head=meta["value_head"], overrides={"perform_initialization": False},
                         head_bias=head_bias)
    spec = _lora_base(chunks, arch, layout, meta, ckpt_dir, hf_config_dir)
    model = ConvertedModel(Engine(chunks, layout), arch, layout, config_dir, hf_config, value_head=meta["value_head"],
                           head_bias=head_bias, role=meta["role"], megatron=MegatronConfig(use_distributed_optimizer=False),
                           lora=spec)
    try:
        checkpoint.load(ckpt_dir, model)
    except (EOFError, RuntimeError, OSError, ValueError) as e:  # no manifest to name the file (e.g. hf-to-mcore's)
        raise DamagedCheckpointError(f"{ckpt_dir}/dist could not be read ({type(e).__name__}: {e}); a file in it is "
                                     "truncated or damaged") from e
    if os.path.isdir(out) and os.listdir(out):
        raise FileExistsError(f"--target_dir/--out {out} exists and is not empty; choose a new folder")
    writer = SafetensorsWriter(out, dtype=DTYPES[meta.get("hf_dtype", "float32")])
    written = 0
    merged = lora.merged_params(model.engine.chunks) if spec is not None else None  # base + adapters
    for bucket in export_hf_weights(model.engine.chunks, arch, layout, bucket_bytes, value_head=meta["value_head"],
                                    params=merged, head_bias=head_bias):
        writer.write(bucket)
        written += len(bucket)
        log(f"wrote {written} tensors ({writer.total_bytes / 2**20:.1f} MiB)")
    writer.close()
    copied = copy_side_files(config_dir, out)
    if spec is not None:
        from hybridrl.adapters.megatron.lora_io import write_peft_adapter

        names = write_peft_adapter(model.engine.chunks, arch, layout, spec, os.path.join(out, LORA_DIR), meta["hf_source"])
        log(f"wrote the PEFT adapter ({len(names)} tensors, r={spec.rank}) to {os.path.join(out, LORA_DIR)}")
    log(f"done: {out} ({', '.join(copied)})")


def _lora_base(chunks: list, arch: Any, layout: Any, meta: dict, ckpt_dir: str, hf_model_path: Optional[str]) -> Any:
    """A LoRA checkpoint holds the adapters only: load the frozen base from the HF folder it was trained from
    (--hf_model_path if it holds weights, else meta.json's hf_source) and add the adapters; None otherwise."""
    from hybridrl.adapters.megatron import lora
    from hybridrl.adapters.megatron.weights import load_hf_weights

    saved = meta.get("lora")
    if not saved:
        return None
    candidates = [p for p in (hf_model_path, meta.get("hf_source")) if p]
    base = next((p for p in candidates if glob.glob(os.path.join(os.path.expanduser(p), "*.safetensors"))), None)
    if base is None:
        raise FileNotFoundError(f"{ckpt_dir} is a LoRA checkpoint (adapters only); its base model "
                                f"{meta.get('hf_source')} has no *.safetensors here: pass --hf_model_path with the "
                                "base HF folder")
    load_hf_weights(chunks, base, arch, layout)
    spec = lora.LoraSpec(int(saved["rank"]), float(saved["alpha"]), tuple(saved["targets"]))
    lora.attach(chunks, arch, layout, spec, seed=0)  # values come from the checkpoint
    log(f"LoRA checkpoint: base weights from {base}, r={spec.rank} alpha={spec.alpha} on {', '.join(spec.targets)}")
    return spec


def _check_checkpoint_files(ckpt_dir: str, meta: dict, config_dir: str) -> None:
    """Missing pieces or a folder whose files do not match meta.json -> an error naming the path."""
    if not os.path.isfile(os.path.join(config_dir, "config.json")):
        raise FileNotFoundError(f"{config_dir}/config.json is missing; pass --hf_model_path with the original "
                                "HF folder")
    dist_meta = os.path.join(ckpt_dir, "dist", "metadata.json")
    if not os.path.isfile(dist_meta):
        raise FileNotFoundError(f"{dist_meta} is missing: the dist checkpoint was not written completely")
    rng_dir = os.path.join(ckpt_dir, "rng")
    if os.path.isdir(rng_dir):
        ranks = len([f for f in os.listdir(rng_dir) if f.startswith("rank_")])
        saved = meta["layout"]
        if ranks != saved["world_size"]:
            raise ValueError(f"{ckpt_dir}/meta.json claims a layout of {saved['world_size']} ranks (tp={saved['tp']} "
                             f"pp={saved['pp']} dp={saved['dp']}) but {rng_dir} holds {ranks} rank files: the folder "
                             "mixes files from different saves")
    with open(os.path.join(config_dir, "config.json")) as f:
        cfg = json.load(f)
    for field, key in (("num_hidden_layers", "num_layers"), ("hidden_size", "hidden_size"),
                       ("vocab_size", "vocab_size")):
        if field in cfg and cfg[field] != meta["arch"][key]:
            raise ValueError(f"{config_dir}/config.json has {field}={cfg[field]} but the checkpoint was saved with "
                             f"{meta['arch'][key]}; pass the HF config of the trained model")


if __name__ == "__main__":  # pragma: no cover - use the CLIs
    sys.exit("use `python -m hybridrl convert ...` or `python -m hybridrl.model_merger merge ...`")
