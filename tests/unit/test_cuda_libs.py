"""utils/cuda_libs: transformer-engine is pointed at torch's pip cuDNN, never over a user's choice."""
from __future__ import annotations

import os
import subprocess
import sys

from hybridrl.utils.cuda_libs import pin_cudnn_for_transformer_engine, torch_cudnn_home


def _fake_nvidia(root, with_lib: bool = True) -> str:
    lib = root / "nvidia" / "cudnn" / "lib"
    lib.mkdir(parents=True)
    (root / "nvidia" / "__init__.py").write_text("")
    if with_lib:
        (lib / "libcudnn.so.9").write_bytes(b"")
    return str(root / "nvidia" / "cudnn")


def test_torch_cudnn_home_finds_the_pip_copy(tmp_path, monkeypatch):
    home = _fake_nvidia(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    assert torch_cudnn_home() == home


def test_no_pip_cudnn_no_answer(tmp_path, monkeypatch):
    _fake_nvidia(tmp_path, with_lib=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert torch_cudnn_home() is None


def test_pin_sets_cudnn_home_only_when_the_user_did_not():
    env: dict[str, str] = {}
    assert pin_cudnn_for_transformer_engine(env, home="/x/nvidia/cudnn") == "/x/nvidia/cudnn"
    assert env == {"CUDNN_HOME": "/x/nvidia/cudnn"}
    for key in ("CUDNN_HOME", "CUDNN_PATH"):
        env = {key: "/opt/cudnn"}
        assert pin_cudnn_for_transformer_engine(env, home="/x/nvidia/cudnn") is None
        assert env == {key: "/opt/cudnn"}


def test_importing_hybridrl_pins_it_before_anything_else(tmp_path):
    # a fresh interpreter whose only pip cuDNN is the fake one: `import hybridrl` alone sets CUDNN_HOME to it
    home = _fake_nvidia(tmp_path)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k not in ("CUDNN_HOME", "CUDNN_PATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), root])
    out = subprocess.run([sys.executable, "-c", "import os, hybridrl; print(os.environ.get('CUDNN_HOME'))"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == home


def test_torch_cudnn_parts_are_loaded_by_full_path_graph_first_libcudnn_last(tmp_path):
    from hybridrl.utils.cuda_libs import CUDNN_PARTS, preload_torch_cudnn

    home = _fake_nvidia(tmp_path)
    lib = os.path.join(home, "lib")
    for part in CUDNN_PARTS:
        open(os.path.join(lib, f"libcudnn_{part}.so.9"), "w").close()
        open(os.path.join(lib, f"libcudnn_{part}.so.9.10.2"), "w").close()  # the soname (shortest) is the one
    os.remove(os.path.join(lib, "libcudnn_adv.so.9"))
    os.remove(os.path.join(lib, "libcudnn_adv.so.9.10.2"))  # a part this build lacks is passed over
    calls = []

    def load(path):
        calls.append(path)
        if "heuristic" in path:
            raise OSError("will not load")

    loaded = preload_torch_cudnn(home, load)
    names = [os.path.basename(p) for p in calls]
    assert names == ["libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_heuristic.so.9", "libcudnn_cnn.so.9",
                     "libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9", "libcudnn.so.9"]
    assert [os.path.basename(p) for p in loaded] == [n for n in names if "heuristic" not in n]


def test_a_user_set_cudnn_is_not_preloaded_over(tmp_path, monkeypatch):
    import hybridrl.utils.cuda_libs as cuda_libs

    calls = []
    monkeypatch.setattr(cuda_libs, "preload_torch_cudnn", lambda home: calls.append(home))
    monkeypatch.setattr(cuda_libs, "_has_transformer_engine", lambda: True)
    assert pin_cudnn_for_transformer_engine({"CUDNN_PATH": "/opt/cudnn"}, home="/x/nvidia/cudnn") is None
    assert calls == []
    assert pin_cudnn_for_transformer_engine({}, home="/x/nvidia/cudnn") == "/x/nvidia/cudnn"
    assert calls == ["/x/nvidia/cudnn"]
    # without transformer-engine nothing reads cuDNN at import: CUDNN_HOME only
    monkeypatch.setattr(cuda_libs, "_has_transformer_engine", lambda: False)
    env: dict[str, str] = {}
    assert pin_cudnn_for_transformer_engine(env, home="/x/nvidia/cudnn") == "/x/nvidia/cudnn"
    assert calls == ["/x/nvidia/cudnn"] and env == {"CUDNN_HOME": "/x/nvidia/cudnn"}


def test_a_child_that_inherited_our_cudnn_home_preloads_too(monkeypatch):
    # spawn copies the parent's environment, CUDNN_HOME included: the child must still load torch's cuDNN parts
    import hybridrl.utils.cuda_libs as cuda_libs

    calls = []
    monkeypatch.setattr(cuda_libs, "preload_torch_cudnn", lambda home: calls.append(home))
    monkeypatch.setattr(cuda_libs, "_has_transformer_engine", lambda: True)
    env = {"CUDNN_HOME": "/x/nvidia/cudnn"}
    assert pin_cudnn_for_transformer_engine(env, home="/x/nvidia/cudnn") == "/x/nvidia/cudnn"
    assert calls == ["/x/nvidia/cudnn"]
    # a CUDNN_HOME elsewhere, or any CUDNN_PATH, is the user's: left alone
    for user in ({"CUDNN_HOME": "/opt/cudnn"}, {"CUDNN_HOME": "/x/nvidia/cudnn", "CUDNN_PATH": "/opt/cudnn"}):
        assert pin_cudnn_for_transformer_engine(dict(user), home="/x/nvidia/cudnn") is None
    assert calls == ["/x/nvidia/cudnn"]
