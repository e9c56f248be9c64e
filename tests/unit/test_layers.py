"""The package's layers import downwards only: a module may import its own package and the packages of lower layers.
A new upward import fails here, and so does a listed exception once it is gone (the list only shrinks; issue 36).
Imports inside functions count: they are still a dependency, only a deferred one. benchmarks/ (scripts importing each
other by file name) has no import circle, and the package never imports it."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# lowest first; the agent loop drives rollout engines; config validates names against the registries below it
# (advantages, losses, tools, readers)
# model_rewards (reward model + judge) reads the validated reward_model.* and loads tokenizers: above config and data
LAYERS = [("utils",), ("protocol",), ("algos", "reward"), ("rollout",), ("agent",), ("data",), ("config",),
          ("model_rewards",), ("adapters",), ("hybrid", "plan"), ("controller",), ("workers",),
          ("trainer", "model_merger", "torchrun")]
RANK = {pkg: i for i, names in enumerate(LAYERS) for pkg in names}
# the adapter interface (ActorModel, WeightRegion) is a contract beside DataProto: engines and workers both use it
RANK["adapters.base"] = RANK["protocol"]
# upward imports allowed as exceptions: (importing file, imported module). Empty since issue 36 moved the last three
# down (attention backend names to config/, normalize_argv to config/cli.py, ConfigError to utils/); keep it so.
KNOWN: set[tuple[str, str]] = set()


def _package(path: str) -> str:
    parts = path.split("/")
    if parts[0] == "adapters":
        return "adapters.base" if parts[1:] == ["base.py"] else "adapters"
    return parts[1].removesuffix(".py")


def _target(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "hybridrl" or len(parts) < 2:
        return None
    return "adapters.base" if parts[1:3] == ["adapters", "base"] else parts[1]


def _imports(path: str):
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for top in ("hybridrl", "adapters"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")
                own = _package(path)
                for module in _imports(path):
                    target = _target(module)
                    if target and target != own and RANK.get(target, -1) > RANK.get(own, len(LAYERS)):
                        found.add((path, module))
    return found


def test_every_package_has_a_layer():
    packages = {n.removesuffix(".py") for n in os.listdir(os.path.join(ROOT, "hybridrl"))
                if not n.startswith("_") and (n.endswith(".py") or os.path.isdir(os.path.join(ROOT, "hybridrl", n)))}
    packages = {p for p in packages if p != "__pycache__"} | {"adapters"}
    assert packages <= set(RANK) | {"cli"}, f"give these a layer in LAYERS: {sorted(packages - set(RANK) - {'cli'})}"


def test_no_new_upward_imports():
    found = upward_imports()
    assert found - KNOWN == set(), f"upward imports (move the code down, or the import up): {sorted(found - KNOWN)}"
    assert KNOWN - found == set(), f"gone, take them off KNOWN: {sorted(KNOWN - found)}"


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The walker finds a function-level import from a lower layer to a higher one (the test can fail)."""
    os.makedirs(tmp_path / "hybridrl" / "utils")
    (tmp_path / "hybridrl" / "utils" / "x.py").write_text("def f():\n    from hybridrl.trainer import main_ppo\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", str(tmp_path))
    assert upward_imports() == {("hybridrl/utils/x.py", "hybridrl.trainer")}


# ------------------------------------------------------------------------------------------------ benchmarks/
# benchmarks/ holds scripts that import each other by file name (their folder is on sys.path): `import scale_report`,
# `from peer_verl import settings`, and inside peer_verl/ `import settings`. They must not import in a circle, and the
# package never imports them (DESIGN.md: peer runs and benchmarks are never imported by the package).
def benchmark_modules(root: str) -> dict[str, str]:
    """{module key ("four_gpu", "peer_verl/rows"): file path} of every .py under root/benchmarks."""
    base = os.path.join(root, "benchmarks")
    found = {}
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found[os.path.relpath(path, base)[:-3].replace(os.sep, "/")] = path
    return found


def _benchmark_targets(key: str, path: str, modules: dict[str, str]) -> set[str]:
    """The benchmark modules `path` imports: a name resolves in the importer's own folder first, then in benchmarks/."""
    own = key.rsplit("/", 1)[0] + "/" if "/" in key else ""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            rel = name.replace(".", "/")
            for candidate in (own + rel, rel):
                if candidate in modules and candidate != key:
                    out.add(candidate)
                    break
    return out


def benchmark_cycles(root: str) -> list[list[str]]:
    modules = benchmark_modules(root)
    graph = {k: _benchmark_targets(k, p, modules) for k, p in modules.items()}
    cycles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_benchmarks_import_no_circle():
    assert benchmark_cycles(ROOT) == [], "benchmarks/ modules import each other in a circle"


def test_the_package_never_imports_a_benchmark():
    tops = {k for k in benchmark_modules(ROOT) if "/" not in k} | {"benchmarks", "peer_verl"}
    found = set()
    for top in ("hybridrl", "adapters"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.relpath(os.path.join(folder, name), ROOT)
                    found |= {(path, m) for m in _imports(path) if m.split(".")[0] in tops}
    assert not found, f"the package imports benchmark scripts: {sorted(found)}"


def test_the_check_sees_a_benchmark_circle(tmp_path):
    (tmp_path / "benchmarks" / "peer_verl").mkdir(parents=True)
    (tmp_path / "benchmarks" / "a.py").write_text("import b\n")
    (tmp_path / "benchmarks" / "b.py").write_text("def f():\n    from peer_verl import c\n")
    (tmp_path / "benchmarks" / "peer_verl" / "c.py").write_text("import d\nimport a\n")
    (tmp_path / "benchmarks" / "peer_verl" / "d.py").write_text("x = 1\n")
    assert benchmark_cycles(str(tmp_path)) == [["a", "b", "peer_verl/c", "a"]]
