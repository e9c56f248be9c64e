"""hybridrl's log records reach stderr at INFO (they were dropped before: no handler), once, and the level
comes from HYBRIDRL_LOG_LEVEL, which the Ray workers inherit."""
from __future__ import annotations

import logging

import pytest

from hybridrl.controller.runtime_env import forwarded_env
from hybridrl.utils import logs


@pytest.fixture
def fresh_logger():
    """The "hybridrl" logger without our handler (conftest.py puts the old state back afterwards)."""
    logger = logging.getLogger("hybridrl")
    logger.handlers = [h for h in logger.handlers if not isinstance(h, logs._Stderr)]
    return logger


def test_info_of_any_hybridrl_module_reaches_stderr_once(fresh_logger, capsys, monkeypatch):
    from hybridrl.adapters.megatron import offload  # imported through the adapters symlink

    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    logs.setup()
    logs.setup()
    offload.log.info("pinned %d GB", 18)
    logging.getLogger("hybridrl.hybrid.weight_sync").debug("not at INFO")
    err = capsys.readouterr().err
    assert err.count("pinned 18 GB") == 1 and "not at INFO" not in err
    assert "hybridrl INFO [hybridrl.adapters.megatron.offload] pinned 18 GB" in err
    assert logging.getLogger("vllm").level == logging.NOTSET  # other libraries untouched


def test_a_configured_root_logger_does_not_print_our_lines_again(fresh_logger, capsys, monkeypatch):
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    root = logging.getLogger()
    echo = logging.StreamHandler(logs._Stderr().stream)  # what a library's basicConfig leaves in a vLLM worker
    echo.setFormatter(logging.Formatter("ROOT:%(name)s:%(message)s"))
    root.addHandler(echo)
    try:
        logs.setup()
        logging.getLogger("hybridrl.hybrid.weight_sync").info("direct weight copy")
    finally:
        root.removeHandler(echo)
    err = capsys.readouterr().err
    assert err.count("direct weight copy") == 1 and "ROOT:" not in err


def test_the_level_comes_from_the_environment(fresh_logger, capsys, monkeypatch):
    monkeypatch.setenv(logs.LEVEL_ENV, "warning")
    logs.setup()
    logging.getLogger("hybridrl.x").info("quiet")
    logging.getLogger("hybridrl.x").warning("loud")
    err = capsys.readouterr().err
    assert "quiet" not in err and "loud" in err
    monkeypatch.setenv(logs.LEVEL_ENV, "chatty")
    with pytest.raises(ValueError, match="HYBRIDRL_LOG_LEVEL='chatty': use one of DEBUG, INFO"):
        logs.setup()


def test_ray_workers_inherit_the_level():
    assert forwarded_env({logs.LEVEL_ENV: "DEBUG", "HYBRIDRL_API_TOKEN": "x"}) == {logs.LEVEL_ENV: "DEBUG"}


def test_every_entry_point_reports_a_bad_level_as_a_config_mistake(fresh_logger, capsys, monkeypatch):
    """Exit status 2 and one line naming the variable, as for a bad override (it was a traceback)."""
    from hybridrl.trainer import main_eval, main_generation, main_ppo

    monkeypatch.setenv(logs.LEVEL_ENV, "chatty")
    assert main_generation.main([]) == 2
    assert main_eval.main([]) == 2
    with pytest.raises(SystemExit) as stop:
        main_ppo.main([])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("hybridrl: HYBRIDRL_LOG_LEVEL='chatty': use one of DEBUG") == 3 and "Traceback" not in err
