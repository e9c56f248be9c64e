"""Offload's host side without a GPU: storages released and restored in place, one host arena per kind reused
across rounds, and PinnedBuffer's register/unregister pairing (checked against a recording stand-in for the
CUDA runtime; tests/gpu/test_megatron_gpu.py checks the real registration and the bytes on an H200)."""
from __future__ import annotations

import types

import torch

from hybridrl.adapters.megatron import offload, pinned


def test_offload_releases_and_restores_storages_in_place():
    state = offload.State()
    base = torch.arange(12, dtype=torch.float32)
    views = [base[:6], base[6:]]  # two views of one storage: moved once
    moved = offload._offload_storages(views, state, "params", keep=True, device_type="cpu")
    assert moved == 48 and base.untyped_storage().nbytes() == 0
    assert offload._onload_storages(state, "params", keep=True) == 48
    assert torch.equal(base, torch.arange(12, dtype=torch.float32)) and views[1][0] == 6


def test_offload_rounds_reuse_their_arena_when_storages_move():
    state = offload.State()
    params = torch.arange(1 << 16, dtype=torch.float32)
    adam = [torch.full((1 << 15,), 2.0), torch.full((999,), 3.0)]
    arenas, addresses = [], set()
    for _ in range(4):
        addresses.add(params.untyped_storage().data_ptr())
        offload._offload_storages([params], state, "params", keep=True, device_type="cpu")
        offload._offload_storages(adam, state, "optimizer", keep=True, device_type="cpu")
        arenas.append((id(state.pinned["params"]), id(state.pinned["optimizer"])))
        hold = [torch.empty(1 << 16) for _ in range(4)]  # what the rollout engine allocates meanwhile
        offload._onload_storages(state, "params", keep=True)
        offload._onload_storages(state, "optimizer", keep=True)
        del hold
        params.add_(1)  # the update
        adam[1].mul_(2)
    assert len(addresses) > 1, "the storage never moved: this test would not see a buffer keyed by address"
    assert len(set(arenas)) == 1
    padded = (1 << 15) * 4 + -(-999 * 4 // offload.ALIGN) * offload.ALIGN
    assert state.pinned_bytes() == (1 << 16) * 4 + padded
    assert torch.equal(params, torch.arange(1 << 16, dtype=torch.float32) + 4)
    assert bool((adam[0] == 2).all()) and bool((adam[1] == 48).all())


def test_offload_rebuilds_the_arena_when_the_storages_change():
    state = offload.State()
    first = torch.ones(1024)
    offload._offload_storages([first], state, "optimizer", keep=True, device_type="cpu")
    offload._onload_storages(state, "optimizer", keep=True)
    rebuilt = torch.zeros(100)  # e.g. a new optimizer: the old state's memory must not stay pinned
    offload._offload_storages([rebuilt], state, "optimizer", keep=True, device_type="cpu")
    assert state.pinned_bytes() == offload.ALIGN
    offload._onload_storages(state, "optimizer", keep=True)
    assert bool((rebuilt == 0).all()) and bool((first == 1).all())


def test_a_second_offload_before_onload_keeps_the_data():
    state = offload.State()
    t = torch.arange(100, dtype=torch.float32)
    assert offload._offload_storages([t], state, "params", keep=True, device_type="cpu") == 400
    assert offload._offload_storages([t], state, "params", keep=True, device_type="cpu") == 0
    assert offload._onload_storages(state, "params", keep=True) == 400
    assert torch.equal(t, torch.arange(100, dtype=torch.float32))


def test_arena_slots_are_aligned_and_disjoint():
    sizes = {10: 1, 11: 513, 12: 4096, 13: 7}
    arena = offload.HostArena.build(sizes)
    spans = sorted(arena.slots.values())
    assert all(off % offload.ALIGN == 0 for off, _ in spans)
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
    for key, n in sizes.items():
        arena.view(key).fill_(key)
        assert arena.view(key).numel() == n
    assert all(bool((arena.view(k) == k).all()) for k in sizes)


class RecordingRuntime:
    """Stands in for torch.cuda.cudart(): records registrations, answers `code` to cudaHostRegister."""

    def __init__(self, code: int = 0) -> None:
        self.code, self.calls = code, []

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802 (CUDA's name)
        self.calls.append(("register", ptr, size, flags))
        return self.code

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.calls.append(("unregister", ptr))
        return 0


def test_pinned_buffer_registers_its_exact_bytes_once_and_unregisters_once(monkeypatch):
    runtime = RecordingRuntime()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: runtime)
    buf = pinned.PinnedBuffer(3 * pinned.PAGE + 5)
    ptr = buf.tensor.data_ptr()
    assert buf.registered and buf.tensor.numel() == 3 * pinned.PAGE + 5
    assert runtime.calls == [("register", ptr, 3 * pinned.PAGE + 5, 0)]
    buf.release()
    del buf  # __del__ after release: no second unregister
    assert runtime.calls[1:] == [("unregister", ptr)]
    dropped = pinned.PinnedBuffer(100)
    ptr = dropped.tensor.data_ptr()
    del dropped  # garbage collected without release(): still unregistered before the memory goes
    assert runtime.calls[-1] == ("unregister", ptr)


def test_pinned_buffer_falls_back_to_torch_pinning_with_a_warning(monkeypatch, caplog):
    runtime = RecordingRuntime(code=712)  # cudaErrorHostMemoryAlreadyRegistered, say
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: runtime)
    monkeypatch.setattr(pinned, "_FALLBACK_WARNED", False)
    real_empty = torch.empty
    asked = []

    def empty(*args, pin_memory=False, **kwargs):
        asked.append(pin_memory)
        return real_empty(*args, **kwargs)  # no CUDA here to pin with

    monkeypatch.setattr(torch, "empty", empty)
    with caplog.at_level("WARNING"):
        buf = pinned.PinnedBuffer(4096)
    assert not buf.registered and asked == [True] and buf.tensor.numel() == 4096
    assert "cudaHostRegister" in caplog.text and "ulimit -l" in caplog.text
    del buf
    assert [c[0] for c in runtime.calls] == ["register"]  # nothing to unregister


