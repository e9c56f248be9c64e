"""tests/fixtures/child.in_child: a result comes back from a fresh interpreter, an error is raised here, and a hung
child is killed at its timeout."""
from __future__ import annotations

import os
import time

import pytest

from tests.fixtures.child import in_child


def _pid_and_sum(a: int, b: int) -> tuple[int, int]:
    return os.getpid(), a + b


def _fails() -> None:
    raise ValueError("from the child")


def _hangs() -> None:
    time.sleep(600)


@pytest.mark.timeout(120)
def test_the_result_comes_back_from_another_process():
    pid, total = in_child(_pid_and_sum, 2, 3)
    assert total == 5 and pid != os.getpid()


@pytest.mark.timeout(120)
def test_the_childs_exception_is_raised_here():
    with pytest.raises(ValueError, match="from the child"):
        in_child(_fails)


@pytest.mark.timeout(120)
def test_a_hung_child_is_killed_at_its_timeout():
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        in_child(_hangs, timeout_s=5)
    assert time.monotonic() - start < 60
