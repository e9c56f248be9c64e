"""The split placement's weight broadcast over NCCL (hybridrl.hybrid.broadcast): actor rank 0 on GPU 0 sends
bf16/fp32 buckets to a receiver on GPU 1; what arrives is bitwise what was sent. Needs 2 GPUs."""
from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from hybridrl.utils.net import free_port
from tests.fixtures.mp_tensors import from_plain, to_plain

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL: one rank per GPU)")


def _weights(device: str) -> list[list[tuple[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(3)
    buckets = [[("a", torch.randn(1024, 512, generator=g).bfloat16()), ("b", torch.randn(77, generator=g))],
               [("c", torch.randn(4096, 1024, generator=g).bfloat16())]]
    return [[(n, t.to(device)) for n, t in b] for b in buckets]


def _run(rank: int, port: int, queue) -> None:
    from hybridrl.hybrid.broadcast import BroadcastGroup

    try:
        torch.cuda.set_device(rank)
        group = BroadcastGroup.open("127.0.0.1", port, rank, 2, torch.device("cuda", rank), timeout_s=120)
        if rank == 0:
            queue.put((rank, group.send(_weights("cuda:0"))))
        else:
            got = [[(n, to_plain(t)) for n, t in b] for b in group.receive()]
            queue.put((rank, got))
    except BaseException as e:
        queue.put((rank, f"{type(e).__name__}: {e}"))


@pytest.mark.timeout(300)
def test_nccl_broadcast_is_bitwise():
    port = free_port("127.0.0.1")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_run, args=(r, port, queue), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=240) for _ in range(2))
    for p in procs:
        p.join(timeout=30)
    assert not any(isinstance(v, str) for v in results.values()), results
    sent = _weights("cpu")
    for (bg, bs) in zip(results[1], sent):
        for (n, a), (_, b) in zip(bg, bs):
            assert torch.equal(from_plain(a), b), n
    print(f"nccl weight broadcast: {results[0]['weight_broadcast/bytes'] / 2**20:.1f} MiB in "
          f"{results[0]['timing_s/weight_broadcast']:.3f} s")
