"""Red team for the Python tool's sandbox (hybridrl/agent/tools/sandbox/): every probe tries to get out and must be
refused by the kernel's layers alone, so each runs with the in-process audit hook OFF (the hook only makes the
messages friendlier; tests/unit/test_agent_tools.py covers it).

Each probe is code that raises if refused and prints ESCAPED if not; the test also checks the outside world
afterwards (the victim file, the folder, the parent's memory), so a probe that "fails" quietly still fails here.
"""
import ast
import asyncio
import os
import resource
import signal
import socket
import textwrap

import pytest

from hybridrl.agent.tools.sandbox import LAYERS, run_sandboxed
from hybridrl.agent.tools.sandbox.runner import _log_refused_layers

pytestmark = pytest.mark.timeout(60)

RAW = textwrap.dedent("""\
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def raw(nr, *args):
        r = libc.syscall(nr, *args)
        err = ctypes.get_errno()
        if r < 0 and err in (1, 13):  # EPERM, EACCES: refused before the kernel looked at the arguments
            raise PermissionError("syscall %d: %s" % (nr, os.strerror(err)))
        print("ESCAPED", r, os.strerror(err))  # success, or an error that proves the call got through
    """)


def sandbox(code, **kw):
    limits = {"timeout_s": 10.0, "memory_mb": 256, "cpu_seconds": 5, "audit_hook": False, **kw}
    return asyncio.run(run_sandboxed(textwrap.dedent(code), **limits))


@pytest.fixture
def outside(tmp_path):
    """A folder the sandbox must not touch: a file with known content, an empty folder, a secret."""
    (tmp_path / "victim.txt").write_text("keep")
    (tmp_path / "empty").mkdir()
    (tmp_path / "secret.txt").write_text("s3cret")
    return tmp_path


def refused(r, *words):
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "ESCAPED" not in out, f"not refused: rc={r.returncode} {out!r}"
    assert any(w in r.stderr for w in words or ("PermissionError", "OSError")), r.stderr


def untouched(outside):
    assert (outside / "victim.txt").read_text() == "keep"
    assert sorted(p.name for p in outside.iterdir()) == ["empty", "secret.txt", "victim.txt"]
    assert oct((outside / "victim.txt").stat().st_mode)[-3:] == "644"


def test_every_layer_is_up_on_this_machine():
    r = sandbox("print(1)")
    assert sorted(r.layers) == sorted(LAYERS)
    assert not [k for k, v in r.layers.items() if v.startswith("REFUSED")], r.layers


# ---- the file system outside the working folder --------------------------------------------------------------
FILE_PROBES = {
    "write": "open({victim!r}, 'w').write('x')",
    "append": "open({victim!r}, 'a').write('x')",
    "os_open_write": "import os\nos.write(os.open({victim!r}, os.O_WRONLY), b'x')",
    "create": "open({dir!r} + '/new.txt', 'x').write('x')",
    "delete": "import os\nos.remove({victim!r})",
    "rename_inside_outside": "import os\nos.rename({victim!r}, {dir!r} + '/moved.txt')",
    "rename_into_sandbox": "import os\nos.rename({victim!r}, 'stolen.txt')",
    "rename_over_from_sandbox": "import os\nopen('x', 'w').write('x')\nos.replace('x', {victim!r})",
    "truncate": "import os\nos.truncate({victim!r}, 0)",
    "mkdir": "import os\nos.mkdir({dir!r} + '/d')",
    "rmdir": "import os\nos.rmdir({dir!r} + '/empty')",
    "hard_link_then_write": "import os\nos.link({victim!r}, 'l')\nopen('l', 'w').write('x')",
    "symlink_then_write": "import os\nos.symlink({victim!r}, 'l')\nopen('l', 'w').write('x')",
    "chmod": "import os\nos.chmod({victim!r}, 0o777)",
    "utime": "import os\nos.utime({victim!r}, (0, 0))",
    "read_secret": "print('ESCAPED', open({dir!r} + '/secret.txt').read())",
    "list_folder": "import os\nprint('ESCAPED', os.listdir({dir!r}))",
    "write_tmp": "open('/tmp/hybridrl_redteam_probe', 'w').write('x')",
    "write_dev_shm": "open('/dev/shm/hybridrl_redteam_probe', 'w').write('x')",
}


@pytest.mark.parametrize("probe", sorted(FILE_PROBES))
def test_file_system_outside_is_refused(probe, outside):
    code = FILE_PROBES[probe].format(victim=str(outside / "victim.txt"), dir=str(outside))
    refused(sandbox(code))
    untouched(outside)
    assert not os.path.exists("/tmp/hybridrl_redteam_probe") and not os.path.exists("/dev/shm/hybridrl_redteam_probe")


