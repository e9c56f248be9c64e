"""The LoRA engine's KV-only sleep on CPU (issue 40, hybridrl/rollout/vllm_kv_sleep.py): against a stand-in for vLLM
0.26's CuMemAllocator with the same records (pointer_to_data: ptr -> AllocationData(handle, tag, cpu_backup_tensor,
is_asleep); handle = (device, size, ptr, cumem handle)) and its two handle functions, recording what they were
given; and VLLMLoraEngine's sleep / wake_up on top of it (a stand-in LLM)."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from hybridrl.rollout.lora import RolloutLora
from hybridrl.rollout.vllm_kv_sleep import AllocatorMismatch, check_allocator, set_kv_mapped, tag_bytes


@dataclass
class AllocationData:  # vllm.device_allocator.AllocationData (0.26)
    handle: tuple
    tag: str
    cpu_backup_tensor: Optional[Any] = None
    is_asleep: bool = False


class FakeAllocator:
    """Two weight allocations and three KV-cache ones (sizes distinct, so every byte count says which were moved)."""

    def __init__(self) -> None:
        sizes = {0x1000: ("weights", 7 << 20), 0x2000: ("weights", 5 << 20), 0x3000: ("kv_cache", 3 << 20),
                 0x4000: ("kv_cache", 11 << 20), 0x5000: ("kv_cache", 13 << 20)}
        self.pointer_to_data = {ptr: AllocationData((0, size, ptr, 100 + i), tag)
                                for i, (ptr, (tag, size)) in enumerate(sizes.items())}
        self.unmapped: list[tuple] = []
        self.mapped: list[tuple] = []

    def unmap_and_release(self, handle: tuple) -> None:
        self.unmapped.append(handle)

    def create_and_map(self, handle: tuple) -> None:
        self.mapped.append(handle)

    def handles(self, tag: str) -> list[tuple]:
        return [d.handle for d in self.pointer_to_data.values() if d.tag == tag]


def test_kv_only_sleep_releases_exactly_the_kv_cache_and_wake_maps_only_it():
    a = FakeAllocator()
    kv, weights = a.handles("kv_cache"), a.handles("weights")
    assert set_kv_mapped(a, False, a.unmap_and_release, a.create_and_map) == (3 + 11 + 13) << 20
    assert a.unmapped == kv and a.mapped == []
    assert all(d.is_asleep == (d.tag == "kv_cache") for d in a.pointer_to_data.values())
    assert all(d.cpu_backup_tensor is None for d in a.pointer_to_data.values())  # nothing copied to the host
    assert tag_bytes(a) == {"weights": {"mapped": 12 << 20, "asleep": 0, "host_copy": 0},
                            "kv_cache": {"mapped": 0, "asleep": 27 << 20, "host_copy": 0}}
    assert set_kv_mapped(a, False, a.unmap_and_release, a.create_and_map) == 0  # already released: nothing twice
    assert a.unmapped == kv
    assert set_kv_mapped(a, True, a.unmap_and_release, a.create_and_map) == 27 << 20
    assert a.mapped == kv and not set(a.mapped) & set(weights)
    assert not any(d.is_asleep for d in a.pointer_to_data.values())
    assert set_kv_mapped(a, True, a.unmap_and_release, a.create_and_map) == 0 and a.mapped == kv


def test_allocator_check_names_what_differs_and_the_key():
    a = FakeAllocator()
    module = SimpleNamespace(unmap_and_release=a.unmap_and_release, create_and_map=a.create_and_map)
    check_allocator("0.26.0", a, module)
    with pytest.raises(AllocatorMismatch, match=r"vLLM 0\.27\.1 .*lora_base_resident=false"):
        check_allocator("0.27.1", a, module)
    with pytest.raises(AllocatorMismatch, match="no create_and_map"):
        check_allocator("0.26.0", a, SimpleNamespace(unmap_and_release=a.unmap_and_release))
    renamed = FakeAllocator()
    renamed.pointer_to_data = {p: SimpleNamespace(handle=d.handle, tag=d.tag) for p, d in a.pointer_to_data.items()}
    with pytest.raises(AllocatorMismatch, match="lacks is_asleep, cpu_backup_tensor"):
        check_allocator("0.26.0", renamed, module)
    retagged = FakeAllocator()
    for d in retagged.pointer_to_data.values():
        d.tag = "default"
    with pytest.raises(AllocatorMismatch, match="tagged"):
        check_allocator("0.26.0", retagged, module)
    with pytest.raises(AllocatorMismatch, match="no pointer_to_data"):
        check_allocator("0.26.0", SimpleNamespace(), module)


def _engine(base_resident: bool):
    """VLLMLoraEngine without vLLM: its LLM a stand-in that records sleep / wake_up / the worker calls."""
    from hybridrl.rollout import vllm_lora

    a = FakeAllocator()
    calls: list[Any] = []
    llm = SimpleNamespace(reset_prefix_cache=lambda: calls.append("reset_prefix_cache") or True,
                          sleep=lambda level: calls.append(("llm.sleep", level)),
                          wake_up=lambda tags: calls.append(("llm.wake_up", tags)),
                          collective_rpc=lambda fn: calls.append(("rpc", fn)))
    engine = vllm_lora.VLLMLoraEngine.__new__(vllm_lora.VLLMLoraEngine)
    engine.llm, engine.lora, engine.base_resident = llm, RolloutLora(4, 4.0, ("q_proj",)), base_resident
    engine._kv_ops = (a, a.unmap_and_release, a.create_and_map) if base_resident else None
    engine.sleeps, engine._asleep, engine._kv_awake = {"kv_only": 0, "level1": 0}, False, True
    return engine, a, calls


def test_resident_engine_sleeps_without_vllms_sleep_and_keeps_the_weights():
    from hybridrl.rollout.vllm_lora import _after_kv_wake

    engine, a, calls = _engine(base_resident=True)
    for _ in range(3):  # WeightSync's order: sleep (release), wake weights, wake KV (push)
        engine.sleep()
        assert calls == ["reset_prefix_cache"], calls  # the prefix cache goes with the KV; vLLM's sleep never runs
        assert a.unmapped == a.handles("kv_cache") and not a.mapped
        engine.wake_up(["weights"])
        assert not a.mapped and not calls[1:]  # the base is awake already: nothing mapped, nothing copied
        engine.wake_up(["kv_cache"])
        assert a.mapped == a.handles("kv_cache") and calls[1:] == [("rpc", _after_kv_wake)]
        calls.clear(), a.unmapped.clear(), a.mapped.clear()
    assert engine.sleeps == {"kv_only": 3, "level1": 0}
    assert tag_bytes(a)["weights"] == {"mapped": 12 << 20, "asleep": 0, "host_copy": 0}


def test_engine_without_a_resident_base_sleeps_at_level_1():
    engine, a, calls = _engine(base_resident=False)
    engine.sleep(level=2)
    engine.wake_up(["weights"])
    assert calls == [("llm.sleep", 1), ("llm.wake_up", ["weights"])] and not a.unmapped
    assert engine.sleeps == {"kv_only": 0, "level1": 1}


def test_after_kv_wake_runs_vllms_post_wake_hook():
    from hybridrl.rollout.vllm_lora import _after_kv_wake

    ran = []
    _after_kv_wake(SimpleNamespace(model_runner=SimpleNamespace(post_kv_cache_wake_up=lambda: ran.append(1))))
    assert ran == [1]
