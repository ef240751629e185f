"""``gc_paused()``: no cyclic garbage collection while a large, long-lived structure is built.

A 100k-GPU topology, allocator or restored snapshot is millions of tuples, lists and dicts
made in one go and kept: the collector's passes over them, triggered by the allocations
themselves, find nothing to free and took about a third of a replica's start-up. The
structures hold no reference cycles that need collecting right away; whatever garbage the
build leaves is collected on the collector's next pass after it.

``freeze``, ``unfreeze`` and ``freeze_if_frozen`` are ``consensus.gc_freeze``'s: one record of
whether the process freezes (``sdpaxos serve`` freezes through it).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from consensus.gc_freeze import freeze, freeze_if_frozen, unfreeze

__all__ = ["freeze", "freeze_if_frozen", "gc_paused", "unfreeze"]


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
