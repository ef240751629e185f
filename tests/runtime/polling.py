"""Waiting in the runtime tests: poll a condition, fail naming it after a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_until(done: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Return once ``done()`` holds; fail with ``what`` if it still does not after
    ``timeout_s`` (checked every 20 ms)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)
