"""Writing verl-format prompt rows (shared by the preprocess scripts and the offline generators).

One row: {data_source, prompt: [{"role": "user", "content": ...}], ability,
reward_model: {"style": "rule", "ground_truth": str}, extra_info: {"split", "index", ...}}.
The parquet schema is written explicitly, so every file has the same column types whatever its
rows hold (an all-integer extra field would otherwise change type between files).
"""
from __future__ import annotations

import os
import re
from typing import Any, Optional, Sequence

import pyarrow as pa

__all__ = ["GSM8K_INSTRUCTION", "GSM8K_SOURCE", "make_row", "write_parquet", "extract_gsm8k_answer", "gsm8k_row"]

GSM8K_SOURCE = "openai/gsm8k"
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def make_row(data_source: str, content: str, ground_truth: str, ability: str, split: str, index: int,
             **extra: Any) -> dict[str, Any]:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": str(ground_truth)},
        "extra_info": {"split": split, "index": int(index), **extra},
    }


def extract_gsm8k_answer(answer: str) -> Optional[str]:
    """The number after the LAST '#### ' of a GSM8K solution, commas removed (None if absent)."""
    found = re.findall(r"#### (-?[0-9.,]+)", answer)
    return found[-1].replace(",", "") if found else None


def gsm8k_row(question: str, answer: str, split: str, index: int, where: str = "") -> dict[str, Any]:
    """A GSM8K {question, answer} pair as a verl row (prompt = question + ' ' + instruction)."""
    truth = extract_gsm8k_answer(answer)
    if truth is None:
        raise ValueError(f"{where}row {index}: answer has no '#### N' final answer: {answer[-120:]!r}")
    return make_row(GSM8K_SOURCE, question + " " + GSM8K_INSTRUCTION, truth, "math", split, index,
                    answer=answer, question=question)


def write_parquet(rows: Sequence[dict[str, Any]], path: str) -> str:
    """Write verl rows to `path` (folders created); returns the absolute path."""
    import pyarrow.parquet as pq

    if not rows:
        raise ValueError(f"write_parquet: no rows for {path}")
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    table = pa.Table.from_pylist(list(rows), schema=_schema(rows))
    pq.write_table(table, path)
    return path


def _schema(rows: Sequence[dict[str, Any]]) -> pa.Schema:
    extra_fields = [pa.field("split", pa.string()), pa.field("index", pa.int64())]
    seen = {"split", "index"}
    for r in rows:
        for k, v in r["extra_info"].items():
            if k not in seen:
                seen.add(k)
                extra_fields.append(pa.field(k, _arrow_type(v)))
    fields = [
        pa.field("data_source", pa.string()),
        pa.field("prompt", pa.list_(pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())]))),
        pa.field("ability", pa.string()),
        pa.field("reward_model", pa.struct([pa.field("style", pa.string()), pa.field("ground_truth", pa.string())])),
        pa.field("extra_info", pa.struct(extra_fields)),
    ]
    # any other column the rows carry (e.g. main_generation's `responses`) is kept, its type inferred
    known = {f.name for f in fields}
    others = list(dict.fromkeys(k for r in rows for k in r if k not in known))
    fields += [pa.field(k, pa.infer_type([r.get(k) for r in rows])) for k in others]
    return pa.schema(fields)


def _arrow_type(v: Any) -> pa.DataType:
    if isinstance(v, bool):
        return pa.bool_()
    if isinstance(v, int):
        return pa.int64()
    if isinstance(v, float):
        return pa.float64()
    if isinstance(v, str):
        return pa.string()
    return pa.infer_type([v])
