"""Every `vllm` import in verl's FSDP + vLLM rollout files, checked statically against a vLLM source tree.

    python benchmarks/peer_verl/check_vllm_imports.py --verl-site /tmp/verl_site --vllm-site /tmp/site

For each `from vllm.x import a` / `import vllm.x` it says whether module x exists in the given vLLM and defines a
(top-level def/class/assignment/import, or a submodule), and whether verl guards the import (inside try/except,
or in a function that only runs on some path). No vLLM import happens: this runs on a CPU machine.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

# The files verl 0.9.1's FSDP GRPO job with the async vLLM rollout loads (worker, server, weight sync, utils).
FSDP_VLLM_PATH = [
    "verl/workers/rollout/replica.py",
    "verl/workers/rollout/vllm_rollout/__init__.py",
    "verl/workers/rollout/vllm_rollout/vllm_async_server.py",
    "verl/workers/rollout/vllm_rollout/vllm_rollout.py",
    "verl/workers/rollout/vllm_rollout/utils.py",
    "verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py",
    "verl/workers/rollout/vllm_rollout/weight_update_utils.py",
    "verl/workers/rollout/vllm_rollout/delta_weight_transfer.py",
    "verl/workers/config/model.py",
    "verl/utils/vllm/__init__.py",
    "verl/utils/vllm/utils.py",
    "verl/utils/vllm/patch.py",
    "verl/utils/vllm/vllm_quant_utils.py",
    "verl/utils/distributed.py",
    "verl/third_party/vllm/__init__.py",
    "verl/checkpoint_engine/__init__.py",
    "verl/checkpoint_engine/base.py",
    "verl/checkpoint_engine/nccl_checkpoint_engine.py",
]


def module_path(vllm_site: Path, dotted: str) -> Path | None:
    base = vllm_site.joinpath(*dotted.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    if base.is_dir():  # namespace package
        return base
    return None


def defined_names(path: Path) -> set[str]:
    if path.is_dir():
        return {p.stem for p in path.iterdir()}
    names = {p.stem for p in path.parent.iterdir()} if path.name == "__init__.py" else set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # top-level or under if/try: anything a module may bind
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names.add((a.asname or a.name).split(".")[0])
    return names


def guards(tree: ast.AST) -> dict[int, str]:
    """Line -> 'try' when inside a try body, 'lazy' when inside a function, else absent."""
    out: dict[int, str] = {}

    def visit(node, ctx):
        for child in ast.iter_child_nodes(node):
            c = ctx
            if isinstance(node, ast.Try) and child in node.body:
                c = "try"
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and ctx != "try":
                c = "lazy"
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out[child.lineno] = c or "top"
            visit(child, c)

    visit(tree, None)
    return out


def check(verl_site: Path, vllm_site: Path, files=FSDP_VLLM_PATH) -> list[dict]:
    rows = []
    for rel in files:
        f = verl_site / rel
        if not f.is_file():
            rows.append({"file": rel, "line": 0, "import": "(file absent in this verl)", "ok": True, "where": ""})
            continue
        tree = ast.parse(f.read_text())
        where = guards(tree)
        for node in ast.walk(tree):
            items = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
                items = [(node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                items = [(a.name, None) for a in node.names if a.name.split(".")[0] == "vllm"]
            for mod, name in items:
                p = module_path(vllm_site, mod)
                ok = p is not None and (name is None or name in defined_names(p))
                text = f"from {mod} import {name}" if name else f"import {mod}"
                rows.append({"file": rel, "line": node.lineno, "import": text, "ok": ok,
                             "where": where.get(node.lineno, "top")})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verl-site", type=Path, required=True)
    ap.add_argument("--vllm-site", type=Path, required=True)
    args = ap.parse_args(argv)
    rows = check(args.verl_site, args.vllm_site)
    for r in sorted(rows, key=lambda r: (r["ok"], r["file"], r["line"])):
        print(f"{'ok     ' if r['ok'] else 'MISSING'} {r['where']:5s} {r['file']}:{r['line']}  {r['import']}")
    bad_top = [r for r in rows if not r["ok"] and r["where"] == "top"]
    print(f"{len(rows)} imports, {sum(not r['ok'] for r in rows)} missing in this vLLM, {len(bad_top)} unguarded")
    return 1 if bad_top else 0


if __name__ == "__main__":
    sys.exit(main())
