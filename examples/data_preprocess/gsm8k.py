"""GSM8K {question, answer} files -> verl parquet (train.parquet, test.parquet), offline.

verl's script downloads openai/gsm8k; nothing is downloaded here, so point it at local files:

    python examples/data_preprocess/gsm8k.py --local_dataset_path ~/gsm8k_raw --local_save_dir ~/data/gsm8k
    python examples/data_preprocess/gsm8k.py --train_file train.jsonl --test_file test.parquet --output_dir out/

Input: a folder holding files whose names contain "train" / "test" (parquet, Arrow or jsonl; e.g.
the hub layout main/train-00000-of-00001.parquet), or one file (--input FILE, split from --split or
from its name), or --train_file / --test_file. Each row needs `question` and `answer` (the worked
solution ending in "#### N").
Output (verl's schema): data_source "openai/gsm8k", prompt [{"role": "user", "content": question +
" " + 'Let's think step by step and output the final answer after "####".'}], ability "math",
reward_model {"style": "rule", "ground_truth": N}, extra_info {split, index, answer, question}.
--local_dir is verl's older name for the OUTPUT folder and is accepted as such.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
from typing import Optional

try:
    import hybridrl  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from hybridrl.data.readers import SUPPORTED_EXTENSIONS, read_files
from hybridrl.data.verl_format import gsm8k_row, write_parquet


def find_split_files(folder: str) -> dict[str, list[str]]:
    """{split: files} for files under `folder` whose names contain 'train' or 'test'."""
    found: dict[str, list[str]] = {"train": [], "test": []}
    for path in sorted(glob.glob(os.path.join(folder, "**", "*"), recursive=True)):
        name = os.path.basename(path).lower()
        if not os.path.isfile(path) or not name.endswith(SUPPORTED_EXTENSIONS):
            continue
        for split in found:
            if split in name:
                found[split].append(path)
    return {s: f for s, f in found.items() if f}


def convert(files: list[str], split: str) -> list[dict]:
    rows = read_files(files, required_columns=["question", "answer"])
    out = []
    for i, (rec, (path, row)) in enumerate(zip(rows.records, rows.sources)):
        for col in ("question", "answer"):
            if not isinstance(rec[col], str):
                raise ValueError(f"{path}: row {row}, column {col!r}: expected a string, got {type(rec[col]).__name__}")
        out.append(gsm8k_row(rec["question"], rec["answer"], split, i, where=f"{path}: "))
    return out


def split_inputs(args: argparse.Namespace) -> dict[str, list[str]]:
    inputs: dict[str, list[str]] = {}
    if args.input:
        src = os.path.expanduser(args.input)
        if os.path.isdir(src):
            inputs = find_split_files(src)
            if not inputs:
                raise SystemExit(f"{src}: no train/test files ({', '.join(SUPPORTED_EXTENSIONS)}) found")
        else:
            split = args.split or ("test" if "test" in os.path.basename(src).lower() else "train")
            inputs[split] = [src]
    if args.train_file:
        inputs["train"] = [args.train_file]
    if args.test_file:
        inputs["test"] = [args.test_file]
    if not inputs:
        raise SystemExit("give --local_dataset_path/--input, or --train_file/--test_file (nothing is downloaded)")
    return inputs


def main(argv: Optional[list[str]] = None) -> dict[str, str]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--local_dataset_path", "--input", dest="input", help="folder with train/test files, or one file")
    p.add_argument("--split", choices=["train", "test"], help="split of a single --input file")
    p.add_argument("--train_file")
    p.add_argument("--test_file")
    p.add_argument("--local_save_dir", "--local_dir", "--output_dir", dest="output_dir", default="~/data/gsm8k")
    args = p.parse_args(argv)
    written = {}
    for split, files in split_inputs(args).items():
        rows = convert(files, split)
        written[split] = write_parquet(rows, os.path.join(os.path.expanduser(args.output_dir), f"{split}.parquet"))
        print(f"{split}: {len(rows)} rows -> {written[split]}")
    return written


if __name__ == "__main__":
    main()