def test_prefault_touches_every_page():
    t = torch.full((5 * pinned.PAGE + 3,), 9, dtype=torch.uint8)
    pinned.prefault(t)
    pages = t[: 5 * pinned.PAGE].view(5, pinned.PAGE)
    assert bool((pages[:, 0] == 0).all()) and int((t == 0).sum()) == 6


def test_slow_pinning_is_a_warning_with_its_phases(caplog):
    def arena(nbytes, fault, register):
        buf = pinned.PinnedBuffer(0, pin=False)
        buf.nbytes, buf.seconds = nbytes, {"map": 0.0, "fault": fault, "register": register}
        return buf

    with caplog.at_level("INFO", logger=offload.log.name):
        offload._log_pinning([arena(int(18.5e9) - 4096, 2.0, 2.0), arena(4096, 0.5, 0.5)])  # 3.7 GB/s
        offload._log_pinning([arena(int(18.5e9), 0.3, 0.4)])
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    assert "18.50 GB" in caplog.records[0].getMessage() and "fault 2.50 s" in caplog.records[0].getMessage()


def test_an_optimizer_state_left_offloaded_comes_back_before_the_step_or_a_checkpoint(monkeypatch):
    """weight_sync.release leaves the optimizer state on the host; MegatronRole brings it back by itself
    (train_step's before_step, save/load_checkpoint). The device side runs on CPU storages here."""
    from hybridrl.adapters.megatron import overlap
    from hybridrl.adapters.megatron.role import MegatronRole

    exp_avg = torch.arange(64, dtype=torch.float32)
    role = types.SimpleNamespace(engine=None, _offloaded=offload.State(device_type="cpu"), _onload=overlap.Moved())
    offload._offload_storages([exp_avg], role._offloaded, "optimizer", keep=True)
    assert exp_avg.untyped_storage().nbytes() == 0
    MegatronRole._optimizer_on_device(role)
    assert torch.equal(exp_avg, torch.arange(64, dtype=torch.float32))
    assert role._onload.nbytes == 256 and role._onload.overlapped_bytes == 0  # nothing was sent for earlier
    MegatronRole._optimizer_on_device(role)  # already on the device: nothing moves
    assert role._onload.nbytes == 256 and not role._offloaded.offloaded["optimizer"]
