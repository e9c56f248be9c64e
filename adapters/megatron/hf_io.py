"""Reading and writing HuggingFace safetensors folders, tensor by tensor.

The reader opens files lazily (safetensors `safe_open`) and reads only the row/column ranges a rank
needs, so importing a 70B checkpoint at tp=8 never materialises a full tensor per rank. The writer
streams buckets to numbered shards and writes the index at the end.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
from typing import Iterable, Optional

import torch

INDEX = "model.safetensors.index.json"
# Files copied next to exported weights so the folder loads with transformers (config + tokenizer).
HF_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                 "chat_template.jinja", "chat_template.json")


class SafetensorsReader:
    """`reader(name, rows, cols)` over a folder of *.safetensors (with or without an index)."""

    def __init__(self, folder: str) -> None:
        self.folder = os.path.expanduser(folder)
        self.where = self._locate()
        self._open: dict[str, object] = {}

    def _locate(self) -> dict[str, str]:
        index = os.path.join(self.folder, INDEX)
        if os.path.isfile(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            missing = sorted({fn for fn in weight_map.values() if not os.path.isfile(os.path.join(self.folder, fn))})
            if missing:
                raise FileNotFoundError(f"{index} lists shards that are missing from {self.folder}: {missing}")
            return dict(weight_map)
        files = sorted(glob.glob(os.path.join(self.folder, "*.safetensors")))
        if not files:
            bins = glob.glob(os.path.join(self.folder, "*.bin"))
            hint = " (found *.bin: re-save the model with save_pretrained(safe_serialization=True))" if bins else ""
            raise FileNotFoundError(f"{self.folder}: no *.safetensors weights{hint}")
        from safetensors import safe_open

        where = {}
        for path in files:
            with safe_open(path, framework="pt") as f:
                where.update({k: os.path.basename(path) for k in f.keys()})
        return where

    def has(self, name: str) -> bool:
        return name in self.where

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def __call__(self, name: str, rows: Optional[slice] = None, cols: Optional[slice] = None) -> torch.Tensor:
        sl = self._slice(name)
        if rows is None and cols is None:
            return sl[:]
        rows = rows or slice(None)
        return sl[rows, cols] if cols is not None else sl[rows]

    def _slice(self, name: str):
        if name not in self.where:
            raise KeyError(f"{self.folder}: tensor {name!r} is not in the checkpoint "
                           f"({len(self.where)} tensors; is this the right model family?)")
        fn = self.where[name]
        if fn not in self._open:
            from safetensors import safe_open

            self._open[fn] = safe_open(os.path.join(self.folder, fn), framework="pt")
        return self._open[fn].get_slice(name)


class SafetensorsWriter:
    """Writes buckets of (name, tensor) as model-0000i-of-0000N.safetensors plus the index."""

    def __init__(self, folder: str, dtype: Optional[torch.dtype] = None) -> None:
        self.folder = folder
        self.dtype = dtype
        self.files: list[tuple[str, list[str]]] = []
        self.total_bytes = 0
        os.makedirs(folder, exist_ok=True)

    def write(self, bucket: Iterable[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file

        tensors = {}
        for name, t in bucket:
            t = t.detach().to("cpu", self.dtype or t.dtype).contiguous()
            tensors[name] = t
            self.total_bytes += t.numel() * t.element_size()
        if not tensors:
            return
        tmp = f"part-{len(self.files):05d}.safetensors"
        save_file(tensors, os.path.join(self.folder, tmp), metadata={"format": "pt"})
        self.files.append((tmp, list(tensors)))

    def close(self) -> None:
        n = len(self.files)
        if n == 1:
            os.replace(os.path.join(self.folder, self.files[0][0]), os.path.join(self.folder, "model.safetensors"))
            return
        weight_map = {}
        for i, (tmp, names) in enumerate(self.files):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            os.replace(os.path.join(self.folder, tmp), os.path.join(self.folder, final))
            weight_map.update({name: final for name in names})
        with open(os.path.join(self.folder, INDEX), "w") as f:
            json.dump({"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}, f, indent=2)


def copy_side_files(src: str, dst: str) -> list[str]:
    """Copy config/tokenizer files that exist in `src` to `dst`; returns the names copied."""
    copied = []
    os.makedirs(dst, exist_ok=True)
    for name in HF_SIDE_FILES:
        path = os.path.join(src, name)
        if os.path.isfile(path):
            shutil.copy2(path, os.path.join(dst, name))
            copied.append(name)
    return copied
