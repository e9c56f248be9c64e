"""Loading user code by path and name: custom reward functions, dataset classes, adapters, losses.

User code is loaded only from the location the user passes (a .py file, or `pkg://dotted.module` for an
installed module); nothing is searched for on sys.path implicitly. `key` names the config key the location
came from, so an error tells the user exactly what to fix.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from typing import Any

PKG_PREFIX = "pkg://"


def load_module(path: str, key: str = "path") -> Any:
    """Import a Python file (or `pkg://module`) once per absolute path."""
    if path.startswith(PKG_PREFIX):
        name = path[len(PKG_PREFIX):]
        try:
            return importlib.import_module(name)
        except ImportError as e:
            raise ImportError(f"{key}={path}: cannot import module {name!r}: {e}") from e
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise FileNotFoundError(f"{key}={path}: no such file ({full})")
    if not full.endswith(".py"):
        raise ValueError(f"{key}={path}: expected a .py file (or {PKG_PREFIX}module.name)")
    mod_name = "hybridrl_user_" + hashlib.sha1(full.encode()).hexdigest()[:12]
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, full)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[mod_name]
        raise ImportError(f"{key}={path}: importing the file raised {type(e).__name__}: {e}") from e
    return module


def load_object(path: str, name: str, key: str = "path", name_key: str = "name") -> Any:
    """`name` from the module at `path`; the error lists what the module does define."""
    module = load_module(path, key)
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise AttributeError(f"{name_key}={name}: {path} defines no {name!r}; it defines {public}")
    return getattr(module, name)
