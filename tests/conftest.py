"""Shared pytest setup: the repo root on sys.path, offline hub access, deterministic threads, and one temp folder
for the whole run (what the tests and the processes they start leave there is named at the end, then removed)."""
import logging
import os
import shutil
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
# With PYTHONDONTWRITEBYTECODE set (as on this project's machines) and a venv that uv installed without
# bytecode, every process the tests start (torchrun ranks, Ray workers, Ray's own services) compiled
# transformers, megatron-core and ray from source again: about a quarter of the CPU of a trainer launch. The
# first import of a module writes its .pyc (git ignores them); later processes load it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def _hybridrl_logger_restored():
    """An in-process run (run_ppo, main_eval) calls logs.setup(), which stops the "hybridrl" logger from
    propagating; caplog listens on the root logger, so later tests would see none of its records."""
    logger = logging.getLogger("hybridrl")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers, logger.level, logger.propagate = saved


_LEFT_IN_TEMP: list[str] = []


@pytest.fixture(scope="session", autouse=True)
def _suite_temp_folder(tmp_path_factory):
    """Issue 35: the test suite leaves nothing in the system temp folder. Every process the tests start (torchrun
    ranks, Ray and its workers, the sandbox) inherits TMPDIR = one folder of this session, removed at the end; what
    was still in it is listed in the summary, so that residue stays visible (e.g. torchrun's torchelastic_* log
    folders, a killed run's hybridrl-* folder). pytest's own tmp_path folders stay where pytest keeps and prunes them.
    The path is kept short: Ray's UNIX sockets live below it (tests/unit/test_run_temp_dirs.py)."""
    tmp_path_factory.getbasetemp()
    path = tempfile.mkdtemp(prefix="hrt-", dir="/tmp" if os.path.isdir("/tmp") else None)
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = path, path
    yield path
    if "ray" in sys.modules:  # an in-process Ray (tests calling init_ray) ends here, as atexit would end it later
        from hybridrl.controller import shutdown_ray

        shutdown_ray()
    if saved[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[0]
    tempfile.tempdir = saved[1]
    _LEFT_IN_TEMP.extend(sorted(set(os.listdir(path)) - _this_process_temp_dirs()))
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _run_table_dry(request, tmp_path_factory, _suite_temp_folder):
    """tests/e2e/test_run_table_dry.py's dry rows start with the session and run beside the other tests (which keep
    about one of CI's 2 cores busy), so that their ~5 minutes mostly overlap the rest of the suite; None when the
    session selects none of them. Stopped (every row's process group killed) before the temp folder goes."""
    items = [i for i in request.session.items if getattr(i, "originalname", "") == "test_dry_run"]
    table = items[0].module.start_table(request.session, tmp_path_factory) if items else None
    yield table
    if table is not None:
        table.stop()


def _this_process_temp_dirs() -> set[str]:
    """wandb's two temp folders of this pytest process (megatron-core imports wandb): they go at its exit."""
    found = set()
    for module, get in (("wandb.sdk.data_types._private", lambda m: m.MEDIA_TMP),
                        ("wandb.sdk.artifacts.artifact", lambda m: m.Artifact._TMP_DIR)):
        try:
            found.add(os.path.basename(get(sys.modules[module]).name))
        except (KeyError, AttributeError):
            pass
    return found


def pytest_terminal_summary(terminalreporter):
    if _LEFT_IN_TEMP:
        shown = ", ".join(_LEFT_IN_TEMP[:12]) + (" ..." if len(_LEFT_IN_TEMP) > 12 else "")
        terminalreporter.write_line(f"temp folder: the tests left {len(_LEFT_IN_TEMP)} entries there (removed): {shown}")
