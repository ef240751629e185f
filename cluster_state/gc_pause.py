"""``gc_paused()``: no cyclic garbage collection while a large, long-lived structure is built.

A 100k-GPU topology, allocator or restored snapshot is millions of tuples, lists and dicts
made in one go and kept: the collector's passes over them, triggered by the allocations
themselves, find nothing to free and took about a third of a replica's start-up. The
structures hold no reference cycles that need collecting right away; whatever garbage the
build leaves is collected on the collector's next pass after it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector for the block (enabled again after it only if it was
    enabled before: nested uses and a caller's own ``gc.disable()`` are kept)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

