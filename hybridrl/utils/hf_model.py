"""Turn `actor_rollout_ref.model.path` into a local HuggingFace folder every component can read.

Megatron import, the converter and both rollout engines read `config.json`, `*.safetensors` and the
tokenizer files from one folder. A folder that already has them is used as is. A GGUF model (e.g. the
offline SmolLM2 package) is dequantized once through transformers and written as such a folder under
a cache directory keyed by the file's size and mtime, so later runs reuse it.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import tempfile
from typing import Optional

HF_CACHE_ENV = "HYBRIDRL_MODEL_CACHE"


def model_cache_root() -> str:
    """Where derived model files live ($HYBRIDRL_MODEL_CACHE, default ~/.cache/hybridrl/models)."""
    return os.environ.get(HF_CACHE_ENV, os.path.join(os.path.expanduser("~"), ".cache", "hybridrl", "models"))


def find_gguf(path: str, gguf_file: Optional[str]) -> Optional[str]:
    if gguf_file:
        full = gguf_file if os.path.isabs(gguf_file) else os.path.join(path, gguf_file)
        if not os.path.isfile(full):
            raise FileNotFoundError(f"actor_rollout_ref.model.gguf_file={gguf_file}: no such file in {path}")
        return full
    if os.path.isfile(os.path.join(path, "config.json")):
        return None
    found = sorted(glob.glob(os.path.join(path, "*.gguf")))
    if len(found) > 1:
        raise ValueError(f"{path} holds several .gguf files {[os.path.basename(f) for f in found]}; "
                         "choose one with actor_rollout_ref.model.gguf_file")
    return found[0] if found else None


def materialize_hf_dir(path: str, gguf_file: Optional[str] = None, cache_dir: Optional[str] = None,
                       weights: bool = True, key: str = "actor_rollout_ref.model.path") -> str:
    """A local folder with config.json, safetensors weights and tokenizer files for the model at `path`.
    `weights=False`: the job starts from random weights (every role's load_weight=false and the rollout's
    load_format=dummy), so config.json and the tokenizer are enough. `key`: the config key named in errors."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"{key}={path}: not a local folder (models are never downloaded at run time; "
            "point it at a folder with config.json + *.safetensors, or a folder holding a .gguf file)")
    gguf = find_gguf(path, gguf_file)
    if gguf is None:
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"{key}={path}: no config.json, so not a HuggingFace model folder"
                                    + (" (the folder is empty)" if not os.listdir(path) else ""))
        if weights and not glob.glob(os.path.join(path, "*.safetensors")):
            raise FileNotFoundError(f"{key}={path}: config.json found but no *.safetensors weights (or start from random "
                                    "weights: actor_rollout_ref.actor.load_weight=false, and ref.load_weight=false "
                                    "with a reference)")
        return path
    st = os.stat(gguf)
    key = hashlib.sha1(f"{gguf}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:16]
    out = os.path.join(cache_dir or model_cache_root(), f"{os.path.basename(gguf)[:-5]}-{key}")
    if os.path.isfile(os.path.join(out, ".complete")):
        return out
    _dequantize(gguf, out)
    return out


def iter_hf_weights(model_dir: str):
    """(name, tensor) of every weight in the folder's *.safetensors files, one file open at a time."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights")
    for path in files:
        with safe_open(path, "pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def _dequantize(gguf: str, out: str) -> None:
    """Write the folder under a name of this process's beside `out`, then rename it to `out` once complete: two runs
    that start together on a fresh machine (two lease lanes) each write their own, and neither reads a file the other
    is still writing (in place, the first to finish could read a model.safetensors the second was rewriting). The
    second to finish finds `out` there and drops its copy."""
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    part = tempfile.mkdtemp(prefix=os.path.basename(out) + ".part-", dir=parent)
    os.chmod(part, 0o755)  # as os.makedirs made it (mkdtemp's is the owner's only)
    try:
        _write_hf_dir(gguf, part, out)
        open(os.path.join(part, ".complete"), "w").close()
        try:
            os.rename(part, out)
        except OSError:  # `out` exists: another run's (complete), or an older in-place writer's leftover
            if not os.path.isfile(os.path.join(out, ".complete")):
                shutil.rmtree(out, ignore_errors=True)
                os.rename(part, out)
    finally:
        shutil.rmtree(part, ignore_errors=True)  # gone after the rename; else this run's copy, not needed


def _write_hf_dir(gguf: str, out: str, shown: str) -> None:
    """The HF folder of `gguf` (config.json, model.safetensors, the tokenizer files) in `out` (made already)."""
    try:
        import gguf as _  # noqa: F401  transformers needs it to read GGUF
    except ImportError:
        raise ImportError(f"{gguf}: reading GGUF models needs the `gguf` package (pip install gguf)") from None
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridrl.utils.gguf_tokens import pin_gguf_special_tokens

    folder, name = os.path.dirname(gguf), os.path.basename(gguf)
    print(f"hybridrl: dequantizing {name} into {shown} (once; later runs reuse it)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    pin_gguf_special_tokens(tokenizer, gguf)  # the special tokens as the file says, not as transformers read them
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # safetensors refuses shared storage; HF re-ties on load
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the weights are dequantized: engines must not look for GGUF
    config["architectures"] = config.get("architectures") or [type(model).__name__]  # vLLM picks its class by it
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tokenizer.save_pretrained(out)
    with open(os.path.join(out, "source.json"), "w") as f:
        json.dump({"gguf": gguf}, f)
