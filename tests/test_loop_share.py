"""``consensus.loop_share``: a worker thread hands the interpreter lock to the loop's thread
every ``SLICE_S`` of its work, and only a worker marked for it does."""

from __future__ import annotations

import functools
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cluster_state import ClusterStore, submit, synthetic_config
from consensus import loop_share
from consensus.messages import Command
from consensus.runtime.snapshot_writer import SnapshotWriter, release_gradually
from consensus.storage.wal import WriteAheadLog


class _Clock:
    """A fake ``time`` for ``loop_share``: ``perf_counter`` moves only when told; ``sleep``
    is recorded (and takes ``HAND_OVER_S``)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(loop_share, "time", fake)
    return fake


def _in_thread(work: Any, *, marked: bool) -> Any:
    with ThreadPoolExecutor(1, initializer=loop_share.shares_with_loop if marked else None) as pool:
        return pool.submit(work).result()


def test_a_marked_thread_hands_over_once_per_slice(clock: _Clock) -> None:
    def work() -> list[float]:
        for _ in range(3):  # within one slice: nothing
            clock.now += loop_share.SLICE_S / 4
            loop_share.give_way()
        assert clock.sleeps == []
        clock.now = loop_share.SLICE_S  # a whole slice since the thread was marked
        loop_share.give_way()
        loop_share.give_way()  # (the slice starts again after the hand-over)
        return list(clock.sleeps)

    assert _in_thread(work, marked=True) == [loop_share.HAND_OVER_S]


def test_an_unmarked_thread_never_waits(clock: _Clock) -> None:
    def work() -> None:
        for _ in range(10):
            clock.now += loop_share.SLICE_S
            loop_share.give_way()

    _in_thread(work, marked=False)
    work()  # the test's own thread (an event loop's, say) neither
    assert clock.sleeps == []


def test_the_snapshot_worker_gives_way(clock: _Clock, tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    writer = SnapshotWriter(tmp_path, wal, "test")
    try:
        def work() -> str:
            clock.now += loop_share.SLICE_S
            loop_share.give_way()
            return threading.current_thread().name

        assert writer.submit(work).result().startswith("test")
    finally:
        writer.close()
        wal.close()
    assert clock.sleeps == [loop_share.HAND_OVER_S]


def _filled_store(nodes: int, groups: int) -> tuple[ClusterStore, Any]:
    config = synthetic_config(nodes=nodes, vcs=4, pinned=1)
    store = ClusterStore(config)
    rng = random.Random(7)
    names = [vc.name for vc in config.virtual_clusters]
    for k in range(1, groups + 1):
        op = submit(f"g{k}", rng.choice(names), rng.randint(0, 1000), [(rng.choice([1, 2, 8]), 1)])
        store.apply(k, Command(client_id=1, seq=k, op=op))
    return store, config


def test_building_and_freeing_a_restored_store_give_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """The long parts of installing a peer's snapshot (the store's state built beside its own,
    the replaced state freed) call ``give_way`` throughout: every few thousand leaves, cells
    and groups. Counted with the real clock, each call a hand-over (``SLICE_S`` 0)."""
    monkeypatch.setattr(loop_share, "SLICE_S", 0.0)
    calls: list[float] = []

    class Counted:
        perf_counter = staticmethod(time.perf_counter)

        @staticmethod
        def sleep(seconds: float) -> None:
            calls.append(seconds)

    monkeypatch.setattr(loop_share, "time", Counted)
    store, config = _filled_store(nodes=256, groups=300)  # 2,048 GPUs
    data = store.snapshot()
    other = ClusterStore(config)
    adopt = _in_thread(lambda: other.prepare_restore(data), marked=True)
    built = len(calls)
    assert built >= 300  # a group at least once each, and the cells' chunks
    garbage = [adopt()]  # the only reference to what was replaced
    del adopt
    assert other.snapshot() == data
    _in_thread(functools.partial(release_gradually, garbage), marked=True)
    assert len(calls) > built + 10  # the replaced allocator's parts and chunks
    calls.clear()
    _in_thread(lambda: ClusterStore(config).prepare_restore(data), marked=False)
    assert calls == []  # elsewhere: nothing
