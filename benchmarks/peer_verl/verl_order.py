"""Write a train file in the order verl 0.9.1 draws it, so hybridrl can read it unshuffled (run.sh
ours_smol_verl_order): both trainers then see the same prompts at every step.

    python benchmarks/peer_verl/verl_order.py --data TRAIN.parquet --seed 1 --out DIR/train.parquet

verl's sampler (verl/trainer/ppo/utils.py create_rl_sampler) is torchdata's stateful RandomSampler with a
torch.Generator seeded by data.seed; without replacement each pass over the data is torch.randperm(n, generator).
verl's first training epoch is the generator's *second* permutation (--draw 1): checked against verl_smol's
logged prompt_length/mean (2026-11-26): the mean prompt length of each 64-row batch under the second permutation
correlates 0.96 with verl's over its 10 steps, the first 0.23 (the first draw is spent before training starts;
not traced to the line). n is the row count after verl's overlong-prompt filter, which keeps every gsm_symbolic
row at max_prompt_length=256 ("filter dataset len: 4096" in verl's log): the script fails if --expect-rows differs.
"""
from __future__ import annotations

import argparse
import os

import torch


def verl_order(n: int, seed: int, draw: int = 1) -> list[int]:
    """The generator's permutation number `draw` (0-based) of n rows."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    for _ in range(draw):
        torch.randperm(n, generator=generator)
    return torch.randperm(n, generator=generator).tolist()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--draw", type=int, default=1, help="which of the generator's permutations (verl 0.9.1: 1)")
    ap.add_argument("--expect-rows", type=int, default=None, help="verl's 'filter dataset len' (fail when it differs)")
    args = ap.parse_args(argv)
    import pandas as pd

    frame = pd.read_parquet(args.data)
    if args.expect_rows is not None and len(frame) != args.expect_rows:
        raise SystemExit(f"{args.data}: {len(frame)} rows, verl kept {args.expect_rows}: its order would differ")
    order = verl_order(len(frame), args.seed, args.draw)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    frame.iloc[order].reset_index(drop=True).to_parquet(args.out)
    print(f"{args.out}: {len(frame)} rows in verl's order (seed {args.seed}, draw {args.draw}), first {order[:8]}")


if __name__ == "__main__":
    main()
