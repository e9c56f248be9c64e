"""Compose a job config: schema defaults <- YAML file(s) <- preset <- command-line overrides.

Overrides use Hydra's grammar as verl users type it:
  key=value        set an existing key (unknown keys are errors with a did-you-mean)
  +key=value       add a key inside a free-form dict (override_config, engine_kwargs, ...); on a
                   schema key it simply sets it
  ++key=value      set, whether or not it exists
  ~key             back to the default
  preset=NAME / +preset=NAME   merge configs/parallel/NAME.yaml before the other overrides
Values are parsed as YAML (`"['a.parquet','b.parquet']"` is a list, `null` is None) and then coerced to
the field's declared type, so `lr=1e-6` is a float even though YAML 1.1 reads it as a string.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import os
import re
import types
import typing
from typing import Any, Iterable, Optional

import yaml

from ..utils.errors import ConfigError
from .schema import Link, PPOConfig

CONFIG_DIR = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "configs"))
PRESET_DIR = os.path.join(CONFIG_DIR, "parallel")
_INTERP = re.compile(r"\$\{([^}]+)\}")

# verl keys that exist only for its FSDP backend, and what to set instead.
RENAMED = {
    "fsdp_config": "the Megatron backend is configured under *.megatron.* (e.g. actor_rollout_ref.actor.megatron.param_offload)",
    "warmup_style": "use optim.lr_decay_style (Megatron optimizer keys)",
    "min_lr_ratio": "use optim.min_lr (an absolute learning rate)",
    "grad_clip": "use optim.clip_grad",
    "ulysses_sequence_parallel_size": "use megatron.context_parallel_size",
}


# verl 0.9 moved some keys under `reward.`; its 0.9.1 main_ppo reads only the new place and silently ignores the old
# one. Both spellings land on the same field here; setting both to different values is an error.
ALIASES = {"reward.custom_reward_function": "custom_reward_function"}


def canonical_key(key: str) -> str:
    for new, old in ALIASES.items():
        if key == new or key.startswith(new + "."):
            return old + key[len(new):]
    return key


def fold_aliases(data: dict, where: str) -> dict:
    """A YAML mapping with verl 0.9's `reward.custom_reward_function:` moved to its one field."""
    reward = data.get("reward")
    if not isinstance(reward, dict) or "custom_reward_function" not in reward:
        return data
    data = {**data, "reward": {k: v for k, v in reward.items() if k != "custom_reward_function"}}
    if not data["reward"]:
        del data["reward"]
    moved, old = reward["custom_reward_function"] or {}, data.get("custom_reward_function") or {}
    clash = {k for k in moved.keys() & old.keys() if moved[k] != old[k]}
    if clash:
        raise ConfigError(f"{where}: reward.custom_reward_function and custom_reward_function disagree on "
                          f"{sorted(clash)}; they are one setting here: keep one")
    data["custom_reward_function"] = {**old, **moved}
    return data


# ------------------------------------------------------------------------------------------ schema walk
@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _is_free_dict(tp: Any) -> bool:
    tp, _ = _unwrap_optional(tp)
    return tp is dict or typing.get_origin(tp) is dict


def defaults_tree(cls: type = PPOConfig) -> dict[str, Any]:
    """Nested dict of schema defaults (Link objects kept for later resolution)."""
    out: dict[str, Any] = {}
    instance = cls()
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        out[f.name] = _to_tree(value)
    return out


def _to_tree(value: Any) -> Any:
    if isinstance(value, Link):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_tree(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_to_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_tree(v) for k, v in value.items()}
    return value


