"""trainer.validation_data_dir and trainer.rollout_data_dir: generations written as verl writes them.

One file per step, `{step}.jsonl`, one line per sample with `input`, `output` (decoded without special tokens),
`gts` (the row's reward_model.ground_truth), `score` (the sequence's summed reward), `step`, and every per-sample
reward extra (acc, pred, ...). Scripts that read verl's dumps read these unchanged.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import torch

from hybridrl.protocol import DataProto


def generation_records(tokenizer: Any, batch: DataProto, scores: torch.Tensor, step: int,
                       extra: Optional[dict[str, list]] = None) -> list[dict]:
    inputs = tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
    # Decode only the response's own tokens: right padding after EOS is not part of the output.
    lengths = batch.batch["attention_mask"][:, -batch.batch["responses"].shape[-1]:].sum(-1).tolist()
    outputs = tokenizer.batch_decode([r[:n] for r, n in zip(batch.batch["responses"].tolist(), lengths)],
                                     skip_special_tokens=True)
    rm = batch.non_tensor_batch.get("reward_model")
    gts = [(r or {}).get("ground_truth") if isinstance(r, dict) else None for r in rm] if rm is not None \
        else [None] * len(inputs)
    n = len(inputs)
    columns = {"input": inputs, "output": outputs, "gts": gts, "score": scores.tolist(), "step": [step] * n}
    for key, values in (extra or {}).items():
        if key not in columns and len(values) == n:
            columns[key] = list(values)
    return [{k: _plain(v[i]) for k, v in columns.items()} for i in range(n)]


def write_generations(dump_dir: str, step: int, records: list[dict], append: bool = False) -> str:
    os.makedirs(dump_dir, exist_ok=True)
    path = os.path.join(dump_dir, f"{step}.jsonl")
    with open(path, "a" if append else "w") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
    return path


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:  # numpy scalars
        return v.item()
    return v
