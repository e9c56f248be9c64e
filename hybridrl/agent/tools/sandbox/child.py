"""The sandboxed child's entry point (`python -I -B child.py LIMITS_JSON STATUS_FD`): read the code, confine
this process (isolation.apply), report the layers on STATUS_FD, then run the code.

The code arrives on stdin and is read before any layer goes up; nothing of the user's runs before the last one.
The audit hook installed last is not a boundary (code that reaches the kernel directly is stopped by the
layers below it); it turns the common refusals into messages a model can read ("network is disabled ...").
"""
import json
import os
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


def confine(limits: dict, status_fd: int) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import isolation
    sys.path.pop(0)
    report = isolation.apply(limits)
    # the user's `import ctypes` must load it afresh, so that the audit hook sees the import
    for name in [m for m in sys.modules if m.split(".")[0] in ("ctypes", "_ctypes", "isolation")]:
        del sys.modules[name]
    os.write(status_fd, json.dumps(report).encode())
    os.close(status_fd)
    return report


def audit_hook(workdir: str, kernel_confined: bool):
    # Under Landlock and seccomp, ctypes reaches only the syscalls the filter lets through (and numpy needs it);
    # without them, native code would be a way around everything this hook checks.
    events = {k: v for k, v in BLOCKED_EVENTS.items() if not (kernel_confined and k == "ctypes.dlopen")}
    modules = tuple(m for m in BLOCKED_MODULES if not (kernel_confined and m in ("ctypes", "_ctypes")))

    def hook(event, args):
        if event in events:
            raise PermissionError(events[event])
        if event == "import" and args[0].split(".")[0] in modules:
            raise PermissionError(f"importing {args[0]} is disabled in this sandbox")
        if event == "open" and args[0] is not None and not isinstance(args[0], int):
            mode, flags = args[1] or "", args[2] or 0
            writes = any(c in str(mode) for c in "wax+") or bool(flags & WRITE_FLAGS)
            path = os.path.realpath(os.fsdecode(args[0]))
            if writes and not (path == workdir or path.startswith(workdir + os.sep)):
                raise PermissionError(f"writing outside the sandbox's working directory is disabled ({path})")
    return hook


def main() -> None:
    limits = json.loads(sys.argv[1])
    code = sys.stdin.read()
    report = confine(limits, int(sys.argv[2]))
    missing = [k for k in limits.get("required_layers", []) if report.get(k, "REFUSED").startswith("REFUSED")]
    if missing:
        sys.stderr.write(f"SandboxError: required isolation layers are off on this machine: {', '.join(missing)}\n")
        sys.exit(3)
    if limits.get("audit_hook", True):
        confined = not any(report.get(k, "REFUSED").startswith("REFUSED") for k in ("landlock", "seccomp"))
        sys.addaudithook(audit_hook(os.path.realpath(limits["workdir"]), confined))
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
