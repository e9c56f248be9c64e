"""Re-aligning verl batches for megatron, splitting into micro-batches, and the CPU RNG tracker
(megatron itself is not imported here; offload is in test_megatron_offload.py)."""
from __future__ import annotations

import pytest
import torch

from hybridrl.adapters.megatron.batching import mini_batch_rows, split_rows, split_tokens
from hybridrl.adapters.megatron.forward import gather_response, pack, pack_thd, split_for_cp


def verl_rows():
    # prompt length P=4 (left-padded), response length R=3 (right-padded)
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 0], [1, 2, 3, 4, 9, 9, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]])
    return ids, mask, ids[:, 4:]


def test_pack_moves_valid_tokens_to_the_front_and_points_at_the_predicting_positions():
    ids, mask, responses = verl_rows()
    mb = pack(ids, mask, responses, torch.arange(2))
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 0, 0, 0], [1, 2, 3, 4, 9, 9, 9]]
    # response token j of row 0 sits at packed position 2 + j and is predicted by position 1 + j
    assert mb.resp_index[0].tolist()[:2] == [1, 2] and mb.resp_valid[0].tolist() == [True, True, False]
    assert mb.resp_index[1].tolist() == [3, 4, 5] and mb.resp_valid[1].all()
    packed = mb.input_ids.gather(1, mb.resp_index + 1)
    assert torch.equal(packed[mb.resp_valid], responses[mb.resp_valid])


def test_pack_trims_to_the_longest_row_and_rounds_to_a_multiple():
    ids, mask, responses = verl_rows()
    mb = pack(ids[:1], mask[:1], responses[:1], torch.arange(1), multiple=3)
    assert mb.input_ids.shape == (1, 6)  # 4 valid tokens rounded up to 6


def test_pack_rejects_attention_masks_with_holes():
    ids, mask, responses = verl_rows()
    mask = mask.clone()
    mask[1, 2] = 0
    with pytest.raises(ValueError, match=r"attention_mask rows \[1\] have holes"):
        pack(ids, mask, responses, torch.arange(2))


def test_pack_thd_concatenates_the_rows_and_marks_where_each_starts():
    ids, mask, responses = verl_rows()
    mb = pack_thd(ids, mask, responses, torch.arange(2))
    assert mb.packed and mb.input_ids.tolist() == [[5, 6, 7, 8, 1, 2, 3, 4, 9, 9, 9]]
    assert mb.cu_seqlens.tolist() == [0, 4, 11] and mb.cu_seqlens.dtype == torch.int32 and mb.max_seqlen == 7
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6]]  # positions restart in every row
    padded = pack(ids, mask, responses, torch.arange(2))
    assert torch.equal(mb.resp_valid, padded.resp_valid)
    # the same response tokens are predicted by the same (row, position) in both layouts
    flat = torch.arange(11)[None, :, None].float()
    rows_pos = torch.stack([torch.zeros(7), torch.full((7,), 4.0)])[:, :, None] + torch.arange(7.0)[None, :, None]
    assert torch.equal(gather_response(flat, mb)[mb.resp_valid], gather_response(rows_pos, padded)[padded.resp_valid])
    assert torch.equal(mb.input_ids[0][mb.resp_index + 1][mb.resp_valid], responses[mb.resp_valid])


def test_pack_thd_rounds_the_length_up_with_a_padding_segment_of_its_own():
    ids, mask, responses = verl_rows()
    mb = pack_thd(ids, mask, responses, torch.arange(2), multiple=4)
    assert mb.input_ids.shape == (1, 12) and mb.input_ids[0, 11] == 0
    assert mb.cu_seqlens.tolist() == [0, 4, 11, 12]  # the padding token attends only to itself
    params = mb.packed_seq_params()
    assert params.qkv_format == "thd" and params.max_seqlen_q == 7 and torch.equal(params.cu_seqlens_kv, mb.cu_seqlens)


@pytest.mark.parametrize("thd", [False, True], ids=["padded", "packed"])
def test_context_parallel_ranks_hold_two_chunks_of_every_sequence_and_each_response_token_once(thd):
    ids, mask, responses = verl_rows()
    size = 2
    full = (pack_thd(ids, mask, responses, torch.arange(2), multiple=4, align=4) if thd
            else pack(ids, mask, responses, torch.arange(2), multiple=4))
    if thd:  # every row padded to a multiple of 2*cp: slots of 4 and 8 tokens
        assert full.cu_seqlens.tolist() == [0, 4, 11] and full.cu_seqlens_padded.tolist() == [0, 4, 12]
        assert full.input_ids[0].tolist() == [5, 6, 7, 8, 1, 2, 3, 4, 9, 9, 9, 0]
    parts = [split_for_cp(full, r, size) for r in range(size)]
    if thd:  # rank 0: chunks 0 and 3 of each slot; rank 1: chunks 1 and 2
        assert parts[0].input_ids[0].tolist() == [5, 8, 1, 2, 9, 0]
        assert parts[1].input_ids[0].tolist() == [6, 7, 3, 4, 9, 9]
    else:
        assert parts[0].input_ids.tolist() == [[5, 6, 0, 0], [1, 2, 9, 0]]  # chunks 0 and 3 of each row
        assert parts[1].input_ids.tolist() == [[7, 8, 0, 0], [3, 4, 9, 9]]  # chunks 1 and 2
    owners = torch.stack([p.resp_valid for p in parts]).sum(0)
    assert torch.equal(owners, full.resp_valid.int())  # each response token on exactly one rank ...
    want = gather_response(full.input_ids.float()[..., None], full)
    for p in parts:  # ... where its predicting position holds the same token as in the whole micro-batch
        got = gather_response(p.input_ids.float()[..., None], p)
        assert p.cp_size == size and torch.equal(got[p.resp_valid], want[p.resp_valid])


