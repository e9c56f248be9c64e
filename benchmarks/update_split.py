"""train_bench's "where the whole update goes": the role's phase clock (adapters/megatron/phases.py) per update, the
time update_policy took as the bench sees it, and the device-wide wait after it returned.

update_seconds (the bench's clock, a device-wide synchronize before and after) = role_update (timing_s/actor_update:
update_policy's own wall time, the sum of its phases) + drain (the device-wide synchronize after it returned: work
on another stream than the compute stream, which the role's stream synchronizations do not wait for) + call overhead.
"""
from __future__ import annotations

from hybridrl.adapters.megatron.phases import COUNTERS, UPDATE_PARTS
from hybridrl.adapters.megatron.phases import UPDATE_PHASES as PHASES

PARTS = tuple(UPDATE_PARTS)


def per_update(metrics: dict, seconds: float, drain: float, role: str = "actor") -> dict[str, float]:
    """One update's split, from update_policy's metrics, the bench's seconds for it and the drain after it."""
    out = {f"phase_{p}_seconds": metrics.get(f"timing_s/{role}_{p}", 0.0) for p in PHASES}
    role_s = metrics.get(f"timing_s/{role}_update", 0.0)
    out.update(update_role_seconds=role_s, update_drain_seconds=drain, update_outside_role_seconds=seconds - role_s)
    for counter in COUNTERS:
        for part in PARTS:
            key = f"memory/{role}_{counter}_{part}"
            if key in metrics:
                out[f"{counter}_{part}"] = metrics[key]
    return out


def mean(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for r in rows for k in r}
    return {k: sum(r.get(k, 0.0) for r in rows) / len(rows) for k in sorted(keys)} if rows else {}


def describe(m: dict) -> list[str]:
    """The summary's lines for a result's metrics (empty for results from before the split)."""
    if "update_role_seconds" not in m:
        return []
    phases = ", ".join(f"{p} {m[f'phase_{p}_seconds']:.2f}" for p in PHASES if f"phase_{p}_seconds" in m)
    lines = [f"- whole update {m['update_seconds']:.2f} s = update_policy {m['update_role_seconds']:.2f} s ({phases}) "
             f"+ {m['update_outside_role_seconds']:.2f} s outside it, of which {m['update_drain_seconds']:.2f} s "
             "waiting for other streams after it returned"]
    counts = [c + " " + "/".join(f"{m[c + '_' + p]:.0f}" for p in PARTS) for c in COUNTERS
              if all(f"{c}_{p}" in m for p in PARTS)]
    if counts:
        lines.append(f"- caching allocator per update ({' / '.join(PARTS)}): {'; '.join(counts)}; peak reserved "
                     f"{m.get('peak_reserved_gib', 0.0):.2f} GiB against {m['peak_memory_gib']:.2f} GiB allocated")
    return lines
