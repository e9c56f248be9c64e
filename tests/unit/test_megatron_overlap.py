"""The optimizer state's trips split in halves (adapters/megatron/overlap.py), on host storages standing in for the
device and a copier that holds copies back until a wait and poisons their destinations (tests/fixtures/held_copier.py):
what is read before its wait reads NaN. Also the host arena's reuse, its background reservation and its size
prediction. tests/dist/test_megatron_overlap_update.py runs the same path through a real megatron update."""
from __future__ import annotations

import logging
import types

import pytest
import torch

from hybridrl.adapters.megatron import offload, overlap, pinned
from hybridrl.adapters.megatron.role import MegatronRole
from tests.fixtures.held_copier import HeldCopier


def _state() -> offload.State:
    return offload.State(device_type="cpu", _copier=HeldCopier())


def _offloaded(state: offload.State, *tensors: torch.Tensor) -> None:
    offload._offload_storages(list(tensors), state, "optimizer", keep=True)
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors)


def test_split_by_budget_takes_what_fits_in_order():
    sizes = [(1, 40), (2, 100), (3, 30), (4, 30)]
    assert overlap.split_by_budget(sizes, 100) == ([1, 3, 4], [2])  # 2 does not fit after 1: smaller ones do
    assert overlap.split_by_budget(sizes, 0) == ([], [1, 2, 3, 4])
    assert overlap.split_by_budget(sizes, None) == ([1, 2, 3, 4], [])
    assert overlap.split_by_budget(sizes, 10_000) == ([1, 2, 3, 4], [])


def test_an_onload_begun_early_is_read_only_after_its_wait():
    state = _state()
    small, big = torch.arange(16, dtype=torch.float32), torch.arange(1000, dtype=torch.float32)
    _offloaded(state, small, big)
    copier = state.copier
    copier.log.clear()
    assert overlap.begin_onload(state, "optimizer", budget=100) == 64  # only `small` fits
    assert small.untyped_storage().nbytes() == 64 and big.untyped_storage().nbytes() == 0
    assert bool(small.isnan().all()), "the copy ran before anyone waited: this test would not see a missing wait"
    assert copier.log[0] == "side_waits_main"  # the refilled block is written only after the compute stream's work
    moved = overlap.finish_onload(state, "optimizer")
    assert torch.equal(small, torch.arange(16, dtype=torch.float32))
    assert torch.equal(big, torch.arange(1000, dtype=torch.float32))
    assert (moved.nbytes, moved.overlapped_bytes) == (4064, 64) and copier.pending == 0
    waits = [e for e in copier.log if isinstance(e, tuple) and e[0] == "main_waits"]
    n = len(copier.queue)
    assert [m for _, m in waits] == [n - 1, n]  # the compute stream waits for both transfers
    assert not state.offloaded["optimizer"] and not state.arriving


def test_an_offload_keeps_its_storages_until_finished_and_an_onload_cancels_it():
    state = _state()
    exp_avg = torch.arange(256, dtype=torch.float32)
    _offloaded(state, exp_avg)
    overlap.finish_onload(state, "optimizer")
    exp_avg.mul_(2)  # the optimizer step
    copier = state.copier
    assert overlap.begin_offload(state, "optimizer", [exp_avg]) == 1024
    assert exp_avg.untyped_storage().nbytes() == 1024, "released while its copy may still read it"
    assert copier.pending == 1 and "optimizer" in state.leaving
    moved = overlap.finish_offload(state, "optimizer")  # push: waits, then frees
    assert moved.nbytes == 1024 and exp_avg.untyped_storage().nbytes() == 0 and copier.pending == 0
    overlap.finish_onload(state, "optimizer")
    assert torch.equal(exp_avg, 2 * torch.arange(256, dtype=torch.float32))
    # begun, then an update (or a checkpoint) needs the state before any push: the offload stops where it is
    overlap.begin_offload(state, "optimizer", [exp_avg])
    marker = state.leaving["optimizer"].end
    copier.log.clear()
    assert overlap.begin_onload(state, "optimizer") == 0  # nothing left the device
    assert copier.log == [("main_waits", marker)]  # the step's writes come after the copies' reads
    assert exp_avg.untyped_storage().nbytes() == 1024 and not state.leaving and not state.offloaded["optimizer"]
    assert torch.equal(exp_avg, 2 * torch.arange(256, dtype=torch.float32))


def test_new_storages_take_new_slots_in_the_same_buffer():
    """Adam's moments appear at the first step: the arena's buffer, reserved for them, takes their slots too."""
    state = _state()
    main = torch.ones(1000)
    moments = [torch.full((1000,), 2.0), torch.full((1000,), 3.0)]
    need = 3 * offload.aligned(4000)
    state.reserve = pinned.HostReserve({"optimizer": need}, pin=False)
    _offloaded(state, main)
    buffer = state.pinned["optimizer"].buffer
    assert buffer.nbytes == need and not state.fresh  # the reserved buffer: nothing pinned at first use
    overlap.finish_onload(state, "optimizer")
    _offloaded(state, main, *moments)
    assert state.pinned["optimizer"].buffer is buffer and not state.fresh
    overlap.finish_onload(state, "optimizer")
    assert bool((main == 1).all()) and bool((moments[0] == 2).all()) and bool((moments[1] == 3).all())


