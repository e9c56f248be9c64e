"""GSM8K-style verl parquet generated offline from reasoning-gym's gsm_symbolic task.

    python -m hybridrl.data.gen_gsm_symbolic --out_dir ~/data/gsm_symbolic --train 2000 --test 200 --seed 0

gsm_symbolic entries are {question, answer, metadata: {answer_cot, answer_value, ...}}: templated
GSM8K word problems with a worked solution ending in "#### N". One dataset of train + test entries
is drawn with `seed` and split in order (train first), so the two splits never share an entry.
Rows use the GSM8K schema and data_source "openai/gsm8k", so the gsm8k scorer applies:
  * the question's reasoning-gym suffix "Give the result as your final answer. Do not include
    units." is replaced by GSM8K's instruction (the same text examples/data_preprocess/gsm8k.py adds);
  * ground_truth is the entry's `answer` string (an integer for almost all entries; a few are decimals);
  * extra_info.answer is the worked solution with its final line written as "#### <answer>"
    (reasoning-gym sometimes writes "#### 36.0" for answer "36"; the value is checked equal),
    so the strict gsm8k scorer gives 1.0 on it.
"""
from __future__ import annotations

import argparse
import os
import re
from typing import Any, Optional

from .verl_format import gsm8k_row, write_parquet

__all__ = ["generate_rows", "main"]

RG_SUFFIX = " Give the result as your final answer. Do not include units."


def _entry_to_qa(entry: dict[str, Any], i: int) -> tuple[str, str]:
    question, truth = entry["question"], str(entry["answer"]).strip()
    if question.endswith(RG_SUFFIX):
        question = question[: -len(RG_SUFFIX)]
    cot = entry["metadata"]["answer_cot"].rstrip()
    m = re.search(r"\n?#### ([^\n]+)$", cot)
    if m is None or float(m.group(1).replace(",", "")) != float(truth):
        raise ValueError(f"gsm_symbolic entry {i}: solution's final answer {m.group(1) if m else None!r} "
                         f"disagrees with answer {truth!r}")
    return question, cot[: m.start()] + f"\n#### {truth}"


def generate_rows(n_train: int, n_test: int, seed: int) -> dict[str, list[dict[str, Any]]]:
    """{'train': rows, 'test': rows} in verl's GSM8K schema."""
    import reasoning_gym

    if n_train < 0 or n_test < 0 or n_train + n_test == 0:
        raise ValueError(f"gen_gsm_symbolic: need train >= 0, test >= 0 and some rows (got {n_train}, {n_test})")
    entries = list(reasoning_gym.create_dataset("gsm_symbolic", size=n_train + n_test, seed=seed))
    out: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    for i, entry in enumerate(entries):
        split = "train" if i < n_train else "test"
        question, answer = _entry_to_qa(entry, i)
        row = gsm8k_row(question, answer, split, len(out[split]))
        row["extra_info"]["source"] = "reasoning_gym/gsm_symbolic"
        out[split].append(row)
    return out


def main(argv: Optional[list[str]] = None) -> dict[str, str]:
    p = argparse.ArgumentParser(description="GSM8K-style verl parquet from reasoning-gym gsm_symbolic (offline)")
    p.add_argument("--out_dir", required=True)
    p.add_argument("--train", type=int, default=1000, help="training rows")
    p.add_argument("--test", type=int, default=100, help="test rows")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    written = {}
    for split, rows in generate_rows(args.train, args.test, args.seed).items():
        if rows:
            written[split] = write_parquet(rows, os.path.join(os.path.expanduser(args.out_dir), f"{split}.parquet"))
            print(f"{split}: {len(rows)} rows -> {written[split]}")
    return written


if __name__ == "__main__":
    main()