def all_keys(cls: type = PPOConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the schema (leaves and sections)."""
    keys = []
    for name, tp in _hints(cls).items():
        key = f"{prefix}{name}"
        keys.append(key)
        inner, _ = _unwrap_optional(tp)
        if dataclasses.is_dataclass(inner):
            keys.extend(all_keys(inner, key + "."))
    return keys


def _field_type(path: list[str], cls: type = PPOConfig) -> tuple[Any, bool]:
    """(declared type, inside_free_dict) of a dotted path; KeyError if the schema has no such key."""
    return _field_type_of(tuple(path), cls)


@functools.lru_cache(maxsize=None)  # the schema is fixed: a merge asks the same paths for every config it composes
def _field_type_of(path: tuple[str, ...], cls: type) -> tuple[Any, bool]:
    tp: Any = cls
    for i, part in enumerate(path):
        inner, _ = _unwrap_optional(tp)
        if _is_free_dict(inner):
            return Any, True
        if not dataclasses.is_dataclass(inner):
            raise KeyError(".".join(path[: i + 1]))
        hints = _hints(inner)
        if part not in hints:
            raise KeyError(".".join(path[: i + 1]))
        tp = hints[part]
    return tp, False


def did_you_mean(key: str, cls: type = PPOConfig) -> str:
    leaf = key.rsplit(".", 1)[-1]
    for old, advice in RENAMED.items():
        if leaf == old or f".{old}." in f".{key}.":
            return f" ({key} is a verl FSDP key: {advice})"
    unread = getattr(cls, "UNREAD_KEYS", ())  # keys an entry point's schema has but never reads: not suggested
    keys = [k for k in all_keys(cls) if not (k in unread or k.startswith(tuple(u + "." for u in unread)))]
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    if not close:
        same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
        close = same_leaf[:3] or difflib.get_close_matches(leaf, [k.rsplit(".", 1)[-1] for k in keys], n=1)
        if close and "." not in close[0]:
            close = [k for k in keys if k.endswith("." + close[0])][:3]
    return f"; did you mean {' or '.join(close)}?" if close else ""


# ------------------------------------------------------------------------------------------ tree edits
def _get(tree: dict, path: list[str]) -> Any:
    node: Any = tree
    for p in path:
        if not isinstance(node, dict) or p not in node:
            raise KeyError(".".join(path))
        node = node[p]
    return node


def _set(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for p in path[:-1]:
        nxt = node.get(p)
        if not isinstance(nxt, dict):
            nxt = node[p] = {}
        node = nxt
    node[path[-1]] = value


def merge(base: dict, update: dict, where: str = "", prefix: str = "", schema: type = PPOConfig) -> dict:
    """Recursive merge of `update` into a copy of `base`; unknown schema keys are errors."""
    out = copy.copy(base)
    for k, v in update.items():
        key = f"{prefix}{k}"
        try:
            _, free = _field_type(key.split("."), schema)
        except KeyError:
            raise ConfigError(f"{where}: unknown key {key}{did_you_mean(key, schema)}") from None
        if isinstance(v, dict) and isinstance(out.get(k), dict) and not free:
            out[k] = merge(out[k], v, where, key + ".", schema)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


# ------------------------------------------------------------------------------------------ YAML files
def load_yaml(path: str, _seen: Optional[set] = None) -> dict:
    """A YAML config with an optional `defaults:` list of other files (same folder, no extension)."""
    _seen = _seen or set()
    path = os.path.abspath(path)
    if path in _seen:
        raise ConfigError(f"{path}: `defaults` include each other in a cycle")
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    data = _parsed_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    tree: dict = {}
    for name in data.pop("defaults", []) or []:
        if name == "_self_":
            continue
        sub = os.path.join(os.path.dirname(path), f"{name}.yaml")
        if not os.path.isfile(sub):
            sub = os.path.join(CONFIG_DIR, f"{name}.yaml")
        tree = _deep_update(tree, load_yaml(sub, _seen | {path}))
    return _deep_update(tree, fold_aliases(data, path))


_PARSED: dict[tuple[str, bytes], Any] = {}


def _parsed_yaml(path: str) -> Any:
    """The file's YAML, parsed once per content of the file: `hybridrl plan --search` composes the config once per
    candidate layout (hundreds), and parsing the same dozen files again was 80% of its time. A copy each call:
    load_yaml takes `defaults` out of what it gets."""
    with open(path, "rb") as f:
        key = (path, f.read())
    if key not in _PARSED:
        try:
            _PARSED[key] = yaml.safe_load(key[1].decode("utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from e
    return copy.deepcopy(_PARSED[key])


def _deep_update(base: dict, update: dict) -> dict:
    out = dict(base)
    for k, v in update.items():
        out[k] = _deep_update(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def preset_path(name: str) -> str:
    path = name if name.endswith(".yaml") and os.path.isfile(name) else os.path.join(PRESET_DIR, f"{name}.yaml")
    if not os.path.isfile(path):
        known = sorted(p[:-5] for p in os.listdir(PRESET_DIR) if p.endswith(".yaml")) if os.path.isdir(PRESET_DIR) else []
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(f"preset={name}: no such preset in {PRESET_DIR} (known: {', '.join(known)}){hint}")
    return path


# ------------------------------------------------------------------------------------------ overrides
def parse_value(text: str) -> Any:
    if text == "":
        return ""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(tree: dict, overrides: Iterable[str], schema: type = PPOConfig) -> dict:
    tree = copy.deepcopy(tree)
    defaults = defaults_tree(schema)
    for raw in overrides:
        if raw.startswith("~"):
            path = raw[1:].split("=", 1)[0].split(".")
            try:
                _set(tree, path, copy.deepcopy(_get(defaults, path)))
            except KeyError:
                raise ConfigError(f"override {raw!r}: unknown key {'.'.join(path)}{did_you_mean('.'.join(path), schema)}") from None
            continue
        if "=" not in raw:
            raise ConfigError(f"override {raw!r}: expected key=value (or +key=value, ~key)")
        key, text = raw.split("=", 1)
        force = key.startswith("++")
        add = key.startswith("+")
        key = canonical_key(key.lstrip("+"))
        path = key.split(".")
        if not key or any(not p for p in path):
            raise ConfigError(f"override {raw!r}: malformed key {key!r}")
        try:
            _, free = _field_type(path, schema)
        except KeyError:
            raise ConfigError(f"override {raw!r}: unknown key {key}{did_you_mean(key, schema)}") from None
        if free and not (add or force):
            try:
                _get(tree, path)
            except KeyError:
                raise ConfigError(f"override {raw!r}: {key} is not set yet; add it with +{key}={text}") from None
        _set(tree, path, parse_value(text))
    return tree


def split_preset(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(preset names, remaining overrides): presets merge before the other overrides."""
    presets, rest = [], []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+")
        (presets if key == "preset" else rest).append(o.split("=", 1)[1] if key == "preset" and "=" in o else o)
    return presets, rest


# ------------------------------------------------------------------------------------------ interpolation
def resolve_links(tree: dict, schema: type = PPOConfig) -> dict:
    """Replace Link defaults and `${a.b}` strings by the values they point to."""
    tree = copy.deepcopy(tree)

    def lookup(target: str, stack: tuple) -> Any:
        if target in stack:
            raise ConfigError(f"interpolation cycle: {' -> '.join(stack + (target,))}")
        if target.startswith("."):
            raise ConfigError(f"relative interpolation ${{{target}}} is not supported; write the full key")
        try:
            value = _get(tree, target.split("."))
        except KeyError:
            raise ConfigError(f"interpolation ${{{target}}}: no such key{did_you_mean(target, schema)}") from None
        return resolve(value, stack + (target,))

    def resolve(value: Any, stack: tuple) -> Any:
        if isinstance(value, Link):
            try:
                return lookup(value.target, stack)
            except ConfigError:
                if value.fallback is not None:
                    return value.fallback
                raise
        if isinstance(value, str) and "${" in value:
            m = _INTERP.fullmatch(value.strip())
            if m:
                return lookup(m.group(1).strip(), stack)
            return _INTERP.sub(lambda mm: str(lookup(mm.group(1).strip(), stack)), value)
        if isinstance(value, dict):
            return {k: resolve(v, stack) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v, stack) for v in value]
        return value

    return resolve(tree, ())


