"""The files a validated config points at, checked before start-up (no Ray, no worker, no model load).

validate.py checks the config's own values; this checks what they name, in seconds, so that a wrong folder or a
data column fails with the key to change instead of 30-60 s later inside a worker:
  - model folders (actor_rollout_ref.model.path, and critic.model.path when a critic runs): a folder, not empty,
    a config.json that parses, *.safetensors weights where a role reads them, tokenizer files;
  - data.max_prompt_length + data.max_response_length against the model's max_position_embeddings;
  - data files: each a file with a supported extension, its first rows holding data.prompt_key,
    data.reward_fn_key and reward_model.ground_truth (of a type the built-in scorers take, without a custom
    reward function); nothing when data.custom_cls names a dataset class;
  - the custom reward function: loads, and accepts the keywords its reward manager passes.
Each problem is one line naming the key (or file) to fix; all are reported together.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any, Optional

from .loader import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")
SAMPLE_ROWS = 64
SCALARS = (str, int, float)


def check_inputs(run: Any) -> None:
    cfg, d = run.cfg, run.derived
    errors: list[str] = []
    model = cfg.actor_rollout_ref.model
    hf = _model_folder("actor_rollout_ref.model.path", model.path, model.gguf_file, _weights_read(run), errors)
    if hf is not None:
        _tokenizer_files(cfg.data.tokenizer or model.path, "data.tokenizer" if cfg.data.tokenizer else
                         "actor_rollout_ref.model.path", errors)
        _lengths({**hf, **(model.override_config or {})}, cfg.data, errors)
    if d.use_critic:
        _model_folder("critic.model.path", cfg.critic.model.path, cfg.critic.model.gguf_file, False, errors)
    custom = getattr(cfg.data, "custom_cls", None)
    if not (custom is not None and getattr(custom, "path", None)):  # a custom dataset class reads its own files
        for key, files in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
            for path in ([files] if isinstance(files, str) else list(files or [])):
                _data_file(key, path, cfg.data, bool(cfg.custom_reward_function.path), errors)
    _reward_function(cfg, errors)
    if errors:
        raise ConfigError("\n  ".join(errors))


def _weights_read(run: Any) -> bool:
    """Whether a role reads the actor folder's weights (not when every role starts from random weights)."""
    ara, d = run.cfg.actor_rollout_ref, run.derived
    return bool(ara.actor.load_weight or (d.use_reference and ara.ref.load_weight) or ara.rollout.load_format != "dummy")


