"""How long the cyclic garbage collector held the process, per generation
(``sdpaxos_gc_pause_seconds``).

A collection holds the interpreter lock, and so the replica's event loop, for its whole pass:
a young one is short, but one of the oldest generation walks every tracked object that is not
frozen (a 100k-GPU store's state built after start is hundreds of thousands of them). The
loop-stall histogram shows *that* the loop stalled; this one says whether the collector did
it. Measured by ``gc.callbacks`` (start and stop of every collection in the process), from
``start`` to ``stop``.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from consensus.runtime.histogram import Histogram

__all__ = ["GENERATIONS", "GcPauses"]

#: the collector's generations (0: youngest)
GENERATIONS = 3


class GcPauses:
    """Per generation, a histogram of collection pauses, while ``install``ed."""

    __slots__ = ("_began", "by_generation")

    def __init__(self) -> None:
        self.by_generation = [Histogram() for _ in range(GENERATIONS)]
        self._began = 0.0

    def install(self) -> None:
        """Start timing every collection of the process (until ``remove``)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.by_generation[info["generation"]].observe(time.perf_counter() - self._began)