# ---- other processes: /proc, signals, ptrace --------------------------------------------------------------------
PROC_PROBES = {
    "parent_environ": "import os\nprint('ESCAPED', open(f'/proc/{os.getppid()}/environ').read())",
    "parent_cmdline": "import os\nprint('ESCAPED', open(f'/proc/{os.getppid()}/cmdline').read())",
    "parent_mem": "import os\nopen(f'/proc/{os.getppid()}/mem', 'rb')\nprint('ESCAPED')",
    "parent_status": "import os\nprint('ESCAPED', open(f'/proc/{os.getppid()}/status').read())",
    "list_proc": "import os\nprint('ESCAPED', os.listdir('/proc'))",
    "signal_parent": "import os\nos.kill(os.getppid(), 0)\nprint('ESCAPED')",
    "signal_parent_group": "import os\nos.killpg(os.getpgid(os.getppid()), 0)\nprint('ESCAPED')",
    "signal_all": "import os\nos.kill(-1, 0)\nprint('ESCAPED')",
    "raw_kill_parent": RAW + "raw(62, os.getppid(), 0)",
    "raw_tgkill_parent": RAW + "raw(234, os.getppid(), os.getppid(), 0)",
    "pidfd_open_parent": RAW + "raw(434, os.getppid(), 0)",
    "ptrace_attach_parent": RAW + "raw(101, 0x4206, os.getppid(), 0, 0)",
    "process_vm_readv": RAW + "raw(310, os.getppid(), 0, 0, 0, 0, 0)",
}


@pytest.mark.parametrize("probe", sorted(PROC_PROBES))
def test_other_processes_are_out_of_reach(probe, monkeypatch):
    monkeypatch.setenv("HYBRIDRL_REDTEAM_SECRET", "tok3n")  # in the trainer's environment, never in the child's
    r = sandbox(PROC_PROBES[probe])
    refused(r)
    assert "tok3n" not in r.stdout + r.stderr


# ---- network ----------------------------------------------------------------------------------------------------
NET_PROBES = {
    "tcp_connect": "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('ESCAPED')",
    "udp_socket": "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nprint('ESCAPED')",
    "tcp_listen": "import socket\ns = socket.socket()\ns.bind(('0.0.0.0', 0))\nprint('ESCAPED')",
    "unix_socket_connect": "import socket\nsocket.socket(socket.AF_UNIX).connect({unix!r})\nprint('ESCAPED')",
    "raw_socket_syscall": RAW + "raw(41, 2, 1, 0)",
    "dns": "import socket\nprint('ESCAPED', socket.getaddrinfo('localhost', 80))",
}


@pytest.mark.parametrize("probe", sorted(NET_PROBES))
def test_network_is_refused(probe, tmp_path):
    # a live TCP listener and a UNIX socket on this machine: what a sandbox escape would reach for
    tcp, unix = socket.socket(), socket.socket(socket.AF_UNIX)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(1)
    unix_path = str(tmp_path / "s.sock")
    unix.bind(unix_path)
    unix.listen(1)
    try:
        refused(sandbox(NET_PROBES[probe].format(port=tcp.getsockname()[1], unix=unix_path)),
                "PermissionError", "OSError", "gaierror")
    finally:
        tcp.close()
        unix.close()


# ---- processes and privileges -------------------------------------------------------------------------------------
EXEC_PROBES = {
    "fork": "import os\nos.fork()\nprint('ESCAPED')",
    "exec": "import os\nos.execv('/bin/true', ['true'])",
    "subprocess": "import subprocess\nsubprocess.run(['/bin/echo', 'ESCAPED'])",
    "posix_spawn": "import os\nos.posix_spawn('/bin/true', ['true'], {})\nprint('ESCAPED')",
    "os_system": "import os\nassert os.system('echo ESCAPED') == 0",
    "raise_rlimit": "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))\nprint('ESCAPED')",
    "unshare": RAW + "raw(272, 0x10000000)",
    "mount": RAW + "raw(165, b'none', b'/mnt', b'tmpfs', 0, 0)",
    "chroot": "import os\nos.chroot('.')\nprint('ESCAPED')",
    "setuid": "import os\nos.setuid(0)\nprint('ESCAPED')",
    "io_uring": RAW + "import ctypes\nraw(425, 8, ctypes.create_string_buffer(120))",
    "bpf": RAW + "raw(321, 0, 0, 0)",
}


@pytest.mark.parametrize("probe", sorted(EXEC_PROBES))
def test_processes_and_privileges_are_refused(probe):
    r = sandbox(EXEC_PROBES[probe])
    refused(r, "PermissionError", "OSError", "AssertionError", "not allowed to raise")


# ---- resources ----------------------------------------------------------------------------------------------------
def test_memory_is_capped():
    refused(sandbox("x = bytearray(1 << 30)\nprint('ESCAPED')", memory_mb=128), "MemoryError")


def test_cpu_is_capped_by_the_kernel_before_the_wall_clock():
    r = sandbox("while True:\n    pass", cpu_seconds=1, timeout_s=20)
    assert not r.timed_out and r.returncode == -signal.SIGXCPU, (r.returncode, r.stderr)


def test_one_big_file_is_capped():
    refused(sandbox("open('big', 'wb').write(b'x' * (8 << 20))\nprint('ESCAPED')", file_mb=4), "OSError")


def test_disk_fill_with_many_files_is_capped():
    code = "for i in range(64):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\nprint('ESCAPED')"
    refused(sandbox(code, file_mb=4, disk_mb=16), "OSError")  # 16 MiB of tmpfs: ENOSPC, each file under 4 MiB


