"""ToolRunner: timeouts cancel awaiting tools, blocked tools never keep the process from exiting, results and
errors come back, and calls beyond max_threads wait for a slot."""
import asyncio
import subprocess
import sys
import textwrap
import time

import pytest

from hybridrl.agent.tool_runner import ToolRunner


async def _sleep_then(value, seconds):
    await asyncio.sleep(seconds)
    return value


async def _raise():
    raise ValueError("tool bug")


def test_result_and_error_come_back():
    runner = ToolRunner(2)
    assert asyncio.run(runner.run(_sleep_then(7, 0.01), 5.0)) == 7
    with pytest.raises(ValueError, match="tool bug"):
        asyncio.run(runner.run(_raise(), 5.0))
    assert runner.alive == 0


def test_an_awaiting_tool_is_cancelled_at_its_timeout():
    runner = ToolRunner(2)
    t0 = time.perf_counter()
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(runner.run(_sleep_then(1, 3600), 0.2))
    assert time.perf_counter() - t0 < 2
    for _ in range(100):  # the cancelled task ends its thread
        if runner.alive == 0:
            break
        time.sleep(0.02)
    assert runner.alive == 0


def test_calls_beyond_max_threads_wait_for_a_slot():
    runner = ToolRunner(2)

    async def four():
        return await asyncio.gather(*(runner.run(_sleep_then(i, 0.3), 5.0) for i in range(4)))

    t0 = time.perf_counter()
    assert asyncio.run(four()) == [0, 1, 2, 3]
    assert time.perf_counter() - t0 >= 0.55  # two rounds of two


@pytest.mark.timeout(60)
def test_a_blocked_tool_does_not_keep_the_process_alive():
    # A tool stuck in blocking code for 60 s: the call times out at 0.3 s and the interpreter exits at once.
    # (With a ThreadPoolExecutor the exit joined the stuck thread: this process lived for the full 60 s.)
    script = textwrap.dedent("""
        import asyncio, time
        from hybridrl.agent.tool_runner import ToolRunner

        async def blocked():
            time.sleep(60)

        try:
            asyncio.run(ToolRunner(1).run(blocked(), 0.3))
        except asyncio.TimeoutError:
            print("timed out")
    """)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=40)
    assert out.returncode == 0 and "timed out" in out.stdout, out.stderr
    assert time.perf_counter() - t0 < 20
