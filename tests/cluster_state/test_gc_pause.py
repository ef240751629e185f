"""``gc_paused`` and ``freeze_if_frozen``: the collector's state is what the caller had, and a
restored store joins a frozen heap only in a process that freezes its heap."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from cluster_state import ClusterStore, synthetic_config
from cluster_state.gc_pause import freeze, freeze_if_frozen, gc_paused, unfreeze


@pytest.fixture
def collector() -> Iterator[None]:
    """The test's changes to the collector undone after it (nothing frozen before: objects
    other tests froze are put back in the collector's view, which costs only time)."""
    enabled = gc.isenabled()
    unfreeze()
    yield
    unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_the_pause_keeps_a_disabled_collector_disabled(collector: None) -> None:
    gc.enable()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_nothing_is_frozen_in_a_process_that_freezes_nothing(collector: None) -> None:
    freeze_if_frozen()
    assert gc.get_freeze_count() == 0


def test_a_restored_store_is_frozen_where_the_built_one_was(collector: None) -> None:
    config = synthetic_config(nodes=16, vcs=2)
    built = ClusterStore(config)
    data = built.snapshot()
    restored = ClusterStore(config)
    restored.restore(data)
    assert gc.get_freeze_count() == 0  # this process freezes nothing: neither does restore
    gc.freeze()  # as ``sdpaxos serve`` does once its store is built
    frozen = gc.get_freeze_count()
    again = ClusterStore(config)
    again.restore(data)
    assert gc.get_freeze_count() > frozen
    assert not any(obj is again.allocator for obj in gc.get_objects())  # out of its view
    assert again.snapshot() == data


def test_a_freeze_made_here_is_known_without_counting_the_frozen(
    collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    freeze()  # as the store's plugin does once its store is built
    frozen = gc.get_freeze_count()

    def walked() -> int:
        raise AssertionError("gc.get_freeze_count walks every frozen object")

    monkeypatch.setattr(gc, "get_freeze_count", walked)
    ClusterStore(synthetic_config(nodes=16, vcs=2)).restore(
        ClusterStore(synthetic_config(nodes=16, vcs=2)).snapshot())
    monkeypatch.undo()
    assert gc.get_freeze_count() > frozen
