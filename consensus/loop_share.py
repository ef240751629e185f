"""Long work in a worker thread gives way to the event loop's thread: ``give_way()``.

A replica hands work too long for a loop turn to a worker thread (a peer's snapshot built into
a 100k-GPU store's state: 0.4 s of CPU; a backup's encoding; a digest; freeing a replaced
state). Both threads then want the interpreter lock, and CPython shares it between two
threads that both want it in turns of ``sys.getswitchinterval()`` (5 ms) each: every loop
turn took twice as long while the worker ran (a turn of 30 ms became 56-70 ms), and the
longest stall of the loop followed (123 ms while a 98k-GPU replica installed a snapshot).

So the worker takes the lock a little at a time: long work calls ``give_way()`` often (between
the groups it loads, the chunks it frees, the pieces it packs). In a thread that
``shares_with_loop`` marked, a call after at least ``SLICE_S`` of work since the last hand-over
sleeps ``HAND_OVER_S``: the loop's thread, if it waits for the lock, takes it, and the worker
gets it back only when the loop blocks on its selector or the interpreter forces a switch
(``switchinterval`` later). A busy loop thus runs about ``switchinterval / SLICE_S`` times as
long as the worker between two of its slices (5:1), and a loop waiting on sockets costs the
worker ``HAND_OVER_S`` per ``SLICE_S`` (a tenth). Elsewhere (the loop's own thread, tests, a
store's restore at start-up) ``give_way`` returns at once: a thread-local read.

What it cannot split: a single call that holds the lock (a C loop over 100k items, freeing a
large container at once) still holds it for its whole length; such calls are kept to a few
ms (``snapshot_writer.release_gradually``, ``C_LOOP_ITEMS`` chunks in the allocator).
"""

from __future__ import annotations

import threading
import time
from typing import Final

__all__ = ["HAND_OVER_S", "SLICE_S", "give_way", "shares_with_loop"]

#: the worker works at least this long between two hand-overs of the interpreter lock
SLICE_S: Final = 0.001
#: and then sleeps this long: long enough for a waiting thread to wake and take the lock
HAND_OVER_S: Final = 0.0001

_local = threading.local()


def shares_with_loop() -> None:
    """Mark the calling thread as a worker that gives way to an event loop's thread (a
    ``ThreadPoolExecutor``'s ``initializer``)."""
    _local.last = time.perf_counter()


def give_way() -> None:
    """In a thread marked by ``shares_with_loop``: hand the interpreter lock over if this
    thread has worked ``SLICE_S`` since it last did (see the module documentation); anywhere
    else, nothing."""
    last = getattr(_local, "last", None)
    if last is None:
        return
    now = time.perf_counter()
    if now - last >= SLICE_S:
        time.sleep(HAND_OVER_S)
        _local.last = time.perf_counter()
