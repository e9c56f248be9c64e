"""Re-aligning verl batches for megatron, splitting into micro-batches, and the pieces of offload and
the CPU RNG tracker that can be checked without processes (megatron itself is not imported here)."""
from __future__ import annotations

import pytest
import torch

from hybridrl.adapters.megatron.batching import mini_batch_rows, split_rows, split_tokens
from hybridrl.adapters.megatron.forward import pack


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


def test_split_rows_balances_and_honours_the_virtual_pipeline_multiple():
    parts = split_rows(7, 3)
    assert [len(p) for p in parts] == [3, 2, 2] and torch.equal(torch.cat(parts), torch.arange(7))
    assert len(split_rows(6, 2, multiple=4)) == 4
    with pytest.raises(ValueError, match="multiple of pipeline_model_parallel_size=4"):
        split_rows(3, 1, multiple=4)


def test_split_tokens_respects_the_budget_and_keeps_every_row():
    lengths = torch.tensor([9, 2, 7, 3, 8, 1, 6])
    parts = split_tokens(lengths, max_tokens=12)
    assert sorted(torch.cat(parts).tolist()) == list(range(7))
    assert all(int(lengths[p].sum()) <= 12 for p in parts)
    assert len(split_tokens(torch.tensor([20, 3]), max_tokens=10)) == 2  # an overlong row gets its own bin


def test_mini_batches_are_in_order_or_a_seeded_permutation():
    assert [r.tolist() for r in mini_batch_rows(6, 3, None)] == [[0, 1, 2], [3, 4, 5]]
    a, b = mini_batch_rows(6, 3, 11), mini_batch_rows(6, 3, 11)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert sorted(torch.cat(a).tolist()) == list(range(6))
    with pytest.raises(ValueError, match="not a multiple of the per-rank mini-batch 4"):
        mini_batch_rows(6, 4, None)


def test_offload_releases_and_restores_storages_in_place():
    from hybridrl.adapters.megatron import offload

    state = offload.State()
    base = torch.arange(12, dtype=torch.float32)
    views = [base[:6], base[6:]]  # two views of one storage: moved once
    moved = offload._offload_storages(views, state, "params", keep=True, device_type="cpu")
    assert moved == 48 and base.untyped_storage().nbytes() == 0
    assert offload._onload_storages(state, "params", keep=True) == 48
    assert torch.equal(base, torch.arange(12, dtype=torch.float32)) and views[1][0] == 6


def test_offload_rounds_reuse_their_host_buffers_when_storages_move():
    from hybridrl.adapters.megatron import offload

    state = offload.State()
    params = torch.arange(1 << 16, dtype=torch.float32)
    adam = torch.full((1 << 15,), 2.0)
    buffers, addresses = [], set()
    for _ in range(4):
        addresses.add(params.untyped_storage().data_ptr())
        offload._offload_storages([params], state, "params", keep=True, device_type="cpu")
        offload._offload_storages([adam], state, "optimizer", keep=True, device_type="cpu")
        buffers.append({id(t) for kind in state.pinned.values() for t in kind.values()})
        hold = [torch.empty(1 << 16) for _ in range(4)]  # what the rollout engine allocates meanwhile
        offload._onload_storages(state, "params", keep=True)
        offload._onload_storages(state, "optimizer", keep=True)
        del hold
        params.add_(1)  # the update
    assert len(addresses) > 1, "the storage never moved: this test would not see a buffer keyed by address"
    assert all(b == buffers[0] for b in buffers) and len(buffers[0]) == 2
    assert state.pinned_bytes() == params.numel() * 4 + adam.numel() * 4
    assert torch.equal(params, torch.arange(1 << 16, dtype=torch.float32) + 4) and bool((adam == 2).all())


def test_offload_drops_host_buffers_of_storages_that_are_gone():
    from hybridrl.adapters.megatron import offload

    state = offload.State()
    first = torch.ones(1024)
    offload._offload_storages([first], state, "optimizer", keep=True, device_type="cpu")
    offload._onload_storages(state, "optimizer", keep=True)
    rebuilt = torch.zeros(512)  # e.g. a new optimizer: the old state's buffer must not stay pinned
    offload._offload_storages([rebuilt], state, "optimizer", keep=True, device_type="cpu")
    assert state.pinned_bytes() == 512 * 4


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
