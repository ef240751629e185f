"""Sub-millisecond waits on the event loop, for the transport's WAN emulation.

asyncio's timers wake through ``epoll_wait`` with a millisecond timeout (rounded up) and
uvloop's through libuv's millisecond clock: an emulated one-way delay sent in the middle of a
loop turn came out 0.3-0.6 ms long on every hop, much of what a 20 ms round trip may exceed
its bound by. On Linux a ``timerfd`` armed at an absolute ``CLOCK_MONOTONIC`` instant (the clock
behind ``time.monotonic_ns``) wakes the loop's poller at that instant instead: ``sleep_until``
then costs one kernel timer and one reader callback, no thread. Elsewhere (or if the call
fails) it falls back to ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import heapq
import itertools
import os
import sys
import time

__all__ = ["PreciseTimer"]

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [
            ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p,
        ]  # fmt: skip
    except (OSError, AttributeError):
        return None
    return libc


_libc = _load_libc()


class PreciseTimer:
    """``await timer.sleep_until(deadline_us)`` on one event loop; ``close()`` when done."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []  # (due ns, n, future)
        self._order = itertools.count()
        self._armed_ns = 0
        self._fd = -1
        if _libc is not None:
            fd = _libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                self._loop.add_reader(fd, self._fired)

    @property
    def precise(self) -> bool:
        return self._fd >= 0

    async def sleep_until(self, deadline_us: int) -> None:
        """Return at ``deadline_us`` (``time.monotonic_ns() // 1000`` units) or just after."""
        if self._fd < 0:
            await asyncio.sleep(max(0.0, deadline_us / 1e6 - time.monotonic()))
            return
        due_ns = deadline_us * 1000
        future: asyncio.Future[None] = self._loop.create_future()
        heapq.heappush(self._waiting, (due_ns, next(self._order), future))
        if self._armed_ns == 0 or due_ns < self._armed_ns:
            self._arm(due_ns)
        await future

    def _arm(self, due_ns: int) -> None:
        assert _libc is not None
        spec = _Itimerspec()
        spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(max(due_ns, 1), 1_000_000_000)
        if _libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self._armed_ns = due_ns

    def _fired(self) -> None:
        with contextlib.suppress(BlockingIOError):  # re-armed after it fired: nothing to read
            os.read(self._fd, 8)
        self._armed_ns = 0
        now_ns = time.monotonic_ns()
        while self._waiting and self._waiting[0][0] <= now_ns:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)
        while self._waiting and self._waiting[0][2].done():  # cancelled sleepers
            heapq.heappop(self._waiting)
        if self._waiting:
            self._arm(self._waiting[0][0])

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        for _, _, future in self._waiting:
            future.cancel()
        self._waiting.clear()
