"""A Python code tool: the model's code runs in a confined child process (hybridrl/agent/tools/sandbox/).

The child reads nothing of the trainer's (environment scrubbed, file system read-only beneath the interpreter's
folders and unreadable elsewhere, no /proc of other processes), writes only in a fresh size-capped folder that
is removed after, has no network, cannot start processes or signal others, and runs under memory, CPU and
file limits; the parent keeps a bounded part of its output. sandbox/isolation.py lists each layer; a layer the
kernel refuses is logged once with its reason (required_layers turns that into a refusal to run).
"""
from __future__ import annotations

from typing import Any

from .base import BaseTool
from .sandbox import SandboxResult, run_sandboxed

__all__ = ["PythonSandboxTool", "SandboxResult", "run_sandboxed"]


class PythonSandboxTool(BaseTool):
    """Tool arguments: {"code": "<python>"}; the observation is stdout (and stderr's last lines on an error).
    config: timeout_s (wall clock, default 5), memory_mb (256), cpu_seconds (timeout_s rounded up),
    file_mb (16, one file), disk_mb (64, the whole folder), max_files (1000), max_output_chars (2000),
    read_paths (extra folders the code may read, default none), required_layers (default none: a layer the
    kernel refuses is logged; list names of sandbox.LAYERS to refuse to run without them)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            return "Error: the argument 'code' must be a non-empty string", 0.0, {"error": 1.0}
        result = await run_sandboxed(code, **self._limits())
        metrics = {"error": float(result.error), "timeout": float(result.timed_out)}
        return result.observation(self._max_chars()), 0.0, metrics

    def _max_chars(self) -> int:
        return int(self.config.get("max_output_chars", 2000))

    def _limits(self) -> dict[str, Any]:
        c = self.config
        timeout = float(c.get("timeout_s", 5.0))
        return {"timeout_s": timeout, "memory_mb": int(c.get("memory_mb", 256)),
                "cpu_seconds": int(c.get("cpu_seconds", max(1, int(timeout + 0.999)))),
                "file_mb": int(c.get("file_mb", 16)), "disk_mb": int(c.get("disk_mb", 64)),
                "max_files": int(c.get("max_files", 1000)),
                # UTF-8 is at most 4 bytes a character: enough bytes for max_output_chars, never the whole flood
                "output_bytes": 4 * self._max_chars() + 4096,
                "read_paths": tuple(c.get("read_paths", ())), "required_layers": tuple(c.get("required_layers", ()))}
