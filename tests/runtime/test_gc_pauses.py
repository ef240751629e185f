"""``GcPauses``: every collection of the process, timed per generation while installed."""

from __future__ import annotations

import gc

from consensus.runtime.gc_pauses import GcPauses


def test_collections_are_timed_per_generation_while_installed() -> None:
    pauses = GcPauses()
    pauses.install()
    pauses.install()  # (once only)
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        pauses.remove()
    assert pauses.by_generation[2].count == 1
    assert pauses.by_generation[0].count >= 1  # (and any the interpreter ran itself)
    assert pauses.by_generation[2].sum > 0
    counts = [h.count for h in pauses.by_generation]
    gc.collect(2)
    assert [h.count for h in pauses.by_generation] == counts  # removed: no longer timed
