"""The optimizer state comes back beside the forward/backward and leaves beside what follows the update (issue 39),
and the update is bitwise the one it was: a tiny megatron actor (bf16 params, distributed optimizer, fused AdamW)
on the CPU, its state moved through host storages standing in for the device, with copies held back until waited
for (their destinations read NaN until then). overlap_run.py runs four ways through two updates after a round trip
each: no offload, the serial onload, half the state sent for at the update's start, an offload stopped in flight."""
from __future__ import annotations

import pytest

from hybridrl.adapters.megatron.phases import UPDATE_PHASES

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def result(one_rank_megatron):
    """overlap_run.py's rank0.json (tests/dist/conftest.py: one torchrun process with the other one-rank drivers)."""
    return one_rank_megatron["overlap"]


@pytest.mark.parametrize("way", ["serial", "overlap", "cancel"])
def test_the_update_after_a_round_trip_is_bitwise_the_resident_one(result, way):
    resident, moved = result["resident"], result[way]
    assert moved["nan"] == 0 and moved["copies_pending"] == 0
    assert set(moved["tensors"]) == set(resident["tensors"]) and any(k.startswith("state.") for k in moved["tensors"])
    differ = [k for k, v in moved["tensors"].items() if v != resident["tensors"][k]]
    assert not differ, f"{way}: {len(differ)} tensors differ from the resident run, e.g. {differ[:3]}"
    for got, want in zip(moved["metrics"], resident["metrics"]):
        assert got["actor/pg_loss"] == want["actor/pg_loss"] and got["actor/grad_norm"] == want["actor/grad_norm"]


def test_the_metrics_say_how_much_came_back_beside_the_forward_backward(result):
    serial, overlapped = result["serial"]["metrics"][1:], result["overlap"]["metrics"][1:]
    assert all(m["offload/optimizer_onload_overlap"] == 0.0 for m in serial)
    assert all(0.3 < m["offload/optimizer_onload_overlap"] < 0.7 for m in overlapped)  # about half the bytes
    for m in serial + overlapped:
        assert m["timing_s/optimizer_onload"] > 0 and m["timing_s/optimizer_onload_exposed"] >= 0
    assert "timing_s/optimizer_onload" not in result["resident"]["metrics"][1]
    assert "timing_s/optimizer_onload" not in result["cancel"]["metrics"][1]  # nothing left the device


def test_the_host_arena_reserved_before_the_first_step_fits_the_state_after_it(result):
    """offload.host_bytes predicts Adam's moments and step counters from the main params alone (for the background
    reservation at start-up); with megatron's distributed optimizer it is exact."""
    r = result["serial"]
    assert r["predicted"] == r["arena_after_first_step"] and r["state_bytes"][0] > 0



@pytest.mark.parametrize("way", ["resident", "serial", "overlap", "cancel"])
def test_the_update_says_where_its_time_went(result, way):
    """A real megatron update's phases (adapters/megatron/phases.py) cover the whole call: nothing of it goes
    unnamed, and the engine's own forward/backward and step timers are two of them."""
    for m in result[way]["metrics"]:
        parts = [m[f"timing_s/actor_{p}"] for p in UPDATE_PHASES]
        assert all(s >= 0 for s in parts) and m["timing_s/actor_forward_backward"] > 0
        assert abs(sum(parts) - m["timing_s/actor_update"]) < 1e-6 * max(1.0, m["timing_s/actor_update"])
        assert not any(k.startswith("memory/actor_") for k in m)  # no CUDA allocator on the CPU
