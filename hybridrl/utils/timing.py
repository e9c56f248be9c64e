"""Wall-clock timing of named phases (the trainer's timing_s/* metrics, the workers' start-up parts)."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def timed(timing: dict[str, float], name: str) -> Iterator[None]:
    """Adds the block's seconds to timing[name] (also when it raises)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing[name] = timing.get(name, 0.0) + time.perf_counter() - start
