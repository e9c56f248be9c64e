"""Checks that a weight sync was right, and the rollout-vs-actor log-prob gap.

Checksum of one tensor: the float64 sum of its elements (`tensor_checksum`). It is the one number
every engine can produce cheaply where it holds the weight, even sharded (a sum of shard sums) or
fused (a sum of member sums), so one definition serves the torch and the vLLM engines.
What it catches: a tensor that was never loaded (still random / dummy / stale), a tensor loaded under
the wrong name, a truncated or scaled copy, a dtype mix-up. What it does not: a permutation inside a
tensor (swapped heads, a transpose of a square matrix). Those are the mapping's job, proven bitwise by
the HF <-> Megatron round-trip tests and the reshard tests, and show up at run time in the log-prob gap.

Tolerance: |engine - sender| <= rtol * sum(|x|) (the float64 summation error bound scales with the
sum of magnitudes, not with the sum itself, which may be ~0). Both sides sum the same values: the
sender first rounds each tensor to the engine's `weight_dtype`. The torch engine sums with the same
kernel on the same dtype and layout, so its rtol is 0: bitwise equal. Engines that sum in another
order (sharded across GPUs, fused) declare a small rtol (`RolloutEngine.checksum_rtol`).

Which tensors: `sample_fraction` of them, picked by a hash of (step, name) so every rank of every
replica checks the same tensors at a step without talking, and a different subset the next step
(the members of a fused engine parameter are picked together, by the first member's name).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from hybridrl.utils.checksum import checksums, tensor_abs_sum, tensor_checksum  # noqa: F401  (tensor_checksum: re-exported)


class WeightSyncError(RuntimeError):
    """The rollout engine does not hold what the actor sent (names the tensor)."""


def is_sampled(name: str, step: int, fraction: float) -> bool:
    """Deterministic per (step, name): all ranks agree without communication."""
    if fraction >= 1.0:
        return True
    h = zlib.crc32(f"{step}:{name}".encode())
    return h / 2**32 < fraction


# name -> [(sent name, coefficient)]: what the engine's checksum of `name` adds up
Terms = Callable[[str], list[tuple[str, float]]]


@dataclass
class SentChecksums:
    """Sender-side checksums of the sampled tensors of one sync."""

    step: int
    fraction: float
    weight_dtype: Optional[torch.dtype] = None
    terms: Optional[Terms] = None  # the engine's checksum_terms: members of one fused check are sampled together

    def __post_init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._abs: dict[str, torch.Tensor] = {}
        self._batches: list[tuple[list[str], torch.Tensor, torch.Tensor]] = []  # record_many's: names, sums, abs sums

    def record(self, name: str, t: torch.Tensor) -> None:
        group = self.terms(name)[0][0] if self.terms is not None else name
        if not is_sampled(group, self.step, self.fraction):
            return
        if self.weight_dtype is not None and t.dtype != self.weight_dtype:
            t = t.to(self.weight_dtype)  # sum what the engine will hold, not what was sent
        self._sums[name] = tensor_checksum(t)
        self._abs[name] = tensor_abs_sum(t)

    def record_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in bucket:
            self.record(name, tensor)

    def record_many(self, items: Sequence[tuple[str, torch.Tensor]]) -> None:
        """record() of many tensors in a few kernels (checksum.checksums: the same sums up to the order of their
        float64 additions), for an engine that compares within a tolerance (checksum_rtol > 0)."""
        terms, step, fraction = self.terms, self.step, self.fraction
        picked = items if fraction >= 1.0 else [
            (name, t) for name, t in items if is_sampled(terms(name)[0][0] if terms is not None else name, step, fraction)]
        if not picked:
            return
        dtype = self.weight_dtype
        sums, abss = checksums([t for _, t in picked] if dtype is None else
                               [t if t.dtype == dtype else t.to(dtype) for _, t in picked])
        self._batches.append(([name for name, _ in picked], sums, abss))

    def names(self) -> list[str]:
        return list(self._sums) + [name for names, _, _ in self._batches for name in names]

    def values(self) -> tuple[dict[str, float], dict[str, float]]:
        """(sums, abs sums) as Python floats: one host sync for all of them."""
        names = list(self._sums)
        sums = [torch.stack([self._sums[k] for k in names])] if names else []
        abss = [torch.stack([self._abs[k] for k in names])] if names else []
        for batch, s, a in self._batches:
            names, sums, abss = names + batch, sums + [s], abss + [a]
        if not names:
            return {}, {}
        return dict(zip(names, torch.cat(sums).cpu().tolist())), dict(zip(names, torch.cat(abss).cpu().tolist()))


def compare_checksums(
    sent: SentChecksums,
    engine_sums: dict[str, float],
    *,
    rtol: float,
) -> dict[str, float]:
    """Raise WeightSyncError naming the first tensor whose engine checksum differs; return metrics.

    `sent.terms(name)` says which sent tensors (with coefficients) the engine's checksum of `name`
    aggregates, e.g. a fused qkv parameter: [(q, 1), (k, 1), (v, 1)]. Default: the tensor itself.
    """
    sums, abss = sent.values()
    worst = 0.0
    for name in sums:
        got = engine_sums.get(name)
        if got is None:
            raise WeightSyncError(f"weight check: the engine returned no checksum for {name!r}")
        expected, scale = _expected(name, sums, abss, sent.terms) if sent.terms is not None else (sums[name], abss[name])
        diff = abs(got - expected)
        if not diff <= rtol * scale:  # `not <=` so a NaN fails too
            raise WeightSyncError(
                f"weight check at step {sent.step}: {name!r} differs between actor and rollout engine: "
                f"engine sum {got!r} vs sent sum {expected!r} (|diff| {diff:.3e} > rtol {rtol:g} x sum|x| {scale:.3e}). "
                f"The engine's copy was not (fully) loaded from this sync, or loaded under another name")
        worst = max(worst, diff / scale if scale > 0 else diff)
    return {"sync_check/tensors_checked": float(len(sums)), "sync_check/max_rel_diff": worst}


def _expected(name: str, sums: dict[str, float], abss: dict[str, float], terms: Optional[Terms]) -> tuple[float, float]:
    parts = terms(name) if terms is not None else [(name, 1.0)]
    missing = [m for m, _ in parts if m not in sums]
    if missing:
        # a fused parameter's members must be checked together; the hash sampled only some of them
        raise WeightSyncError(f"weight check: {name!r} needs the checksums of {missing}, which were not recorded "
                              f"(sample fused members together: see RolloutEngine.checksum_terms)")
    return sum(c * sums[m] for m, c in parts), sum(abs(c) * abss[m] for m, c in parts)


def logprob_gap(rollout_log_probs: torch.Tensor, actor_log_probs: torch.Tensor,
                response_mask: torch.Tensor) -> dict[str, float]:
    """Mean and max |rollout - actor| log-prob over response tokens (the sync's run-time check)."""
    if rollout_log_probs.shape != actor_log_probs.shape or rollout_log_probs.shape != response_mask.shape:
        raise ValueError(f"logprob_gap: shapes differ: rollout {tuple(rollout_log_probs.shape)}, "
                         f"actor {tuple(actor_log_probs.shape)}, mask {tuple(response_mask.shape)}")
    mask = response_mask.bool()
    diff = (rollout_log_probs.double() - actor_log_probs.double()).abs()[mask]
    if diff.numel() == 0:
        return {"rollout_vs_actor/logprob_abs_diff_mean": 0.0, "rollout_vs_actor/logprob_abs_diff_max": 0.0}
    return {
        "rollout_vs_actor/logprob_abs_diff_mean": float(diff.mean()),
        "rollout_vs_actor/logprob_abs_diff_max": float(diff.max()),
    }



def routing_agreement(batch: dict) -> dict[str, float]:
    """Mixture-of-experts models whose rollout returned its routing: the mean, over response tokens whose rollout
    routing is known, of the fraction of MoE layers in which the actor's top-k experts are the rollout's
    (`routing_agreement` [B, R] from the actor's log-prob pass, -1 where unknown). {} without it."""
    if "routing_agreement" not in batch:
        return {}
    agreement = batch["routing_agreement"]
    valid = batch["response_mask"].bool() & (agreement >= 0)
    if not bool(valid.any()):
        return {}
    values = agreement[valid].double()
    return {"rollout_vs_actor/routing_agreement": float(values.mean()),
            "rollout_vs_actor/routing_agreement_min": float(values.min())}