# ------------------------------------------------------------------------------------------ typed build
def coerce(value: Any, tp: Any, key: str, root: Optional[type] = None) -> Any:
    inner, optional = _unwrap_optional(tp)
    if value is None:
        if optional or inner is Any:
            return None
        raise ConfigError(f"{key}: null is not allowed here (expects {_type_name(inner)})")
    if inner is Any:
        return value
    if dataclasses.is_dataclass(inner):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expects a section of keys, got {value!r}")
        return build(inner, value, key, root)
    origin = typing.get_origin(inner)
    if origin is list or inner is list:
        (item_tp,) = typing.get_args(inner) or (Any,)
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        return [coerce(v, item_tp, f"{key}[{i}]", root) for i, v in enumerate(items)]
    if origin is dict or inner is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expects a mapping, got {value!r}")
        return dict(value)
    if inner is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"{key}: expects true or false, got {value!r}")
    if inner is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expects an integer, got {value!r}")
        try:
            number = float(value) if isinstance(value, str) else value
            if isinstance(number, float) and not number.is_integer():
                raise ValueError
            return int(number)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expects an integer, got {value!r}") from None
    if inner is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expects a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expects a number, got {value!r}") from None
    if inner is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expects a string, got {value!r}")
        return str(value)
    return value


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def build(cls: type, tree: dict, prefix: str = "", root: Optional[type] = None) -> Any:
    """A frozen dataclass from a resolved tree; unknown keys are errors with a did-you-mean."""
    hints = _hints(cls)
    kwargs = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else k
        if k not in hints:
            raise ConfigError(f"unknown key {key}{did_you_mean(key, root or cls)}")
        kwargs[k] = coerce(v, hints[k], key, root or cls)
    return cls(**kwargs)


