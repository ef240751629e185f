"""``gc_paused``: the collector is off inside, and as the caller had it after."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from cluster_state.gc_pause import gc_paused


@pytest.fixture
def collector() -> Iterator[None]:
    """The test's changes to the collector undone after it."""
    enabled = gc.isenabled()
    yield
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

