"""Security audit of the product code: loading a file must not run code, and nothing listens beyond
localhost by default. (That secrets stay out of checkpoints, logs and output is checked on a real run
in tests/e2e/test_faults.py.)

The scan parses every module of hybridrl/ and adapters/ and flags:
  - torch.load without weights_only=True (pickle: a checkpoint could run code on load);
  - pickle / cPickle / dill / marshal / shelve loads, and numpy loads with allow_pickle=True;
  - yaml.load / yaml.unsafe_load / yaml.full_load (only yaml.safe_load builds plain data);
  - eval / exec / compile of strings (config values are data, never code).
"""
from __future__ import annotations

import ast
import os
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRODUCT_DIRS = ("hybridrl", "adapters")
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "marshal", "shelve", "cloudpickle"}
UNSAFE_LOADERS = {"load", "loads", "Unpickler", "open"}


def product_files() -> list[str]:
    files = []
    for top in PRODUCT_DIRS:
        for folder, dirs, names in os.walk(os.path.join(ROOT, top)):
            # hybridrl/adapters is a link to adapters/: scanned once, under adapters/
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d)) and d != "__pycache__"]
            files += [os.path.join(folder, n) for n in names if n.endswith(".py")]
    return sorted(files)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _kw(call: ast.Call, name: str):
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def unsafe_calls(source: str, filename: str = "<src>") -> list[str]:
    """'file:line: what' for every unsafe call in `source`."""
    tree = ast.parse(source, filename)
    aliases: dict[str, str] = {}  # local name -> dotted origin, from imports
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        head, _, rest = name.partition(".")
        full = f"{aliases.get(head, head)}{'.' + rest if rest else ''}"
        module, _, attr = full.rpartition(".")
        where = f"{filename}:{node.lineno}"
        if full == "torch.load" and not _is_true(_kw(node, "weights_only")):
            found.append(f"{where}: torch.load without weights_only=True")
        elif module.split(".")[0] in UNSAFE_MODULES and attr in UNSAFE_LOADERS:
            found.append(f"{where}: {full}")
        elif full in ("numpy.load", "np.load") and _is_true(_kw(node, "allow_pickle")):
            found.append(f"{where}: numpy.load(allow_pickle=True)")
        elif full in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all", "yaml.unsafe_load_all"):
            found.append(f"{where}: {full} (use yaml.safe_load)")
        elif full in ("eval", "exec", "compile", "builtins.eval", "builtins.exec"):
            found.append(f"{where}: {full}()")
    return found


def test_the_scan_finds_every_kind_of_unsafe_load():
    src = textwrap.dedent("""
        import pickle, yaml, torch
        import numpy as np
        from torch import load as tload
        import dill as d
        torch.load("a")
        torch.load("a", weights_only=False)
        tload("a")
        pickle.loads(b"")
        d.load(open("f"))
        np.load("x.npy", allow_pickle=True)
        yaml.load("a: 1", Loader=yaml.Loader)
        eval("1 + 1")
        exec("x = 1")
        torch.load("ok", weights_only=True)
        yaml.safe_load("a: 1")
        np.load("ok.npy")
        model.eval()
    """)
    found = unsafe_calls(src)
    assert [f.split(": ", 1)[1] for f in found] == [
        "torch.load without weights_only=True", "torch.load without weights_only=True",
        "torch.load without weights_only=True", "pickle.loads", "dill.load", "numpy.load(allow_pickle=True)",
        "yaml.load (use yaml.safe_load)", "eval()", "exec()",
    ], found


# The one place that runs code on purpose: the Python tool's child process, after its sandbox is in place
# (namespaces, rlimits, Landlock, seccomp; tests/unit/test_sandbox_redteam.py). Exact file and call, any other use fails.
SANDBOX = os.path.join("hybridrl", "agent", "tools", "sandbox", "child.py")
ALLOWED = {(SANDBOX, "exec()"), (SANDBOX, "compile()")}


def test_product_code_never_unpickles_or_evaluates():
    files = product_files()
    assert len(files) > 50 and any(f.endswith(os.path.join("adapters", "megatron", "checkpoint.py")) for f in files)
    found = []
    for path in files:
        with open(path) as f:
            found += unsafe_calls(f.read(), os.path.relpath(path, ROOT))
    found = [f for f in found if (f.split(":")[0], f.split(": ", 1)[1]) not in ALLOWED]
    assert not found, "unsafe loads in product code:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("include_dashboard", [None, True])
def test_init_ray_binds_the_dashboard_to_localhost(monkeypatch, include_dashboard):
    import ray

    from hybridrl.controller import runtime_env

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw) or "ctx")
    monkeypatch.setattr(runtime_env.atexit, "register", lambda fn: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert runtime_env.init_ray(num_cpus=2, include_dashboard=include_dashboard) == "ctx"
    assert seen["dashboard_host"] == "127.0.0.1"
    assert seen["include_dashboard"] is bool(include_dashboard)
    run_tmp = os.path.dirname(seen["_temp_dir"])  # Ray's session folder goes into a folder of this run ...
    assert seen["runtime_env"]["env_vars"]["TMPDIR"] == os.path.join(run_tmp, "tmp") and os.path.isdir(run_tmp)
    runtime_env.shutdown_ray()  # ... which shutdown removes
    assert not os.path.exists(run_tmp)
