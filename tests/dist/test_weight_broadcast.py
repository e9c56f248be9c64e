"""The split placement's weight broadcast (hybridrl.hybrid.broadcast) over gloo: one sender, two receivers in
separate processes; what arrives is bitwise what was sent (mixed dtypes, several buckets), and a corrupted
transfer is named."""
from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from hybridrl.hybrid.broadcast import BroadcastGroup, _compare
from hybridrl.hybrid.checks import WeightSyncError
from hybridrl.utils.net import free_port
from tests.fixtures.mp_tensors import from_plain, to_plain

pytestmark = pytest.mark.dist


def _weights() -> list[list[tuple[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(7)
    return [
        [("model.embed_tokens.weight", torch.randn(33, 8, generator=g)),
         ("model.norm.weight", torch.randn(8, generator=g).to(torch.bfloat16))],
        [("model.layers.0.mlp.up_proj.weight", torch.randn(16, 8, generator=g)),
         ("counter", torch.arange(5, dtype=torch.int64)),
         ("model.layers.0.mlp.down_proj.weight", torch.randn(8, 16, generator=g).to(torch.bfloat16))],
    ]


def _run(rank: int, world: int, port: int, queue) -> None:
    try:
        group = BroadcastGroup.open("127.0.0.1", port, rank, world, torch.device("cpu"), timeout_s=60)
        if rank == 0:
            metrics = group.send(_weights())
            queue.put((rank, metrics))
        else:
            got = [[(n, to_plain(t)) for n, t in bucket] for bucket in group.receive()]
            queue.put((rank, got))
    except BaseException as e:  # the parent reports it
        queue.put((rank, f"{type(e).__name__}: {e}"))


@pytest.mark.timeout(120)
def test_broadcast_delivers_every_tensor_bitwise():
    ctx = mp.get_context("spawn")
    queue, world, port = ctx.Queue(), 3, free_port("127.0.0.1")
    procs = [ctx.Process(target=_run, args=(r, world, port, queue), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=90) for _ in range(world))
    for p in procs:
        p.join(timeout=30)
    errors = {r: v for r, v in results.items() if isinstance(v, str)}
    assert not errors, errors
    sent = _weights()
    assert results[0]["weight_broadcast/buckets"] == 2
    assert results[0]["weight_broadcast/bytes"] == sum(t.numel() * t.element_size() for b in sent for _, t in b)
    for rank in (1, 2):
        got = [[(n, from_plain(t)) for n, t in bucket] for bucket in results[rank]]
        assert [[n for n, _ in b] for b in got] == [[n for n, _ in b] for b in sent]
        for bucket_got, bucket_sent in zip(got, sent):
            for (name, a), (_, b) in zip(bucket_got, bucket_sent):
                assert a.dtype == b.dtype and a.shape == b.shape, name
                assert torch.equal(a, b), name


def test_compare_names_a_corrupted_or_missing_tensor():
    sent = {"w": (10.0, 20.0), "b": (1.0, 1.0)}
    _compare(sent, {"w": 10.0, "b": 1.0}, rank=1)
    with pytest.raises(WeightSyncError, match=r"rank 2 received 'w' with checksum 10.5"):
        _compare(sent, {"w": 10.5, "b": 1.0}, rank=2)
    with pytest.raises(WeightSyncError, match=r"never received 'b'"):
        _compare(sent, {"w": 10.0}, rank=1)
