"""``consensus.gc_freeze``: a process that froze through it is never asked again how much it
froze (``gc.get_freeze_count`` walks every frozen object with the interpreter lock held: a
replica's event loop stalled 30-150 ms when a 100k-GPU store's restore asked)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from consensus import gc_freeze


@pytest.fixture
def collector() -> Iterator[None]:
    enabled = gc.isenabled()
    gc_freeze.unfreeze()
    yield
    gc_freeze.unfreeze()
    if enabled:
        gc.enable()


def _count_asks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    asked: list[int] = []
    real = gc.get_freeze_count

    def counted() -> int:
        asked.append(1)
        return real()

    monkeypatch.setattr(gc, "get_freeze_count", counted)
    return asked


def test_a_remembered_freeze_is_never_asked_about(collector: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    gc_freeze.freeze()  # as ``sdpaxos serve`` does once its store is built
    asked = _count_asks(monkeypatch)
    kept = [[k] for k in range(100)]  # built since: frozen by the next call
    gc_freeze.freeze_if_frozen()
    assert asked == []
    assert not any(obj is kept[0] for obj in gc.get_objects())  # out of the collector's view


def test_a_freeze_behind_its_back_is_found_once(collector: None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _count_asks(monkeypatch)
    gc_freeze.freeze_if_frozen()  # nothing frozen: asked, and nothing frozen
    assert asked == [1] and gc.get_freeze_count() == 0
    gc.freeze()  # not through gc_freeze
    gc_freeze.freeze_if_frozen()
    gc_freeze.freeze_if_frozen()
    assert len(asked) == 3  # (the test's own count above, then once: remembered after)