def test_file_count_is_capped():
    refused(sandbox("for i in range(5000):\n    open(f'f{i}', 'w').close()\nprint('ESCAPED')", max_files=200), "OSError")


def test_output_flood_is_capped_before_it_reaches_the_parent():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = sandbox("import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(300):\n    sys.stdout.write(chunk)\n",
                output_bytes=4096, timeout_s=30)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert len(r.stdout) == 4096 and r.dropped_bytes == 300 * (1 << 20) - 4096
    assert grown_mb < 64, f"the parent grew by {grown_mb:.0f} MB for 300 MB of output"
    assert "output truncated" in r.observation(10_000)


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("HYBRIDRL_REDTEAM_SECRET", "tok3n")
    r = sandbox("import os\nprint(sorted(os.environ))\nprint(open('/proc/self/environ').read())")
    assert "tok3n" not in r.stdout + r.stderr
    keys = ast.literal_eval(r.stdout.splitlines()[0])
    assert set(keys) <= {"PATH", "HOME", "TMPDIR", "LANG", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                         "MKL_NUM_THREADS", "LC_CTYPE"}, keys


# ---- what must keep working ----------------------------------------------------------------------------------
def test_ordinary_code_still_runs():
    code = """
        import math, json, threading, tempfile, os
        import numpy as np
        a = np.arange(12.0).reshape(3, 4)
        out = []
        t = threading.Thread(target=lambda: out.append(math.factorial(20)))
        t.start(); t.join()
        with tempfile.NamedTemporaryFile('w', delete=False) as f:
            f.write('ok')
        os.makedirs('sub/dir'); os.rename(f.name, 'sub/dir/f'); os.remove('sub/dir/f')
        print(json.dumps([float(a @ a.T.sum(1) @ np.ones(3)), out[0], round(float(np.linalg.det(np.eye(3) * 2)), 9)]))
        """
    r = sandbox(code, audit_hook=True)  # as the tool runs it: numpy imports ctypes, which the hook then allows
    assert r.returncode == 0, r.stderr
    a = [[float(4 * i + j) for j in range(4)] for i in range(3)]
    rowsum = [sum(a[k][j] for k in range(3)) for j in range(4)]  # a.T.sum(1): column sums
    expected = sum(sum(a[i][j] * rowsum[j] for j in range(4)) for i in range(3))
    assert r.stdout.strip() == f"[{expected}, 2432902008176640000, 8.0]"


def test_a_required_layer_that_is_missing_stops_the_code():
    r = sandbox("print('ran')", required_layers=("no-such-layer",))
    assert r.returncode == 3 and "ran" not in r.stdout and "no-such-layer" in r.stderr


def test_a_refused_layer_is_logged_once_with_the_kernels_reason(caplog):
    report = {"landlock": "REFUSED: landlock_create_ruleset(version): ENOSYS (Function not implemented)"}
    with caplog.at_level("WARNING", logger="hybridrl.sandbox"):
        _log_refused_layers(report)
        _log_refused_layers(report)
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "landlock layer is off" in msgs[0] and "ENOSYS" in msgs[0]


DENY_UNSHARE = textwrap.dedent("""\
    # as a container's seccomp profile does: unshare(2) fails with EPERM for this process and its children
    import asyncio, ctypes, logging, struct, sys
    libc = ctypes.CDLL(None, use_errno=True)
    rows = [(0x20, 0, 0, 0), (0x15, 0, 1, 272), (0x06, 0, 0, 0x50000 | 1), (0x06, 0, 0, 0x7FFF0000)]
    prog = b"".join(struct.pack("HBBI", *r) for r in rows)
    buf = ctypes.create_string_buffer(prog, len(prog))
    assert libc.prctl(38, 1, 0, 0, 0) == 0
    assert libc.syscall(317, 1, 0, ctypes.c_char_p(struct.pack("HxxxxxxQ", len(rows), ctypes.addressof(buf)))) == 0
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s", stream=sys.stdout)
    from hybridrl.agent.tools.sandbox import run_sandboxed
    for _ in range(2):
        r = asyncio.run(run_sandboxed("print(6 * 7)"))
    print(r.stdout.strip(), sorted(k for k, v in r.layers.items() if v.startswith("REFUSED")))
    r = asyncio.run(run_sandboxed("print(1)", required_layers=("namespaces",)))
    print("required:", r.returncode, r.stderr.strip())
    """)


def test_a_layer_the_kernel_refuses_is_logged_once_and_the_others_still_hold():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", DENY_UNSHARE], capture_output=True, text=True, timeout=60).stdout
    lines = out.strip().splitlines()
    logged = [ln for ln in lines if ln.startswith("hybridrl.sandbox")]
    assert len(logged) == 1 and "the namespaces layer is off" in logged[0] and "EPERM" in logged[0], out
    assert "42 ['namespaces']" in lines, out  # the code ran, with every other layer up
    assert "required: 3 SandboxError: required isolation layers are off on this machine: namespaces" in lines, out
