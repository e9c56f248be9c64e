"""The Python tool's sandbox without CAP_SYS_ADMIN, as a non-root user or root in most containers runs it: the
namespaces then come from a user namespace (hybridrl/agent/tools/sandbox/isolation.py, enter_namespaces), and every
layer must still be up and hold. Before, root without CAP_SYS_ADMIN lost the namespaces layer (tmpfs disk cap,
network namespace) with EPERM.

The trainer side runs under `setpriv` with capabilities taken from its bounding set (only root can do that here;
elsewhere the test is skipped: a non-root user already takes the user-namespace path in test_sandbox_redteam.py).
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")]

PROBES = textwrap.dedent("""\
    import asyncio, json, os, sys
    from hybridrl.agent.tools.sandbox import run_sandboxed
    victim = sys.argv[1]
    probes = {
        "ordinary": "import os\\nopen('f', 'w').write('x' * 10)\\nprint(os.path.getsize('f'), 6 * 7)",
        "write_outside": f"open({victim!r}, 'w').write('x')",
        "delete_outside": f"import os\\nos.remove({victim!r})",
        "disk_fill": "for i in range(64):\\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\\nprint('ESCAPED')",
        "parent_environ": "import os\\nprint('ESCAPED', open(f'/proc/{os.getppid()}/environ').read())",
        "fork": "import os\\nos.fork()\\nprint('ESCAPED')",
        "socket": "import socket\\nsocket.socket()\\nprint('ESCAPED')",
    }
    out = {}
    for name, code in probes.items():
        r = asyncio.run(run_sandboxed(code, audit_hook=False, file_mb=4, disk_mb=16))
        out[name] = {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr[-300:], "layers": r.layers}
    print(json.dumps(out))
    """)


def run_without(caps: str, victim: str) -> dict:
    cmd = ["setpriv", f"--bounding-set={caps}", "--inh-caps=-all", sys.executable, "-c", PROBES, victim]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_cap_sys_admin_every_layer_is_up_and_holds(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    results = run_without("-sys_admin", str(victim))
    for name, r in results.items():
        refused = [k for k, v in r["layers"].items() if v.startswith("REFUSED")]
        assert not refused, (name, r["layers"])
        assert "in a user namespace" in r["layers"]["namespaces"], r["layers"]
    assert results["ordinary"]["rc"] == 0 and results["ordinary"]["stdout"].split() == ["10", "42"]
    for name in ("write_outside", "delete_outside", "disk_fill", "parent_environ", "fork", "socket"):
        r = results[name]
        assert r["rc"] != 0 and "ESCAPED" not in r["stdout"], (name, r)
    assert "No space left" in results["disk_fill"]["stderr"] or "OSError" in results["disk_fill"]["stderr"]
    assert victim.read_text() == "keep"


def test_root_that_cannot_map_itself_is_told_why_and_the_other_layers_hold(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    results = run_without("-sys_admin,-setfcap", str(victim))
    layers = results["ordinary"]["layers"]
    assert layers["namespaces"].startswith("REFUSED: root without CAP_SYS_ADMIN or CAP_SETFCAP"), layers
    assert not [k for k, v in layers.items() if k != "namespaces" and v.startswith("REFUSED")], layers
    for name in ("write_outside", "delete_outside", "parent_environ", "fork", "socket"):
        assert results[name]["rc"] != 0 and "ESCAPED" not in results[name]["stdout"], (name, results[name])
    assert victim.read_text() == "keep"
