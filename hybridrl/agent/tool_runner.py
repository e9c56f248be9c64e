"""Tool calls, each on its own daemon thread and event loop, cut off at a timeout.

Why not a ThreadPoolExecutor: its threads are joined when the interpreter exits, so one tool that never
returns (a hung HTTP call, `await asyncio.sleep(3600)`) kept the trainer's process alive for ever after the
last step. Here a call that times out is cancelled on its own loop (a tool awaiting I/O stops at once), and
one stuck in blocking code is left on a daemon thread, which never holds up the exit. At most `max_threads`
calls run at once, abandoned ones included; further calls wait for a free slot within their own timeout.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, Optional


class _Call:
    def __init__(self, coro: Coroutine, caller: asyncio.AbstractEventLoop, done: asyncio.Future):
        self.coro, self.caller, self.done = coro, caller, done
        self.lock = threading.Lock()
        self.abandoned = False
        self.task: Optional[asyncio.Task] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    def abandon(self) -> None:
        """The caller gave up: cancel the tool's task on its own loop (or keep it from starting)."""
        with self.lock:
            self.abandoned = True
            if self.task is not None:
                try:
                    self.loop.call_soon_threadsafe(self.task.cancel)
                except RuntimeError:  # its loop has just finished
                    pass


class ToolRunner:
    def __init__(self, max_threads: int):
        if max_threads < 1:
            raise ValueError(f"max_threads={max_threads}: at least 1")
        self.max_threads = max_threads
        self._lock = threading.Lock()
        self._alive = 0

    @property
    def alive(self) -> int:
        """Calls whose threads still run (abandoned ones included)."""
        return self._alive

    async def run(self, coro: Coroutine, timeout_s: float) -> Any:
        """The coroutine's result; asyncio.TimeoutError past timeout_s (waiting for a slot included)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self._take_slot():
            if loop.time() >= deadline:
                coro.close()
                raise asyncio.TimeoutError
            await asyncio.sleep(0.01)
        call = _Call(coro, loop, loop.create_future())
        threading.Thread(target=self._work, args=(call,), name="agent-tool", daemon=True).start()
        try:
            return await asyncio.wait_for(call.done, max(deadline - loop.time(), 0.0))
        except BaseException:  # timeout, or the caller itself cancelled
            call.abandon()
            raise

    def _take_slot(self) -> bool:
        with self._lock:
            if self._alive >= self.max_threads:
                return False
            self._alive += 1
            return True

    def _work(self, call: _Call) -> None:
        try:
            outcome = self._execute(call)
        finally:  # the slot frees before the caller hears back: `alive` never counts a call that has answered
            with self._lock:
                self._alive -= 1
        if outcome is not None:
            try:
                call.caller.call_soon_threadsafe(_resolve, call.done, *outcome)
            except RuntimeError:  # the caller's loop is gone (its step ended): nobody waits for this result
                pass

    @staticmethod
    def _execute(call: _Call) -> Optional[tuple[Any, Optional[BaseException]]]:
        """(result, error) of the tool's coroutine on a fresh loop; None when the caller gave up before it ran."""
        loop = asyncio.new_event_loop()
        try:
            with call.lock:
                if call.abandoned:
                    call.coro.close()
                    return None
                call.task, call.loop = loop.create_task(call.coro), loop
            return loop.run_until_complete(call.task), None
        except BaseException as e:  # the tool's own exception, or its cancellation
            return None, e
        finally:
            loop.close()


def _resolve(done: asyncio.Future, result: Any, error: Optional[BaseException]) -> None:
    if done.done():
        return
    if error is not None:
        done.set_exception(error if isinstance(error, Exception) else RuntimeError(f"tool stopped: {error!r}"))
    else:
        done.set_result(result)
