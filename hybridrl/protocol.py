"""DataProto: the batch that flows between the driver and the workers.

A batch of `len(self)` rows held as
  * `batch`: tensors whose first dimension is the row dimension (input_ids, attention_mask, ...),
  * `non_tensor_batch`: numpy object arrays of the same length (data_source, ground truths, ...),
  * `meta_info`: per-batch values that are not per-row (temperature, global step, ...).

Every operation keeps rows aligned across the two dicts; shapes are checked on construction so a
misaligned batch fails where it is built, not three stages later.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch

__all__ = ["DataProto", "DispatchInfo", "pad_to_multiple", "unpad"]


def _as_object_array(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


@dataclass(frozen=True)
class DispatchInfo:
    """A worker's data-parallel position, declared with `Worker.set_dispatch_info`: which share of a DataProto
    it takes (dp_rank of dp_size) and whether its output is collected (one rank per dp group answers)."""

    dp_rank: int
    dp_size: int
    is_collect: bool


@dataclass
class DataProto:
    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensor_batch = {k: _as_object_array(v) for k, v in self.non_tensor_batch.items()}
        self._check_lengths()

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Sequence[Any]] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> "DataProto":
        return cls(dict(tensors or {}), dict(non_tensors or {}), dict(meta_info or {}))

    def _check_lengths(self) -> None:
        lengths = {f"batch[{k!r}]": v.shape[0] for k, v in self.batch.items() if v.dim() > 0}
        lengths.update({f"non_tensor_batch[{k!r}]": len(v) for k, v in self.non_tensor_batch.items()})
        for k, v in self.batch.items():
            if v.dim() == 0:
                raise ValueError(f"DataProto: batch[{k!r}] is a scalar; per-batch values belong in meta_info")
        if len(set(lengths.values())) > 1:
            raise ValueError(f"DataProto: rows disagree in length: {lengths}")

    def __len__(self) -> int:
        for v in self.batch.values():
            return v.shape[0]
        for v in self.non_tensor_batch.values():
            return len(v)
        return 0

    def __repr__(self) -> str:
        tensors = {k: (tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in self.batch.items()}
        return f"DataProto(len={len(self)}, batch={tensors}, non_tensor={list(self.non_tensor_batch)}, meta={list(self.meta_info)})"

    # ----------------------------------------------------------------- row selection
    def __getitem__(self, index: int | slice | Sequence[int] | torch.Tensor | np.ndarray) -> "DataProto":
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        if isinstance(index, slice):
            np_index: Any = index
            t_index: Any = index
        else:
            np_index = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index, dtype=np.int64)
            t_index = torch.as_tensor(np_index, dtype=torch.long)
        return DataProto(
            {k: v[t_index] for k, v in self.batch.items()},
            {k: v[np_index] for k, v in self.non_tensor_batch.items()},
            dict(self.meta_info),
        )

    def reorder(self, indices: Sequence[int] | torch.Tensor) -> "DataProto":
        """Rows in the order given (a permutation or any index list)."""
        return self[indices if isinstance(indices, torch.Tensor) else list(indices)]

    # ----------------------------------------------------------------- key selection
    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
    ) -> "DataProto":
        """A view with only the named keys (None keeps all of that kind)."""

        def pick(d: dict, keys: Iterable[str] | None, what: str) -> dict:
            if keys is None:
                return dict(d)
            missing = [k for k in keys if k not in d]
            if missing:
                raise KeyError(f"DataProto.select: no {what} keys {missing}; present: {sorted(d)}")
            return {k: d[k] for k in keys}

        return DataProto(
            pick(self.batch, batch_keys, "tensor"),
            pick(self.non_tensor_batch, non_tensor_batch_keys, "non-tensor"),
            pick(self.meta_info, meta_info_keys, "meta_info"),
        )

    def pop(
        self,
        batch_keys: Iterable[str] = (),
        non_tensor_batch_keys: Iterable[str] = (),
        meta_info_keys: Iterable[str] = (),
    ) -> "DataProto":
        """Remove the named keys from self and return them as a new DataProto."""
        out = self.select(list(batch_keys), list(non_tensor_batch_keys), list(meta_info_keys))
        for k in out.batch:
            del self.batch[k]
        for k in out.non_tensor_batch:
            del self.non_tensor_batch[k]
        for k in out.meta_info:
            del self.meta_info[k]
        return out

    def union(self, other: "DataProto") -> "DataProto":
        """Keys of both; a key present in both must hold equal values (a silent overwrite hides bugs)."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"DataProto.union: lengths differ ({len(self)} vs {len(other)})")
        batch = dict(self.batch)
        for k, v in other.batch.items():
            if k in batch and not (batch[k].shape == v.shape and torch.equal(batch[k], v)):
                raise ValueError(f"DataProto.union: tensor key {k!r} differs between the two batches")
            batch[k] = v
        non_tensor = dict(self.non_tensor_batch)
        for k, v in other.non_tensor_batch.items():
            if k in non_tensor and not _object_arrays_equal(non_tensor[k], v):
                raise ValueError(f"DataProto.union: non-tensor key {k!r} differs between the two batches")
            non_tensor[k] = v
        meta = dict(self.meta_info)
        for k, v in other.meta_info.items():
            if k in meta and not _values_equal(meta[k], v):
                raise ValueError(f"DataProto.union: meta_info key {k!r} differs between the two batches")
            meta[k] = v
        return DataProto(batch, non_tensor, meta)

    # ----------------------------------------------------------------- splitting and joining
    def chunk(self, chunks: int) -> list["DataProto"]:
        """`chunks` equal parts; the length must divide (pad first with `pad_to_multiple`)."""
        n = len(self)
        if chunks <= 0 or n % chunks:
            raise ValueError(
                f"DataProto.chunk: {n} rows do not split into {chunks} equal chunks; "
                f"pad with pad_to_multiple(data, {chunks}) first"
            )
        return self.split(n // chunks) if n else [DataProto({}, {}, dict(self.meta_info)) for _ in range(chunks)]

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive parts of `split_size` rows (the last may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"DataProto.split: split_size must be positive, got {split_size}")
        return [self[i : i + split_size] for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(parts: Sequence["DataProto"]) -> "DataProto":
        """Rows of all parts in order; meta_info of the first part."""
        if not parts:
            raise ValueError("DataProto.concat: nothing to concatenate")
        keys = set(parts[0].batch), set(parts[0].non_tensor_batch)
        for i, p in enumerate(parts):
            if (set(p.batch), set(p.non_tensor_batch)) != keys:
                raise ValueError(f"DataProto.concat: part {i} has keys {sorted(p.batch)}/{sorted(p.non_tensor_batch)}, "
                                 f"part 0 has {sorted(keys[0])}/{sorted(keys[1])}")
        batch = {k: torch.cat([p.batch[k] for p in parts]) for k in parts[0].batch}
        non_tensor = {k: np.concatenate([p.non_tensor_batch[k] for p in parts]) for k in parts[0].non_tensor_batch}
        return DataProto(batch, non_tensor, dict(parts[0].meta_info))

    def repeat(self, repeat_times: int, interleave: bool = True) -> "DataProto":
        """Each row `repeat_times` times: a a b b (interleave) or a b a b."""
        if repeat_times < 1:
            raise ValueError(f"DataProto.repeat: repeat_times must be >= 1, got {repeat_times}")
        if interleave:
            batch = {k: v.repeat_interleave(repeat_times, dim=0) for k, v in self.batch.items()}
            non_tensor = {k: np.repeat(v, repeat_times, axis=0) for k, v in self.non_tensor_batch.items()}
        else:
            batch = {k: v.repeat(repeat_times, *([1] * (v.dim() - 1))) for k, v in self.batch.items()}
            non_tensor = {k: np.tile(v, repeat_times) for k, v in self.non_tensor_batch.items()}
        return DataProto(batch, non_tensor, dict(self.meta_info))

    def to(self, device: str | torch.device) -> "DataProto":
        return DataProto({k: v.to(device) for k, v in self.batch.items()}, dict(self.non_tensor_batch), dict(self.meta_info))


def pad_to_multiple(data: DataProto, k: int) -> tuple[DataProto, int]:
    """Pad by repeating rows from the start until len % k == 0. Returns (padded, pad_size).

    Repeated real rows (not zeros) keep every downstream computation finite; `unpad` strips them.
    """
    if k <= 0:
        raise ValueError(f"pad_to_multiple: k must be positive, got {k}")
    n = len(data)
    if n == 0:
        raise ValueError("pad_to_multiple: cannot pad an empty batch")
    pad = (-n) % k
    if pad == 0:
        return data, 0
    idx = [i % n for i in range(pad)]
    return DataProto.concat([data, data[idx]]), pad


def unpad(data: DataProto, pad_size: int) -> DataProto:
    return data[: len(data) - pad_size] if pad_size else data


def _object_arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object)))
    try:
        return bool(a == b)
    except Exception:
        return a is b
