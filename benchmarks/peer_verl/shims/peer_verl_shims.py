"""Shims for running verl 0.9.1 unmodified on the GPU host (vLLM 0.26.0, torch 2.11, transformers 5.10.4).

check_vllm_imports.py found every vLLM import on verl's FSDP + async-vLLM path present in 0.26.0 or guarded,
so MOVED is empty: nothing is patched. The mechanism stays so a module that turns out moved on the GPU can be
aliased here (old dotted path -> new dotted path) without touching verl's files. install() runs in every
process through sitecustomize.py beside this file (the driver, Ray workers, vLLM's engine processes), and
sets PEER_VERL_SHIMS_LOADED so a worker can show that it ran.
"""
import importlib
import importlib.abc
import importlib.util
import os
import sys

MOVED: dict[str, str] = {}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass


def install() -> None:
    if any(isinstance(f, _Alias) for f in sys.meta_path):
        return
    if MOVED:
        sys.meta_path.insert(0, _Alias())
    os.environ["PEER_VERL_SHIMS_LOADED"] = "1"
