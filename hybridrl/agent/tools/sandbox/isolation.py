"""The OS-level isolation of a sandboxed child, applied by the child to itself before the tool's code runs.

This is the one module that confines code. Layers, in the order `apply` puts them in place (each is a kernel
mechanism; a layer the kernel refuses is reported by name with the kernel's reason, never skipped silently):

  namespaces  a private mount and network namespace (plus a user namespace when not root): the working
              directory becomes a size- and inode-capped tmpfs (disk fill), and the only network is an
              unconfigured loopback;
  rlimits     address space (memory), CPU seconds, file size, open files, no core dumps;
  caps        every capability dropped (bounding set, then effective/permitted/inheritable), no_new_privs set;
  landlock    the file system becomes read-only beneath the interpreter's own folders and a few system ones, read-write
              only in the working directory, and unreadable anywhere else (so /proc of every process, the
              trainer's data and checkpoints); TCP bind/connect denied (ABI 4); signals and abstract UNIX
              sockets limited to the sandbox (ABI 6);
  seccomp     a BPF filter: no sockets, no fork/exec (threads still start), signals only to itself, no ptrace,
              mounts, namespaces, rlimit raises, chmod/chown/xattr/utime, hard links, io_uring, bpf, keyrings.

Everything here runs in the child only, and only through the standard library (ctypes for the raw syscalls),
so no package beyond Python itself is needed and nothing depends on a helper binary being installed.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import struct
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class LayerRefused(Exception):
    """The kernel (or this machine) would not put a layer in place; the message says why."""


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise LayerRefused(f"{what}: {errno.errorcode.get(err, err)} ({os.strerror(err)})")
    return ret


# ---- namespaces ---------------------------------------------------------------------------------------------
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000


def enter_namespaces(workdir: str, disk_bytes: int, max_files: int) -> str:
    """Private mount + network namespace; a tmpfs of disk_bytes and max_files inodes over workdir.

    Without CAP_SYS_ADMIN (any non-root user, and root in most containers, whose capabilities are cut down) the
    namespaces come inside a new user namespace, which grants them; root with CAP_SYS_ADMIN needs none."""
    uid, gid = os.geteuid(), os.getegid()
    own_user_ns = not _has_capability(CAP_SYS_ADMIN)
    if own_user_ns and uid == 0 and not _has_capability(CAP_SETFCAP):
        # the kernel (5.12+) lets only a holder of CAP_SETFCAP map root into a user namespace
        raise LayerRefused("root without CAP_SYS_ADMIN or CAP_SETFCAP cannot make its namespaces: run the trainer as "
                           "a non-root user, or give it one of these capabilities")
    flags = CLONE_NEWNS | CLONE_NEWNET | (CLONE_NEWUSER if own_user_ns else 0)
    _check(_libc.unshare(flags), "unshare(mount, net" + (", user" if own_user_ns else "") + ")")
    if own_user_ns:  # map our own ids so that the files we write keep their owner
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    # without this, a mount under a shared / would propagate back into the trainer's namespace
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount(/, private)")
    opts = f"size={max(disk_bytes, 4096)},nr_inodes={max_files},mode=0700,uid={uid},gid={gid}".encode()
    _check(_libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts),
           f"mount(tmpfs on {workdir})")
    os.chdir(workdir)  # the old cwd is the folder beneath the new mount
    return f"mount+net namespace{' in a user namespace' if own_user_ns else ''}, tmpfs {disk_bytes >> 20} MiB"


# ---- rlimits --------------------------------------------------------------------------------------------------
def set_rlimits(memory_bytes: int, cpu_seconds: int, file_bytes: int, open_files: int = 256) -> str:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    return f"as {memory_bytes >> 20} MiB, cpu {cpu_seconds}s, fsize {file_bytes >> 20} MiB, nofile {open_files}"


# ---- capabilities -----------------------------------------------------------------------------------------------
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 24, 38, 22
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def drop_capabilities() -> str:
    """All capabilities gone and no_new_privs on (Landlock and seccomp need the latter without CAP_SYS_ADMIN)."""
    # first, and on its own: Landlock and seccomp need it even where dropping capabilities fails
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")
    last = int(open("/proc/sys/kernel/cap_last_cap").read()) if os.path.exists("/proc/sys/kernel/cap_last_cap") else 40
    if _has_capability(CAP_SETPCAP):
        for cap in range(last + 1):
            _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL for caps this kernel lacks: fine
    header = struct.pack("Ii", _LINUX_CAPABILITY_VERSION_3, 0)
    data = ctypes.create_string_buffer(24)  # two {effective, permitted, inheritable} u32 triples, all zero
    _check(_libc.syscall(SYSCALLS["capset"], ctypes.c_char_p(header), data), "capset(0)")
    return "none left, no_new_privs"


CAP_SETPCAP, CAP_SYS_ADMIN, CAP_SETFCAP = 8, 21, 31


def _has_capability(cap: int) -> bool:
    """Whether `cap` is in this process's effective set (/proc/self/status CapEff)."""
    for line in open("/proc/self/status"):
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << cap))
    return False


