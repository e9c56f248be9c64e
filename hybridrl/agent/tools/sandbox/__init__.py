"""Running untrusted code: the parent's runner (runner.py) and the child's OS-level isolation (isolation.py).

Tools call `run_sandboxed`; none of them runs code (exec, subprocess) itself. What each layer stops is listed in
isolation.py; tests/unit/test_sandbox_redteam.py tries to get past every one with the in-process hook off.
"""
from .runner import LAYERS, SandboxResult, run_sandboxed

__all__ = ["LAYERS", "SandboxResult", "run_sandboxed"]