def test_split_rows_balances_and_honours_the_virtual_pipeline_multiple():
    parts = split_rows(7, 3)
    assert [len(p) for p in parts] == [3, 2, 2] and torch.equal(torch.cat(parts), torch.arange(7))
    assert len(split_rows(6, 2, multiple=4)) == 4
    with pytest.raises(ValueError, match="multiple of pipeline_model_parallel_size=4"):
        split_rows(3, 1, multiple=4)


def test_training_with_virtual_stages_takes_at_least_twice_pp_micro_batches():
    """megatron-core's interleaved schedule deadlocks when it trains on exactly pp micro-batches (engine.py)."""
    from hybridrl.adapters.megatron.engine import check_interleaved_count

    assert len(split_rows(4, 4, multiple=2, min_count=4)) == 4  # one micro-batch's rows, spread over 2*pp
    assert len(split_tokens(torch.tensor([3, 3, 3, 3]), max_tokens=100, multiple=2, min_count=4)) == 4
    with pytest.raises(ValueError, match="to train, at least 4"):
        split_rows(3, 3, multiple=2, min_count=4)
    with pytest.raises(ValueError, match="2 micro-batches cannot train with pipeline_model_parallel_size=2"):
        check_interleaved_count(2, pp=2, chunks=2, group=None)
    with pytest.raises(ValueError, match="4 micro-batches cannot train with pipeline_model_parallel_size=4"):
        check_interleaved_count(4, pp=4, chunks=2, group=4)
    for count, pp, chunks in ((4, 2, 2), (8, 4, 2), (6, 2, 3), (2, 2, 1), (1, 1, 1)):
        check_interleaved_count(count, pp=pp, chunks=chunks, group=None)  # 2*pp and more, or no virtual stages


def test_split_tokens_respects_the_budget_and_keeps_every_row():
    lengths = torch.tensor([9, 2, 7, 3, 8, 1, 6])
    parts = split_tokens(lengths, max_tokens=12)
    assert sorted(torch.cat(parts).tolist()) == list(range(7))
    assert all(int(lengths[p].sum()) <= 12 for p in parts)
    assert len(split_tokens(torch.tensor([20, 3]), max_tokens=10)) == 2  # an overlong row gets its own bin


def test_split_tokens_takes_the_count_the_dp_ranks_agreed_on_and_the_pipeline_multiple():
    lengths = torch.tensor([9, 2, 7, 3, 8, 1, 6])
    assert len(split_tokens(lengths, max_tokens=100)) == 1
    assert len(split_tokens(lengths, max_tokens=100, min_count=3)) == 3  # another dp rank needs 3
    parts = split_tokens(lengths, max_tokens=12, multiple=2)
    assert len(parts) % 2 == 0 and sorted(torch.cat(parts).tolist()) == list(range(7))
    assert len(split_tokens(lengths, max_tokens=1, multiple=2)) == 6  # at most a multiple of 2 bins of 7 rows
    with pytest.raises(ValueError, match="multiple of pipeline_model_parallel_size=4"):
        split_tokens(torch.tensor([5, 5, 5]), max_tokens=100, multiple=4)


def test_mini_batches_are_in_order_or_a_seeded_permutation():
    assert [r.tolist() for r in mini_batch_rows(6, 3, None)] == [[0, 1, 2], [3, 4, 5]]
    a, b = mini_batch_rows(6, 3, 11), mini_batch_rows(6, 3, 11)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert sorted(torch.cat(a).tolist()) == list(range(6))
    with pytest.raises(ValueError, match="not a multiple of the per-rank mini-batch 4"):
        mini_batch_rows(6, 4, None)


def test_cpu_rng_tracker_forks_without_disturbing_the_default_stream():
    from hybridrl.adapters.megatron.compat import _CpuRNGTracker

    tracker = _CpuRNGTracker()
    tracker.add("model-parallel-rng", 123)
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    with tracker.fork():
        forked = torch.rand(1)
    assert torch.equal(torch.rand(1), before)  # default stream unaffected by the fork
    torch.manual_seed(123)
    assert torch.equal(forked, torch.rand(1))  # the fork drew from its own seeded stream