# ------------------------------------------------------------------------------------------ entry point
def compose(
    overrides: Iterable[str] = (),
    config_name: Optional[str] = None,
    config_path: Optional[str] = None,
    schema: type = PPOConfig,
) -> dict:
    """The resolved tree (plain dict) of a job: defaults <- config file <- presets <- overrides."""
    tree = defaults_tree(schema)
    if config_name:
        name = config_name if config_name.endswith(".yaml") else f"{config_name}.yaml"
        path = os.path.join(config_path or CONFIG_DIR, name)
        if not os.path.isfile(path) and config_path is None:
            path = os.path.join(CONFIG_DIR, name)
        tree = merge(tree, load_yaml(path), where=path, schema=schema)
    presets, rest = split_preset(list(overrides))
    for p in presets:
        path = preset_path(p)
        tree = merge(tree, load_yaml(path), where=path, schema=schema)
    tree = apply_overrides(tree, rest, schema)
    return resolve_links(tree, schema)


def load_config(
    overrides: Iterable[str] = (),
    config_name: Optional[str] = None,
    config_path: Optional[str] = None,
    schema: type = PPOConfig,
) -> Any:
    """Build the typed job config (a PPOConfig unless another schema is given). Raises ConfigError naming
    the key on any mistake."""
    return build(schema, compose(overrides, config_name, config_path, schema))


def to_dict(cfg: Any) -> Any:
    return _to_tree(cfg)


def to_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)


def defaults_yaml() -> str:
    """The schema defaults as YAML, links written as `${key}` (this is configs/ppo_trainer.yaml)."""

    def render(v: Any) -> Any:
        if isinstance(v, Link):
            return "${" + v.target + "}"
        if isinstance(v, dict):
            return {k: render(x) for k, x in v.items()}
        if isinstance(v, list):
            return [render(x) for x in v]
        return v

    header = ("# Generated from hybridrl/config/schema by `python -m hybridrl.config.dump`; do not edit by hand.\n"
              "# The base PPO config: verl's keys and defaults. Other configs list it under `defaults:`.\n")
    return header + yaml.safe_dump(render(defaults_tree()), sort_keys=False, default_flow_style=False)
