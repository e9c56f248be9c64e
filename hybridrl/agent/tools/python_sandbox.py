"""A Python code tool: the model's code runs in a child process with limits, in a fresh temp directory.

What the sandbox does (see sandbox_child.py):
  - a separate `python -I -S` process (no user site, no environment variables read, no site-packages),
    environment emptied but PATH; no proxy variables; working directory and HOME a new temp dir, removed after;
  - limits set with resource.setrlimit before the code runs: address space (memory_mb), CPU seconds,
    file size, no core dumps; a wall-clock timeout kills the whole process group;
  - an audit hook (sys.addaudithook, which code cannot remove) refuses sockets, starting processes
    (subprocess, os.system/exec/spawn/fork), ctypes and native library loading, os.kill, importing
    socket/ctypes/multiprocessing, and opening files for writing outside the temp dir.
What it does NOT stop (it is not a security boundary against a determined attacker; run untrusted
models' code in a container or VM as well):
  - reading any file this user can read (no chroot, no namespaces): /etc/passwd, the training data;
  - a C extension that is already loaded doing anything it likes; interpreter bugs that bypass audit hooks;
  - using all of one CPU core until the timeout, or filling the temp dir up to the file-size limit per file;
  - if the trainer runs as root: rlimits can be raised back by root code only through syscalls the audit hook
    does not see (e.g. a loaded extension), so the same caveat applies.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from typing import Any

from .base import BaseTool

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")


class PythonSandboxTool(BaseTool):
    """Tool arguments: {"code": "<python>"}; the observation is stdout (and stderr's last lines on an error).
    config: timeout_s (wall clock, default 5), memory_mb (256), cpu_seconds (timeout_s rounded up),
    file_mb (16), max_output_chars (2000)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            return "Error: the argument 'code' must be a non-empty string", 0.0, {"error": 1.0}
        result = await run_sandboxed(code, **self._limits())
        metrics = {"error": float(result.error), "timeout": float(result.timed_out)}
        return result.observation(int(self.config.get("max_output_chars", 2000))), 0.0, metrics

    def _limits(self) -> dict[str, Any]:
        c = self.config
        timeout = float(c.get("timeout_s", 5.0))
        return {"timeout_s": timeout, "memory_mb": int(c.get("memory_mb", 256)),
                "cpu_seconds": int(c.get("cpu_seconds", max(1, int(timeout + 0.999)))),
                "file_mb": int(c.get("file_mb", 16))}


class SandboxResult:
    def __init__(self, stdout: str, stderr: str, returncode: int, timed_out: bool, timeout_s: float) -> None:
        self.stdout, self.stderr, self.returncode = stdout, stderr, returncode
        self.timed_out, self.timeout_s = timed_out, timeout_s

    @property
    def error(self) -> bool:
        return self.timed_out or self.returncode != 0

    def observation(self, max_chars: int) -> str:
        if self.timed_out:
            text = f"Error: the code ran past the time limit of {self.timeout_s:g}s and was stopped"
        elif self.returncode != 0:
            tail = "\n".join(self.stderr.strip().splitlines()[-3:]) or f"exit status {self.returncode}"
            if self.returncode < 0:
                tail += f" (killed by signal {-self.returncode}: a resource limit?)"
            text = (self.stdout + ("\n" if self.stdout else "") + "Error: " + tail).strip()
        else:
            text = self.stdout.strip()
        return text if len(text) <= max_chars else text[: max_chars - 15] + "...[truncated]"


async def run_sandboxed(code: str, *, timeout_s: float = 5.0, memory_mb: int = 256, cpu_seconds: int = 5,
                        file_mb: int = 16) -> SandboxResult:
    workdir = tempfile.mkdtemp(prefix="hybridrl_py_")
    limits = {"memory_bytes": memory_mb << 20, "cpu_seconds": cpu_seconds, "file_bytes": file_mb << 20,
              "workdir": workdir}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", CHILD, json.dumps(limits), cwd=workdir, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        try:
            out, err = await asyncio.wait_for(proc.communicate(code.encode()), timeout_s)
            return SandboxResult(out.decode(errors="replace"), err.decode(errors="replace"), proc.returncode or 0,
                                 False, timeout_s)
        except asyncio.TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            return SandboxResult("", "", -9, True, timeout_s)
        finally:
            if proc.returncode is None:  # cancelled (the loop's own timeout): never leave the child running
                _kill_group(proc.pid)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
