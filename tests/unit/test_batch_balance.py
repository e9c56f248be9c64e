"""trainer.balance_batch's row order (batch_ops.balance_order): equal dp chunks of similar token totals, rows in
rollout order within a chunk (a GRPO group stays in one mini-batch), and with trainer.balance_batch_sort verl
0.9.1's order within each chunk (its mini-batches hold about half of every group)."""
import random

import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.batch_ops import balance_batch, balance_order


def test_chunks_are_equal_in_rows_close_in_tokens_and_keep_the_rollout_order():
    rng = random.Random(0)
    tokens = [rng.randint(20, 400) for _ in range(64)]
    order = balance_order(tokens, 4)
    assert sorted(order) == list(range(64))
    chunks = [order[k * 16:(k + 1) * 16] for k in range(4)]
    totals = [sum(tokens[i] for i in c) for c in chunks]
    assert max(totals) - min(totals) <= max(tokens), totals
    assert all(c == sorted(c) for c in chunks)
    assert balance_order(tokens, 1) == list(range(64)) and balance_order(tokens[:63], 4) == list(range(63))


def test_sorted_order_is_verls_within_each_chunk():
    # verl's _balance_batch at dp=1, written out: rank by (length, index) = rows 1, 3, 4, 2, 0, 5; every other
    # one from the first (1, 4, 0), then the others from the last (5, 2, 3)
    assert balance_order([5, 1, 4, 2, 3, 6], 1, sort_by_length=True) == [1, 4, 0, 5, 2, 3]
    tokens = [30, 10, 20, 40, 11, 21, 31, 41]
    order = balance_order(tokens, 2, sort_by_length=True)
    for chunk in (order[:4], order[4:]):
        lengths = [tokens[i] for i in chunk]
        assert lengths[0] == min(lengths) and lengths[-1] == sorted(lengths)[1]  # short ones at both ends


def test_with_the_sort_two_mini_batches_each_hold_about_half_of_every_group():
    rng = random.Random(1)
    groups, n = 64, 8
    tokens = [rng.randint(80, 140) + rng.randint(40, 256) for _ in range(groups * n)]  # prompt + response
    half = groups * n // 2
    for sort, lo, hi in ((False, 0.0, 0.0), (True, 0.3, 0.7)):
        first = set(balance_order(tokens, 1, sort_by_length=sort)[:half])
        shares = [sum(g * n + j in first for j in range(n)) / n for g in range(groups)]
        split = sum(0 < s < 1 for s in shares) / groups
        if sort:
            assert lo < sum(shares) / groups < hi and split > 0.9, (split, shares)
        else:
            assert split == 0.0, shares  # rollout order: every group wholly in one mini-batch


def test_balance_batch_reorders_the_rows_by_their_attention_masks():
    lengths = [3, 1, 2, 4]
    mask = torch.tensor([[1] * k + [0] * (4 - k) for k in lengths])
    batch = DataProto.from_dict({"attention_mask": mask, "row": torch.arange(4)})
    out, _ = balance_batch(batch, 1, sort_by_length=True)
    assert out.batch["row"].tolist() == [1, 0, 3, 2]  # ranked 1, 2, 0, 3: then 1, 0 and 3, 2
    assert balance_batch(batch, 1)[0].batch["row"].tolist() == [0, 1, 2, 3]