def _model_folder(key: str, path: str, gguf_file: Optional[str], weights: bool, errors: list[str]) -> Optional[dict]:
    """The parsed config.json, or None (an error recorded, or a GGUF model whose config comes later)."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(full):
        default = " (the default: the key is not set)" if path.startswith("~/models/") else ""
        errors.append(f"{key}={path}{default}: not a local folder; point it at a HuggingFace model folder "
                      "(config.json, *.safetensors, tokenizer files) or one holding a .gguf file")
        return None
    if gguf_file or glob.glob(os.path.join(full, "*.gguf")):
        return None
    names = os.listdir(full)
    if not names:
        errors.append(f"{key}={full}: the folder is empty; point it at a HuggingFace model folder (config.json, "
                      "*.safetensors, tokenizer files)")
        return None
    config_path = os.path.join(full, "config.json")
    if "config.json" not in names:
        errors.append(f"{key}={full}: no config.json, so not a HuggingFace model folder (it holds {', '.join(sorted(names)[:5])}"
                      f"{'...' if len(names) > 5 else ''})")
        return None
    try:
        with open(config_path) as f:
            hf = json.load(f)
    except (OSError, ValueError) as e:
        errors.append(f"{config_path}: not valid JSON ({e}); restore it from the original model")
        return None
    if not isinstance(hf, dict):
        errors.append(f"{config_path}: expected a JSON object, found a {type(hf).__name__}")
        return None
    if weights and not glob.glob(os.path.join(full, "*.safetensors")):
        errors.append(f"{key}={full}: config.json but no *.safetensors weights (.bin/.pt checkpoints are not read: "
                      "convert them; or start from random weights with actor_rollout_ref.actor.load_weight=false)")
    return hf


def _tokenizer_files(path: str, key: str, errors: list[str]) -> None:
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(full) or glob.glob(os.path.join(full, "*.gguf")):
        return  # a missing folder is reported once, by the model check; GGUF files carry their tokenizer
    if not any(os.path.isfile(os.path.join(full, n)) for n in TOKENIZER_FILES) and not glob.glob(
            os.path.join(full, "*.tiktoken")):
        errors.append(f"{key}={full}: no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}); copy them from the "
                      "original model, or point data.tokenizer at a folder that has them")


def _lengths(hf: dict, data: Any, errors: list[str]) -> None:
    limit = hf.get("max_position_embeddings")
    total = data.max_prompt_length + data.max_response_length
    if isinstance(limit, int) and not hf.get("rope_scaling") and total > limit:
        errors.append(f"data.max_prompt_length={data.max_prompt_length} + data.max_response_length="
                      f"{data.max_response_length} = {total} tokens exceed the model's max_position_embeddings={limit}; "
                      "lower them so that the sum fits")


def _data_file(key: str, path: str, data: Any, custom_reward: bool, errors: list[str]) -> None:
    from hybridrl.data.readers import SUPPORTED_EXTENSIONS

    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
        errors.append(f"{key}: {full} is a folder; list its data files ({', '.join(SUPPORTED_EXTENSIONS)}) instead")
        return
    if not os.path.isfile(full):
        errors.append(f"{key}: {full}: no such file")
        return
    ext = os.path.splitext(full)[1].lower()
    if ext not in SUPPORTED_EXTENSIONS:
        errors.append(f"{key}: {full}: unknown extension {ext!r}; supported: {', '.join(SUPPORTED_EXTENSIONS)}")
        return
    try:
        rows, columns = _first_rows(full, ext)
    except Exception as e:  # noqa: BLE001 - any reader error is a bad file; the dataset reports it in full later
        errors.append(f"{key}: {full}: unreadable ({type(e).__name__}: {e})")
        return
    for column in (data.prompt_key, data.reward_fn_key, "reward_model"):
        if column not in columns:
            fix = {data.prompt_key: "data.prompt_key", data.reward_fn_key: "data.reward_fn_key"}.get(column)
            errors.append(f"{key}: {full} has no {column!r} column (it has {', '.join(columns)})"
                          + (f"; set {fix} to the column to use" if fix else "; verl's format holds "
                             "reward_model={'ground_truth': ...} per row"))
            return
    for i, row in enumerate(rows):
        problem = _ground_truth_problem(row.get("reward_model"), custom_reward)
        if problem:
            errors.append(f"{key}: {full}: row {i}: {problem}")
            return


def _ground_truth_problem(rm: Any, custom_reward: bool) -> Optional[str]:
    """The reward managers need reward_model['ground_truth']; the built-in scorers compare it as text (a custom
    reward function takes whatever it takes)."""
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        return f"reward_model is {rm!r:.80}; expected a dict with 'ground_truth'"
    if custom_reward:
        return None
    gt = rm["ground_truth"]
    ok = isinstance(gt, SCALARS) or (isinstance(gt, (list, tuple)) and all(isinstance(g, SCALARS) for g in gt))
    if not ok or isinstance(gt, bool):
        return (f"reward_model.ground_truth is a {type(gt).__name__} ({gt!r:.60}); the scorers compare text: "
                "store a string, a number, or a list of them")
    return None


def _first_rows(path: str, ext: str) -> tuple[list[dict], list[str]]:
    import pyarrow.parquet as pq

    from hybridrl.data.readers import _read_arrow

    if ext == ".jsonl":
        rows = []
        with open(path) as f:
            for line in f:
                if line.strip():
                    rows.append(json.loads(line))
                if len(rows) >= SAMPLE_ROWS:
                    break
        return rows, sorted({k for r in rows for k in r})
    if ext == ".parquet":
        pf = pq.ParquetFile(path)
        batch = next(pf.iter_batches(batch_size=SAMPLE_ROWS), None)
        return ([] if batch is None else batch.to_pylist()), list(pf.schema_arrow.names)
    table = _read_arrow(path)
    return table.slice(0, SAMPLE_ROWS).to_pylist(), list(table.column_names)


def _reward_function(cfg: Any, errors: list[str]) -> None:
    if not cfg.custom_reward_function.path:
        return
    from hybridrl.reward import load_reward_fn

    try:
        load_reward_fn(cfg.custom_reward_function, cfg.reward_model.reward_manager, None,
                       reward_fn_key=cfg.data.reward_fn_key)
    except (ImportError, AttributeError, TypeError, ValueError, OSError, SyntaxError) as e:
        errors.append(str(e).splitlines()[0] if str(e) else f"custom_reward_function.path: {type(e).__name__}")
