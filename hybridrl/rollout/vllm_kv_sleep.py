"""The colocated vLLM engine's KV-only sleep: free the KV cache, keep the weights mapped (LoRA's frozen base).

vLLM's sleep mode allocates every weight under CuMemAllocator's tag "weights" and the KV cache under "kv_cache"
(vllm/v1/worker/gpu_worker.py: load_model, initialize_from_config). Its level 1 copies the "weights" allocations to
freshly pinned host memory and back at every sleep and wake (device_allocator/cumem.py, synchronous cudaMemcpy:
0.42 s + 0.49 s a step for the 7B's 15 GB on an H100); its level 2 discards them. With LoRA the base never changes,
so when the GPU can hold it through training (`hybridrl plan`, rollout.lora_base_resident) the engine releases only
the "kv_cache" allocations: `set_kv_mapped(allocator, False, ...)` unmaps and releases their physical memory and
keeps their virtual addresses (as vLLM's own sleep does, so the captured CUDA graphs stay valid); `True` maps new
memory at the same addresses. The KV contents are gone, so the caller resets vLLM's prefix cache first (vLLM's
sleep does the same through pause_scheduler(clear_cache=True)).

vLLM has no such mode: this works on the allocator's own records (pointer_to_data: ptr -> AllocationData with
handle, tag, is_asleep, cpu_backup_tensor) and the module's unmap_and_release / create_and_map, which are vLLM
internals. `allocator_ops` checks the version and those names first and fails with the key that turns this off.
"""
from __future__ import annotations

from typing import Any, Callable

KV_TAG = "kv_cache"
WEIGHTS_TAG = "weights"
TESTED_VLLM = ("0.26.",)  # versions whose cumem.py this was written against
ENTRY_FIELDS = ("handle", "tag", "is_asleep", "cpu_backup_tensor")
KEY = "actor_rollout_ref.rollout.lora_base_resident"

Handle = Any  # (device, size, ptr, cumem handle): vllm.device_allocator.HandleType


class AllocatorMismatch(RuntimeError):
    """vLLM's sleep-mode allocator is not the one the KV-only sleep was written against."""


def check_allocator(version: str, allocator: Any, module: Any) -> None:
    """Raise AllocatorMismatch unless vLLM `version`'s CuMemAllocator instance and its module have what
    set_kv_mapped uses."""
    problems = []
    if not version.startswith(TESTED_VLLM):
        problems.append(f"vLLM {version} (written against {', '.join(v + 'x' for v in TESTED_VLLM)})")
    for name in ("unmap_and_release", "create_and_map"):
        if not callable(getattr(module, name, None)):
            problems.append(f"vllm.device_allocator.cumem has no {name}()")
    records = getattr(allocator, "pointer_to_data", None)
    if not isinstance(records, dict):
        problems.append("CuMemAllocator has no pointer_to_data dict")
    else:
        for data in records.values():
            missing = [f for f in ENTRY_FIELDS if not hasattr(data, f)]
            if missing:
                problems.append(f"its AllocationData lacks {', '.join(missing)}")
                break
        tags = {getattr(d, "tag", None) for d in records.values()}
        if records and not {KV_TAG, WEIGHTS_TAG} <= tags:
            problems.append(f"its allocations are tagged {sorted(map(str, tags))}, not {WEIGHTS_TAG!r} and {KV_TAG!r}")
    if problems:
        raise AllocatorMismatch("the KV-only sleep of the LoRA rollout engine (base kept on the GPU) reads vLLM's "
                                f"sleep-mode allocator, which differs here: {'; '.join(problems)}. Set {KEY}=false "
                                "(vLLM's own level-1 sleep: the base to host memory and back)")


def allocator_ops() -> tuple[Any, Callable[[Handle], None], Callable[[Handle], None]]:
    """(CuMemAllocator instance, unmap_and_release, create_and_map) of this process's vLLM, checked."""
    import vllm
    from vllm.device_allocator import cumem

    allocator = cumem.CuMemAllocator.get_instance()
    check_allocator(getattr(vllm, "__version__", "unknown"), allocator, cumem)
    return allocator, cumem.unmap_and_release, cumem.create_and_map


def set_kv_mapped(allocator: Any, mapped: bool, unmap_and_release: Callable[[Handle], None],
                  create_and_map: Callable[[Handle], None]) -> int:
    """Release (mapped False) or map back (True) every KV-cache allocation not already so; the weights' are not
    touched. Returns the bytes released or mapped. The GPU must be idle on the KV cache before a release."""
    moved = 0
    for data in allocator.pointer_to_data.values():
        if data.tag != KV_TAG or data.is_asleep != mapped:
            continue
        if mapped:
            create_and_map(data.handle)
        else:
            unmap_and_release(data.handle)
        data.is_asleep = not mapped
        moved += data.handle[1]
    return moved


def tag_bytes(allocator: Any) -> dict[str, dict[str, int]]:
    """Bytes by tag and state ("mapped", "asleep", "host_copy": held in a pinned host backup): what a sleep kept."""
    out: dict[str, dict[str, int]] = {}
    for data in allocator.pointer_to_data.values():
        entry = out.setdefault(data.tag, {"mapped": 0, "asleep": 0, "host_copy": 0})
        entry["asleep" if data.is_asleep else "mapped"] += data.handle[1]
        if data.cpu_backup_tensor is not None:
            entry["host_copy"] += data.handle[1]
    return out