def test_a_failed_reservation_pins_at_first_use_with_a_warning(monkeypatch, caplog):
    def fail(nbytes, pin=True):
        raise MemoryError("host out of memory")

    monkeypatch.setattr(pinned, "PinnedBuffer", fail)
    reserve = pinned.HostReserve({"optimizer": 4096}, pin=False)
    with caplog.at_level(logging.WARNING):
        assert reserve.take("optimizer") is None
    assert "ahead of time failed" in caplog.text and "MemoryError" in caplog.text


def _fused_adamw_engine():
    """What offload reads from a megatron engine: model chunks, and a chained optimizer over fp32 main params
    (separate storages from the bf16-like model params), torch's fused AdamW as engine.use_fused_torch_adam sets."""
    model = torch.nn.Sequential(torch.nn.Linear(33, 17), torch.nn.Linear(17, 5, bias=False))
    mains = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    inner = torch.optim.AdamW(mains, lr=1e-3, fused=True)
    return types.SimpleNamespace(chunks=[model], optimizer=types.SimpleNamespace(
        chained_optimizers=[types.SimpleNamespace(optimizer=inner)])), mains, inner


def test_host_bytes_predicts_the_optimizer_state_after_its_first_step():
    engine, mains, inner = _fused_adamw_engine()
    predicted = offload.host_bytes(engine, "optimizer", "cpu")
    # each main param's slot, its two moments' and its `step` counter's (fused AdamW keeps it beside the param)
    assert predicted == sum(3 * offload.aligned(4 * p.numel()) + offload.ALIGN for p in mains)
    for p in mains:
        p.grad = torch.ones_like(p)
    inner.step()
    state = offload._optimizer_tensors(engine, "cpu")
    sizes = {k: s.nbytes() for k, s in overlap.unique_storages(state, set(), "cpu").items()}
    assert offload.HostArena.layout(sizes)[1] == predicted
    assert offload.host_bytes(engine, "optimizer", "cpu") == predicted  # after the step: nothing more to come
    assert offload.host_bytes(engine, "params", "cpu") == sum(offload.aligned(4 * p.numel()) for p in mains)


def _role(state: offload.State, budget) -> types.SimpleNamespace:
    return types.SimpleNamespace(role="actor", _offloaded=state, _onload=overlap.Moved(), _onload_budget=budget)


@pytest.mark.parametrize("free, early", [(10_000, 4064), (100 + 64, 64), (100, 0)])
def test_the_update_sends_for_what_the_budget_allows(free, early):
    """MegatronRole: at the update's start as much as fits in free memory less the reserve, the rest before the
    step; the metric says how much overlapped (0: the serial path)."""
    state = _state()
    small, big = torch.arange(16, dtype=torch.float32), torch.arange(1000, dtype=torch.float32)
    _offloaded(state, small, big)
    role = _role(state, overlap.OverlapBudget(reserve=100, free=lambda: free))
    MegatronRole._begin_optimizer_onload(role)
    assert state.copier.pending == (2 if early == 4064 else 1 if early else 0)
    MegatronRole._optimizer_on_device(role)
    assert torch.equal(big, torch.arange(1000, dtype=torch.float32)) and torch.equal(small, torch.arange(16.0))
    metrics = MegatronRole._onload_metrics(role)
    assert metrics["offload/optimizer_onload_overlap"] == early / 4064
    assert set(metrics) == {"timing_s/optimizer_onload", "timing_s/optimizer_onload_exposed",
                            "offload/optimizer_onload_overlap"}


def test_without_a_budget_the_state_comes_back_before_the_step_only():
    state = _state()
    exp_avg = torch.arange(16, dtype=torch.float32)
    _offloaded(state, exp_avg)
    role = _role(state, None)
    MegatronRole._begin_optimizer_onload(role)
    assert exp_avg.untyped_storage().nbytes() == 0  # nothing sent for during the forward/backward
    MegatronRole._optimizer_on_device(role)
    assert torch.equal(exp_avg, torch.arange(16.0)) and MegatronRole._onload_metrics(role)[
        "offload/optimizer_onload_overlap"] == 0.0


def test_on_cpu_nothing_moves():
    """No CUDA: the state lives in host memory already; every move is a no-op, as before."""
    state = offload.State()  # device_type "cuda", without a GPU
    assert not state.active()
    assert offload.offload(None, state, True, True, True) == offload.OffloadReport()
    assert offload.onload(None, state, True, True, True) == offload.OffloadReport()
    assert offload.begin_offload(None, state, True, True) == 0
    assert offload.reserve_host(None, state, ["optimizer"]) is None
    role = _role(state, overlap.OverlapBudget(reserve=0, free=lambda: 1 << 40))
    MegatronRole._begin_optimizer_onload(role)
    MegatronRole._optimizer_on_device(role)
    assert MegatronRole._onload_metrics(role) == {}


def test_startup_times_say_what_pinning_cost_and_what_start_up_waited():
    state = _state()
    state.reserve = pinned.HostReserve({"optimizer": 1 << 20}, pin=False)
    assert state.reserve.take("optimizer").nbytes == 1 << 20
    times = MegatronRole.startup_times(types.SimpleNamespace(_offloaded=state))
    assert set(times) == {"host_pin_wait", "host_pin_background"}
    assert times["host_pin_wait"] <= times["host_pin_background"] + 1e-3
    assert MegatronRole.startup_times(types.SimpleNamespace(_offloaded=_state())) == {}
