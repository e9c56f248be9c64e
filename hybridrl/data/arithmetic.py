"""A synthetic arithmetic task small enough for a tiny model to learn on 2 CPU cores in minutes.

    python -m hybridrl.data.arithmetic --out_dir ~/data/arithmetic --train 512 --test 64 --seed 0

Each prompt is one user message holding an expression and "=", e.g. "3+4="; the expected response
is the bare result, "7", followed by the end-of-turn token. With the default single-digit operands
and "+", results are 0..18 (one or two characters), so a char-level tokenizer needs 1-2 answer
tokens and there are only 100 distinct problems. Train and test rows are independent draws from the
same distribution (test rows can repeat training problems: the split measures learning the task, not
generalization). Results are never negative: with "-" and two terms the larger operand comes
first; with more terms a "-" that would go below zero is drawn as "+".

Rows (verl schema): data_source "arithmetic", prompt [{"role": "user", "content": "3+4="}],
ability "arithmetic", reward_model {"style": "rule", "ground_truth": "7"},
extra_info {split, index, expression: "3+4"}. Scored by hybridrl.reward.arithmetic.compute_score.
"""
from __future__ import annotations

import argparse
import os
import random
from typing import Any, Optional

from .verl_format import make_row, write_parquet

__all__ = ["DATA_SOURCE", "make_problem", "generate_rows", "main"]

DATA_SOURCE = "arithmetic"


def make_problem(rng: random.Random, max_operand: int = 9, ops: str = "+", n_terms: int = 2) -> tuple[str, int]:
    """(expression, value), e.g. ("3+4", 7); operands in 0..max_operand, evaluated left to right."""
    if n_terms < 2 or max_operand < 1 or not ops or set(ops) - set("+-"):
        raise ValueError(f"arithmetic: need n_terms >= 2, max_operand >= 1 and ops from '+-' (got {n_terms}, "
                         f"{max_operand}, {ops!r})")
    terms = [rng.randint(0, max_operand) for _ in range(n_terms)]
    value, expr = terms[0], str(terms[0])
    for t in terms[1:]:
        op = rng.choice(ops)
        if op == "-" and t > value:  # keep results non-negative: larger first for a 2-term "-"
            if n_terms == 2:
                value, t = t, value
                expr = str(value)
            else:
                op = "+"
        value = value + t if op == "+" else value - t
        expr += op + str(t)
    return expr, value


def generate_rows(n_train: int, n_test: int, seed: int, max_operand: int = 9, ops: str = "+",
                  n_terms: int = 2) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(seed)
    out: dict[str, list[dict[str, Any]]] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        rows = []
        for i in range(n):
            expr, value = make_problem(rng, max_operand, ops, n_terms)
            rows.append(make_row(DATA_SOURCE, expr + "=", str(value), "arithmetic", split, i, expression=expr))
        out[split] = rows
    return out


def main(argv: Optional[list[str]] = None) -> dict[str, str]:
    p = argparse.ArgumentParser(description="synthetic arithmetic prompts as verl parquet")
    p.add_argument("--out_dir", required=True)
    p.add_argument("--train", type=int, default=512)
    p.add_argument("--test", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max_operand", type=int, default=9)
    p.add_argument("--ops", default="+", help="operators to draw from, e.g. '+-'")
    p.add_argument("--n_terms", type=int, default=2)
    args = p.parse_args(argv)
    written = {}
    rows = generate_rows(args.train, args.test, args.seed, args.max_operand, args.ops, args.n_terms)
    for split, split_rows in rows.items():
        if split_rows:
            written[split] = write_parquet(split_rows, os.path.join(os.path.expanduser(args.out_dir), f"{split}.parquet"))
            print(f"{split}: {len(split_rows)} rows -> {written[split]}")
    return written


if __name__ == "__main__":
    main()
