"""Other packages' warnings go to the run's warnings.log (logs.route_warnings), hybridrl's stay on the console."""
import os
import warnings

from hybridrl.utils import logs


def test_third_party_warnings_go_to_the_file_and_ours_to_the_console(tmp_path, monkeypatch):
    console = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *a, **k: console.append(str(message)))
    path = str(tmp_path / "warnings.log")
    logs.route_warnings(path)
    ours = os.path.join(os.path.dirname(os.path.abspath(logs.__file__)), "x.py")
    warnings.showwarning("Apex is not installed", UserWarning, "/venv/site-packages/megatron/core/a.py", 3)
    warnings.showwarning("a hybridrl warning", UserWarning, ours, 7)
    warnings.showwarning("The .grad attribute ... (Triggered internally at TensorBody.h:493.)", UserWarning, ours, 9)
    text = open(path).read()
    assert "Apex is not installed" in text and f"[pid {os.getpid()}]" in text and "a hybridrl warning" not in text
    assert "Triggered internally" in text  # torch's own warning, raised through a hybridrl line
    assert console == ["a hybridrl warning"]
