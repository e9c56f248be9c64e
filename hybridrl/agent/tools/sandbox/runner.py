"""The parent's side of a sandboxed run: start the child with a scrubbed environment in a fresh folder,
feed it the code, keep a bounded part of its output, stop it at the wall-clock limit, remove the folder.

Output is read in 64 KiB chunks and only the first `output_bytes` of stdout (the last of stderr) are kept:
a child that prints gigabytes costs the parent at most those bytes, whatever max_output_chars says later.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from typing import Any

logger = logging.getLogger("hybridrl.sandbox")
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
LAYERS = ("namespaces", "rlimits", "caps", "landlock", "seccomp")
CHUNK = 1 << 16
_reported: set[tuple[str, str]] = set()


class SandboxResult:
    def __init__(self, stdout: str, stderr: str, returncode: int, timed_out: bool, timeout_s: float,
                 layers: dict[str, str] | None = None, dropped_bytes: int = 0) -> None:
        self.stdout, self.stderr, self.returncode = stdout, stderr, returncode
        self.timed_out, self.timeout_s = timed_out, timeout_s
        self.layers = layers or {}
        self.dropped_bytes = dropped_bytes

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
        if self.dropped_bytes and len(text) <= max_chars:
            text += f"\n...[output truncated: {self.dropped_bytes} more bytes]"
        return text if len(text) <= max_chars else text[: max_chars - 15] + "...[truncated]"


def child_env(workdir: str) -> dict[str, str]:
    """Nothing of the trainer's environment (tokens, keys, paths) reaches the child; one BLAS thread."""
    return {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


async def run_sandboxed(code: str, *, timeout_s: float = 5.0, memory_mb: int = 256, cpu_seconds: int = 5,
                        file_mb: int = 16, disk_mb: int = 64, max_files: int = 1000, output_bytes: int = 1 << 16,
                        read_paths: tuple[str, ...] = (), required_layers: tuple[str, ...] = (),
                        audit_hook: bool = True) -> SandboxResult:
    """Run `code` in a confined child. required_layers: names from LAYERS that must be up or the code does not run;
    audit_hook=False leaves only the kernel's layers (the red-team tests run that way)."""
    workdir = tempfile.mkdtemp(prefix="hybridrl_py_")
    limits = {"memory_bytes": memory_mb << 20, "cpu_seconds": cpu_seconds, "file_bytes": file_mb << 20,
              "disk_bytes": disk_mb << 20, "max_files": max_files, "workdir": workdir,
              "read_paths": [os.path.realpath(p) for p in read_paths], "required_layers": list(required_layers),
              "audit_hook": audit_hook}
    status_r, status_w = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-B", CHILD, json.dumps(limits), str(status_w), cwd=workdir, env=child_env(workdir),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, pass_fds=(status_w,))
        os.close(status_w)
        status_w = -1
        result = await _communicate(proc, code.encode(), timeout_s, output_bytes)
        result.layers = _read_status(status_r)
        _log_refused_layers(result.layers)
        return result
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)


async def _communicate(proc, code: bytes, timeout_s: float, output_bytes: int) -> SandboxResult:
    async def feed():
        try:
            proc.stdin.write(code)
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the child ended before reading all of it; its exit status says why

    async def run():
        out, err, _, _ = await asyncio.gather(_drain(proc.stdout, output_bytes, keep_head=True),
                                              _drain(proc.stderr, output_bytes, keep_head=False), feed(), proc.wait())
        return out, err

    try:
        try:
            (out, dropped), (err, _) = await asyncio.wait_for(run(), timeout_s)
        except asyncio.TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            return SandboxResult("", "", -9, True, timeout_s)
        return SandboxResult(out.decode(errors="replace"), err.decode(errors="replace"), proc.returncode or 0,
                             False, timeout_s, dropped_bytes=dropped)
    finally:
        if proc.returncode is None:  # cancelled (the loop's own timeout): never leave the child running
            _kill_group(proc.pid)


async def _drain(stream: asyncio.StreamReader, cap: int, keep_head: bool) -> tuple[bytes, int]:
    """Read to EOF in chunks, keeping at most `cap` bytes (the first ones, or the last ones)."""
    buf, dropped = bytearray(), 0
    while chunk := await stream.read(CHUNK):
        if keep_head:
            room = max(0, cap - len(buf))
            buf += chunk[:room]
            dropped += len(chunk) - min(room, len(chunk))
        else:
            buf += chunk
            if len(buf) > cap:
                dropped += len(buf) - cap
                del buf[: len(buf) - cap]
    return bytes(buf), dropped


def _read_status(fd: int) -> dict[str, str]:
    data = b""
    while chunk := os.read(fd, CHUNK):
        data += chunk
    try:
        return json.loads(data) if data else {k: "REFUSED: the child ended before reporting" for k in LAYERS}
    except json.JSONDecodeError:
        return {k: "REFUSED: unreadable report from the child" for k in LAYERS}


def _log_refused_layers(layers: dict[str, Any]) -> None:
    """Once per process and reason: a layer the kernel refused is named, with the kernel's words."""
    for name, what in layers.items():
        if str(what).startswith("REFUSED") and (name, what) not in _reported:
            _reported.add((name, what))
            logger.warning("python sandbox: the %s layer is off on this machine (%s); tool code runs without it "
                           "(list it in the tool's required_layers to refuse to run instead)", name, what[9:])


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