# ---- landlock ---------------------------------------------------------------------------------------------------
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
LL_ALL_V1 = (1 << 13) - 1  # execute .. make_sym
LL_REFER, LL_TRUNCATE, LL_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
LL_NET_BIND_TCP, LL_NET_CONNECT_TCP = 1 << 0, 1 << 1
LL_SCOPE_ABSTRACT_UNIX, LL_SCOPE_SIGNAL = 1 << 0, 1 << 1
LL_RULE_PATH_BENEATH = 1
LL_CREATE_RULESET_VERSION = 1
# a regular file's rule may only carry these
LL_FILE_RIGHTS = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV


def landlock_abi() -> int:
    return _check(_libc.syscall(SYSCALLS["landlock_create_ruleset"], None, 0, LL_CREATE_RULESET_VERSION),
                  "landlock_create_ruleset(version)")


def restrict_filesystem(read_paths: list[str], write_paths: list[str]) -> str:
    """Landlock: read beneath read_paths, read and write beneath write_paths, nothing anywhere else."""
    abi = landlock_abi()
    fs = LL_ALL_V1 | (LL_REFER if abi >= 2 else 0) | (LL_TRUNCATE if abi >= 3 else 0) | (LL_IOCTL_DEV if abi >= 5 else 0)
    net = (LL_NET_BIND_TCP | LL_NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (LL_SCOPE_ABSTRACT_UNIX | LL_SCOPE_SIGNAL) if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _check(_libc.syscall(SYSCALLS["landlock_create_ruleset"], ctypes.c_char_p(attr), len(attr), 0),
                     "landlock_create_ruleset")
    try:
        for path in read_paths:
            _add_path_rule(ruleset, path, LL_READ_FILE | LL_READ_DIR)
        for path in write_paths:
            _add_path_rule(ruleset, path, fs & ~LL_EXECUTE)
        _check(_libc.syscall(SYSCALLS["landlock_restrict_self"], ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    parts = ["fs"] + (["tcp"] if net else []) + (["signals, abstract sockets"] if scoped else [])
    return f"ABI {abi}: {', '.join(parts)}"


def _add_path_rule(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path this machine lacks needs no rule
    try:
        if not os.path.isdir(path):
            rights &= LL_FILE_RIGHTS
        attr = struct.pack("=Qi", rights, fd)  # landlock_path_beneath_attr is packed: 12 bytes
        _check(_libc.syscall(SYSCALLS["landlock_add_rule"], ruleset, LL_RULE_PATH_BENEATH, ctypes.c_char_p(attr), 0),
               f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def default_read_paths() -> list[str]:
    """The interpreter's own folders (stdlib, site-packages) and what shared libraries need; nothing of the user's."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    prefixes |= {os.path.realpath(p) for p in prefixes}
    system = ["/usr", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/localtime", "/dev/urandom", "/dev/random",
              "/dev/zero", "/sys/devices/system/cpu"]
    return sorted(prefixes) + system


# ---- seccomp ----------------------------------------------------------------------------------------------------
# x86_64 numbers (arch/x86/entry/syscalls/syscall_64.tbl); another machine gets no filter, reported as such.
SYSCALLS = {"capset": 126, "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
            "clone": 56, "clone3": 435, "kill": 62, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
            "prlimit64": 302}
DENIED = {
    "network": [41, 42, 43, 49, 50, 288],  # socket connect accept bind listen accept4
    "processes": [57, 58, 59, 322, 200, 424, 434, 438],  # fork vfork execve execveat tkill pidfd_*
    "other processes' memory": [101, 310, 311, 312],  # ptrace process_vm_readv/writev kcmp
    "limits and identity": [160, 105, 106, 113, 114, 116, 117, 119, 122, 123, 126, 135],  # setrlimit set*id capset ..
    "mounts and namespaces": [165, 166, 155, 161, 272, 308, 428, 429, 430, 431, 432, 433, 442],
    "file metadata and links": [90, 91, 268, 452, 92, 93, 94, 260, 188, 189, 190, 463, 197, 198, 199, 466, 132, 235,
                                280, 261, 86, 265, 303, 304, 133, 259],
    "kernel interfaces": [250, 248, 249, 321, 298, 323, 425, 426, 427, 175, 313, 176, 246, 320, 169, 167, 168, 163,
                          172, 173, 179, 164, 227, 159, 305, 170, 171],
}
AUDIT_ARCH_X86_64 = 0xC000003E
CLONE_THREAD = 0x00010000
_RET_ALLOW, _RET_KILL = 0x7FFF0000, 0x80000000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, SYS_SECCOMP = 1, 1, 317


def _errno_ret(code: int) -> int:
    return 0x00050000 | code


def seccomp_program(own_pid: int) -> list[tuple[int, int, int, int]]:
    """The BPF program as (code, jt, jf, k) rows; jump targets are resolved from labels below."""
    prog: list = []  # rows, with jt/jf either an int or a label name
    label: dict[str, int] = {}

    def emit(code, k=0, jt=0, jf=0):
        prog.append([code, jt, jf, k])

    emit(_LD_ABS, 4)                                     # seccomp_data.arch
    emit(_JEQ, AUDIT_ARCH_X86_64, 0, "kill")
    emit(_LD_ABS, 0)                                     # seccomp_data.nr
    emit(_JGE, 0x40000000, "deny", 0)                    # the x32 ABI's numbers
    for nr in sorted({n for group in DENIED.values() for n in group}):
        emit(_JEQ, nr, "deny", 0)
    emit(_JEQ, SYSCALLS["clone"], "clone", 0)
    emit(_JEQ, SYSCALLS["clone3"], "enosys", 0)          # glibc then falls back to clone(), which we can inspect
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        emit(_JEQ, SYSCALLS[name], "signal", 0)
    emit(_JEQ, SYSCALLS["prlimit64"], "prlimit", 0)
    emit(_RET, _RET_ALLOW)
    label["clone"] = len(prog)                           # a thread (CLONE_THREAD) yes, a process no
    emit(_LD_ABS, 16)
    emit(_JSET, CLONE_THREAD, "allow", "deny")
    label["signal"] = len(prog)                          # first argument: the target pid (0: own group)
    emit(_LD_ABS, 16)
    emit(_JEQ, own_pid, "allow", 0)
    emit(_JEQ, 0, "allow", "deny")
    label["prlimit"] = len(prog)                         # reading a limit (new_limit NULL) yes, setting one no
    emit(_LD_ABS, 16 + 2 * 8)
    emit(_JEQ, 0, 0, "deny")
    emit(_LD_ABS, 16 + 2 * 8 + 4)
    emit(_JEQ, 0, "allow", "deny")
    label["allow"] = len(prog)                           # BPF jumps only forward: the verdicts come last
    emit(_RET, _RET_ALLOW)
    label["deny"] = len(prog)
    emit(_RET, _errno_ret(errno.EPERM))
    label["enosys"] = len(prog)
    emit(_RET, _errno_ret(errno.ENOSYS))
    label["kill"] = len(prog)
    emit(_RET, _RET_KILL)
    rows = []
    for i, (code, jt, jf, k) in enumerate(prog):
        jt, jf = (label[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        assert 0 <= jt < 256 and 0 <= jf < 256, f"seccomp program: jump out of range at row {i}: {jt}, {jf}"
        rows.append((code, jt, jf, k))
    return rows


def install_seccomp() -> str:
    machine = platform.machine()
    if machine != "x86_64":
        raise LayerRefused(f"no syscall table for machine {machine!r} (x86_64 only)")
    rows = seccomp_program(os.getpid())
    filt = b"".join(struct.pack("HBBI", *row) for row in rows)
    buf = ctypes.create_string_buffer(filt, len(filt))
    prog = struct.pack("HxxxxxxQ", len(rows), ctypes.addressof(buf))
    _check(_libc.syscall(SYS_SECCOMP, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, ctypes.c_char_p(prog)),
           "seccomp(SET_MODE_FILTER)")
    n = sum(len(v) for v in DENIED.values())
    return f"{len(rows)} BPF rows, {n} syscalls denied, fork/exec/sockets/signals to others refused"


def apply(limits: dict) -> dict[str, str]:
    """Put every layer in place, in order; returns {layer: what it does} or {layer: 'REFUSED: why'}."""
    workdir = limits["workdir"]
    report: dict[str, str] = {}

    def layer(name, fn, *args):
        try:
            report[name] = fn(*args)
        except (LayerRefused, OSError) as e:
            report[name] = f"REFUSED: {e}"

    layer("namespaces", enter_namespaces, workdir, limits["disk_bytes"], limits["max_files"])
    layer("rlimits", set_rlimits, limits["memory_bytes"], limits["cpu_seconds"], limits["file_bytes"])
    layer("caps", drop_capabilities)
    layer("landlock", restrict_filesystem, default_read_paths() + limits.get("read_paths", []),
          [workdir, "/dev/null"])
    layer("seccomp", install_seccomp)
    return report
