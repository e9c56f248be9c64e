"""One cuDNN per process: transformer-engine is pointed at the cuDNN that torch loads.

Transformer-engine loads cuDNN itself at import, preferring a system copy (CUDNN_HOME, CUDNN_PATH, CUDA_HOME, then
the loader's path) over the pip wheel torch ships with. On a host that has both (the GPU host: a system cuDNN 9 in
/lib/x86_64-linux-gnu, torch's in nvidia/cudnn), the first one loaded wins each shared-object name, so the two mix
whenever torch touched cuDNN before transformer-engine was imported (vLLM, then peft importing TE):
`libcudnn_heuristic.so.9: undefined symbol ... version libcudnn_graph.so.9` (H100, 2026-11-28). Setting CUDNN_HOME
to torch's copy, unless the user set one, makes the order irrelevant. Nothing is imported here (no torch).
"""
from __future__ import annotations

import glob
import importlib.util
import os
from typing import Mapping, MutableMapping, Optional

__all__ = ["torch_cudnn_home", "pin_cudnn_for_transformer_engine"]


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
    if _user_set(env):
        return None
    home = home or torch_cudnn_home()
    if home:
        env["CUDNN_HOME"] = home
    return home


def _user_set(env: Mapping[str, str]) -> bool:
    return bool(env.get("CUDNN_HOME") or env.get("CUDNN_PATH"))
