"""Run inside the sandboxed child (python -I -S): limits first, then the audit hook, then the user's code.

Argument: a JSON object {memory_bytes, cpu_seconds, file_bytes, workdir}. The code arrives on stdin.
This file imports nothing beyond the standard library's always-present modules.
"""
import json
import os
import resource
import sys
import traceback

BLOCKED_EVENTS = {
    "socket.__new__": "network is disabled in this sandbox",
    "socket.connect": "network is disabled in this sandbox",
    "socket.bind": "network is disabled in this sandbox",
    "socket.getaddrinfo": "network is disabled in this sandbox",
    "subprocess.Popen": "starting processes is disabled in this sandbox",
    "os.system": "starting processes is disabled in this sandbox",
    "os.exec": "starting processes is disabled in this sandbox",
    "os.posix_spawn": "starting processes is disabled in this sandbox",
    "os.spawn": "starting processes is disabled in this sandbox",
    "os.fork": "starting processes is disabled in this sandbox",
    "os.forkpty": "starting processes is disabled in this sandbox",
    "ctypes.dlopen": "loading native libraries is disabled in this sandbox",
    "os.kill": "signalling processes is disabled in this sandbox",
}
BLOCKED_MODULES = ("ctypes", "_ctypes", "_posixsubprocess", "socket", "_socket", "multiprocessing")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def main() -> None:
    limits = json.loads(sys.argv[1])
    workdir = os.path.realpath(limits["workdir"])
    code = sys.stdin.read()
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def hook(event, args):
        if event in BLOCKED_EVENTS:
            raise PermissionError(BLOCKED_EVENTS[event])
        if event == "import" and args[0].split(".")[0] in BLOCKED_MODULES:
            raise PermissionError(f"importing {args[0]} is disabled in this sandbox")
        if event == "open" and args[0] is not None and not isinstance(args[0], int):
            mode, flags = args[1] or "", args[2] or 0
            writes = any(c in str(mode) for c in "wax+") or bool(flags & WRITE_FLAGS)
            path = os.path.realpath(os.fsdecode(args[0]))
            if writes and not (path == workdir or path.startswith(workdir + os.sep)):
                raise PermissionError(f"writing outside the sandbox's working directory is disabled ({path})")

    sys.addaudithook(hook)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<tool code>", "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as e:  # the model sees its own error, not the sandbox's frames
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == "<tool code>"]
        sys.stderr.write(f"{type(e).__name__}: {e}" + (f" (line {lines[-1]})" if lines else "") + "\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
