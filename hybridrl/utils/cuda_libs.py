"""One cuDNN per process: transformer-engine is pointed at the cuDNN that torch loads.

Transformer-engine loads cuDNN itself at import, preferring a system copy (CUDNN_HOME, CUDNN_PATH, CUDA_HOME, then
the loader's path) over the pip wheel torch ships with. On a host that has both (the GPU host: a system cuDNN 9 in
/lib/x86_64-linux-gnu, torch's in nvidia/cudnn), the first one loaded wins each shared-object name, so the two mix
whenever torch touched cuDNN before transformer-engine was imported (vLLM, then peft importing TE):
`libcudnn_heuristic.so.9: undefined symbol ... version libcudnn_graph.so.9` (H100, 2026-11-28). Setting CUDNN_HOME
to torch's copy, unless the user set one, points TE's own cuDNN load there, but not its core library's: that one
names cuDNN's parts (libcudnn_heuristic ...) as dependencies, which the loader takes from the system's path unless a
copy of the same name is loaded already, and the same error came back with CUDNN_HOME set (H200 x2, 2026-11-28,
test_vllm_lora in its spawned child). So torch's parts are loaded too, each by its full path, before anything else
can load one: then every name resolves to torch's copy whatever imports first. Nothing is imported here (no torch).
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
from typing import Callable, Mapping, MutableMapping, Optional

__all__ = ["torch_cudnn_home", "pin_cudnn_for_transformer_engine", "preload_torch_cudnn"]

# cuDNN 9's parts in the order that loaded on the GPU host (H200, 2026-11-28): graph, which all others need, first
CUDNN_PARTS = ("graph", "ops", "heuristic", "cnn", "adv", "engines_precompiled", "engines_runtime_compiled")


def torch_cudnn_home() -> Optional[str]:
    """The folder of the pip cuDNN next to torch (nvidia/cudnn, with lib/libcudnn.so.*), or None."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        home = os.path.join(root, "cudnn")
        if glob.glob(os.path.join(home, "lib", "libcudnn.so*")):
            return home
    return None


def pin_cudnn_for_transformer_engine(environ: Optional[MutableMapping[str, str]] = None,
                                     home: Optional[str] = None) -> Optional[str]:
    """CUDNN_HOME := torch's cuDNN when neither CUDNN_HOME nor CUDNN_PATH is set; returns what it set (or None)."""
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    home = home or torch_cudnn_home()
    # a child process inherits the CUDNN_HOME its parent's `import hybridrl` set: that is no user's choice, and the
    # child needs the preload too (test_vllm_lora's spawned child did not get it: 4 setup errors, H200 x4, 2026-11-28)
    inherited = bool(home) and env.get("CUDNN_HOME") == home and not env.get("CUDNN_PATH")
    if _user_set(env) and not inherited:
        return None
    if home:
        env["CUDNN_HOME"] = home
        if _has_transformer_engine():  # its only reader: a host without it loads nothing more at import
            preload_torch_cudnn(home)
    return home


def _has_transformer_engine() -> bool:
    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        return False


def preload_torch_cudnn(home: str, load: Callable[[str], object] = lambda path: ctypes.CDLL(
        path, mode=ctypes.RTLD_GLOBAL)) -> list[str]:
    """Load torch's cuDNN parts, then libcudnn itself, from HOME/lib by full path; returns the paths loaded. A part
    that is missing or will not load (another build, a CPU host) is passed over: transformer-engine then fails or
    not as it would have, and the import of hybridrl never does."""
    loaded = []
    for name in (*(f"libcudnn_{part}" for part in CUDNN_PARTS), "libcudnn"):
        paths = sorted(glob.glob(os.path.join(home, "lib", f"{name}.so.*")), key=len)
        if not paths:
            continue
        try:
            load(paths[0])
        except OSError:
            continue
        loaded.append(paths[0])
    return loaded


def _user_set(env: Mapping[str, str]) -> bool:
    return bool(env.get("CUDNN_HOME") or env.get("CUDNN_PATH"))
