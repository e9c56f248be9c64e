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


def test_rays_own_lines_go_to_ray_log_and_its_errors_to_the_console_too(tmp_path, monkeypatch, capsys):
    """Ray's "ray" logger as Ray sets it up when imported (its own stderr handler): after route_ray_lines its info
    and warnings are only in ray.log beside warnings.log, its errors in both; unroute_ray_lines puts it back."""
    import logging

    import ray  # noqa: F401  (configures the "ray" logger)

    monkeypatch.setenv(logs.WARNINGS_ENV, str(tmp_path / "warnings.log"))
    path = logs.ray_log_path()
    assert path == str(tmp_path / "ray.log")
    ray_logger = logging.getLogger("ray._private.worker")
    logs.route_ray_lines(path)
    try:
        ray_logger.info("Started a local Ray instance.")
        ray_logger.warning("Token authentication is enabled for this Ray cluster.")
        ray_logger.error("Unhandled error: ray::g() KeyError")
    finally:
        logs.unroute_ray_lines()
    console = capsys.readouterr().err
    assert "Unhandled error: ray::g() KeyError" in console
    assert "Started a local Ray instance" not in console and "Token authentication" not in console
    text = open(path).read()
    assert "INFO" in text and "Started a local Ray instance." in text and "WARNING" in text and "ERROR" in text
    ray_logger.warning("after unroute")
    assert "after unroute" in capsys.readouterr().err and "after unroute" not in open(path).read()
    monkeypatch.delenv(logs.WARNINGS_ENV)
    assert logs.ray_log_path() is None  # outside a trainer run Ray's lines stay where Ray puts them
