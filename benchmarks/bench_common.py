"""Helpers the benchmark scripts share (a worker in this process, prompts, the device-copy bandwidth, log-prob gaps
between engines). Only the scripts import this module, and it imports none of them: no script imports another's
internals any more (issue 36: gap_bench, hybrid_bench and multi_gpu_bench imported each other)."""
from __future__ import annotations

import json
import os
import time


# ------------------------------------------------------------------------------------------ results files
def write_result(out: str, record: dict, markdown: str) -> str:
    """A results record as `out` (JSON) and its Markdown beside it (same name, .md); returns the .md's path."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    md = os.path.splitext(out)[0] + ".md"
    with open(md, "w") as f:
        f.write(markdown)
    return md


# ------------------------------------------------------------------------------------------ prompts and a worker
def prompt_ids(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab - 100, (n, length), generator=g).tolist()


def vocab_of(model_dir: str) -> int:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)["vocab_size"]


def make_prompts(n: int, length: int, vocab: int) -> "DataProto":  # noqa: F821
    """n random prompts of `length` ids below `vocab` (the peers' prompts), one sample each."""
    import numpy as np
    import torch

    from hybridrl.protocol import DataProto

    ids = torch.tensor(prompt_ids(n, length, vocab))
    mask = torch.ones_like(ids)
    pos = torch.arange(length).expand_as(ids).clone()
    # n=1 sample per prompt so the token count equals the standalone run's
    meta = {"step": 1, "validate": False}
    proto = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                                {"uid": np.array([str(i) for i in range(len(ids))], dtype=object)}, meta)
    return proto


def start_worker(overrides: list[str], model_dir: str, cpu: bool = False, max_rollout_rows: int | None = None) -> tuple:
    """The real role worker (actor + colocated rollout engine) as rank 0 of 1, in this process:
    (worker, the overrides it was built with, init_model's report). cpu: the torch engine on gloo."""
    from hybridrl.config import load_config, validate
    from hybridrl.utils.net import free_port
    from hybridrl.workers import ActorRolloutRefWorker

    port = free_port("127.0.0.1")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if cpu:
        overrides = overrides + ["trainer.device=cpu", "actor_rollout_ref.rollout.name=torch"]
    run = validate(load_config(overrides))
    worker = ActorRolloutRefWorker(run, model_dir, total_training_steps=10, max_rollout_rows=max_rollout_rows)
    return worker, overrides, worker.init_model()



# ------------------------------------------------------------------------------------------ floors and gaps
def d2d_bandwidth(device: str = "cuda", nbytes: int = 1 << 30) -> float:
    """Bytes per second of one device-to-device copy (each byte read once and written once)."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    sync()
    start = time.perf_counter()
    reps = 10
    for _ in range(reps):
        y.copy_(x)
    sync()
    return nbytes * reps / (time.perf_counter() - start)


def swap_attention(worker, to_local: bool) -> int:
    """Switch the actor's core attention modules between SDPA and megatron's DotProductAttention in place.
    SdpaAttention subclasses DotProductAttention and only overrides forward, so the swap is exact."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from hybridrl.adapters.megatron.attention import sdpa_attention_class

    sdpa = sdpa_attention_class()
    old, new = (sdpa, DotProductAttention) if to_local else (DotProductAttention, sdpa)
    n = 0
    for chunk in worker.actor.engine.chunks:
        for m in chunk.modules():
            if type(m) is old:
                m.__class__ = new
                n += 1
    return n


def hf_log_probs(model_dir: str, dtype, device: str, input_ids, prompt_len: int, chunk: int):
    """Token log-probs of input_ids[:, prompt_len:] under transformers (float32 math for the log-softmax)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device)
    model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(input_ids), chunk):
            ids = input_ids[i:i + chunk].to(device)
            logits = model(input_ids=ids).logits[:, prompt_len - 1:-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[:, prompt_len:, None])[..., 0]
            out.append(lp.cpu())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return torch.cat(out)


def gap(a, b, mask) -> dict:
    d = (a.double() - b.double()).abs()[mask.bool()]
    return {"mean": float(d.mean()), "max": float(d.max())}


def gap_table(lps: dict, mask) -> dict:
    """Every engine's log-probs against vLLM's and against the float32 reference ({name}_vs_{ref}), each pair once."""
    table = {}
    for ref in ("vllm", "hf_fp32"):
        for name, lp in lps.items():
            if name != ref and f"{ref}_vs_{name}" not in table:
                table[f"{name}_vs_{ref}"] = gap(lp, lps[ref], mask)
    return table
