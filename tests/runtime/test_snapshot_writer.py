"""Snapshots written off the event loop (``consensus.runtime.snapshot_writer``): one in flight
at a time, peers sent the previous one meanwhile, and a crash at any point of the writing
(the files as they stand then) restarts to the state the replica had."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from consensus.messages import Command
from consensus.protocol.types import SnapshotMeta
from consensus.runtime.node import ReplicaNode
from consensus.runtime.snapshot_writer import SnapshotWriter
from consensus.statemachine import KVStore, kv_put
from consensus.storage.wal import PreparedRewrite

from .polling import wait_until
from .test_snapshots import drain_replay, three_replicas

#: commands between two snapshots in these tests
EVERY = 200
#: how long a held write waits for the test to let it go (a failing test must not hang)
HOLD_S = 10.0


class Held:
    """A step of the worker held: its ``hold``-th call (1-based) waits until ``released``,
    before the step runs (``after``: once it ran)."""

    def __init__(self, hold: int = 1, *, after: bool = False) -> None:
        self.calls = 0
        self.holding = threading.Event()
        self.released = threading.Event()
        self._hold, self._after = hold, after

    def wrap(self, step: Callable[..., Any]) -> Callable[..., Any]:
        def held(*args: Any) -> Any:
            self.calls += 1
            mine = self.calls == self._hold
            if mine and not self._after:
                self._wait()
            result = step(*args)
            if mine and self._after:
                self._wait()
            return result

        return held

    def _wait(self) -> None:
        self.holding.set()
        self.released.wait(HOLD_S)


class HeldWrites(Held):
    """Stands in for a ``SnapshotWriter``'s writing: records each snapshot's slot and holds
    the ``hold``-th one (1-based) until ``released``, before its file is written (or after its
    file and the log's prepared rewrite are)."""

    def __init__(self, writer: SnapshotWriter, hold: int, *, after_file: bool = False) -> None:
        super().__init__(hold, after=after_file)
        self.slots: list[int] = []
        write = self.wrap(writer._write)

        def recorded(meta: SnapshotMeta, state: Callable[[], bytes], records: list[bytes],
                     room: int) -> tuple[bytes, PreparedRewrite]:
            self.slots.append(meta.slot)
            written: tuple[bytes, PreparedRewrite] = write(meta, state, records, room)
            return written

        writer._write = recorded  # type: ignore[method-assign]


async def load(node: ReplicaNode, first: int, count: int) -> None:
    await asyncio.gather(*(
        node.submit(Command(client_id=1, seq=i, op=kv_put(f"k{i % 40}", str(i)),
                            keys=(f"k{i % 40}",), blind=True))
        for i in range(first, first + count)
    ))


def cluster(tmp_path: Path) -> list[ReplicaNode]:
    config = three_replicas(tmp_path)
    return [ReplicaNode(config, i, KVStore(), fsync=False, snapshot_every=EVERY)
            for i in range(3)]


def restarted_from(files: Path, me: int) -> ReplicaNode:
    """Replica ``me`` of a new cluster whose data directory is ``files`` (a copy of the
    files as a crash left them), its replay executed (nothing else started)."""
    node = ReplicaNode(three_replicas(files), me, KVStore(), fsync=False)
    drain_replay(node)
    return node


def assert_restarts_with(files: Path, frontier: int, state: bytes) -> None:
    """Replica 0 restarted from ``files`` executes again through ``frontier`` and holds
    ``state``."""
    again = restarted_from(files, 0)
    assert again.core.exec_slot == frontier
    assert again.state_machine.snapshot() == state
    again.wal.close()


def crash_image(tmp_path: Path, me: int, name: str) -> Path:
    """The replica's files as they stand (the test's loop holds still meanwhile: no turn
    writes anything), copied where a restart reads them."""
    image = tmp_path / name
    shutil.copytree(tmp_path / f"replica-{me}", image / f"replica-{me}")
    return image


async def test_one_snapshot_is_in_flight_at_a_time_and_peers_get_the_previous(
    tmp_path: Path,
) -> None:
    nodes = cluster(tmp_path)
    held = HeldWrites(nodes[0].snapshots.writer, hold=2)
    for n in nodes:
        await n.start()
    try:
        await load(nodes[0], 0, EVERY + 50)
        await wait_until(lambda: nodes[0].snapshots.latest is not None, "the first snapshot")
        first = nodes[0].snapshots.latest
        assert first is not None and first[1].slot == held.slots[0]
        await load(nodes[0], 1000, EVERY + 50)  # the second one falls due and is held
        await wait_until(held.holding.is_set, "the second snapshot's writing")
        await load(nodes[0], 2000, 3 * EVERY)  # more fall due meanwhile: they wait
        total = 2 * (EVERY + 50) + 3 * EVERY
        await wait_until(lambda: nodes[0].stats.commands_applied >= total,
                         "the load did not execute")
        assert len(held.slots) == 2
        assert nodes[0].snapshots.latest is first  # what a peer behind is sent meanwhile
        held.released.set()
        # installed, and the next one (due meanwhile) taken after it (and maybe installed)
        await wait_until(lambda: len(held.slots) == 3, "no snapshot after the install")
        await wait_until(lambda: nodes[0].snapshots.latest is not first, "the held one installed")
        current = nodes[0].snapshots.latest
        assert current is not None and current[1].slot in held.slots[1:]
        await wait_until(lambda: nodes[1].executed_slot == nodes[0].executed_slot,
                         "replica 1 did not execute everything")
        frontier, state = nodes[0].core.exec_slot, nodes[0].state_machine.snapshot()
        assert nodes[1].state_machine.snapshot() == state
        nodes[0].snapshot_on_stop = False  # as if killed: the snapshot and its log
        await nodes[0].stop()
        assert_restarts_with(tmp_path, frontier, state)
    finally:
        held.released.set()
        for n in nodes:
            await n.stop()


async def crash_while_writing(tmp_path: Path, *, after_file: bool) -> None:
    nodes = cluster(tmp_path)
    held = HeldWrites(nodes[0].snapshots.writer, hold=2, after_file=after_file)
    for n in nodes:
        await n.start()
    try:
        await load(nodes[0], 0, EVERY + 50)
        await wait_until(lambda: nodes[0].snapshots.latest is not None, "the first snapshot")
        await load(nodes[0], 1000, EVERY + 50)
        await wait_until(held.holding.is_set, "the second snapshot's writing")
        await load(nodes[0], 2000, 100)  # logged while it is written
        await wait_until(lambda: nodes[0].stats.commands_applied >= 2 * EVERY + 200,
                         "the load did not execute")
        files = sorted(p.name for p in (tmp_path / "replica-0" / "snapshots").iterdir())
        held_file = f"snapshot-{held.slots[1]:020d}.bin"
        assert (held_file in files) == after_file
        frontier, state = nodes[0].core.exec_slot, nodes[0].state_machine.snapshot()
        image = crash_image(tmp_path, 0, "crash")
        held.released.set()
        assert_restarts_with(image, frontier, state)
    finally:
        held.released.set()
        for n in nodes:
            await n.stop()


async def test_a_crash_before_the_snapshot_file_is_written_restarts_from_the_old_one(
    tmp_path: Path,
) -> None:
    await crash_while_writing(tmp_path, after_file=False)


async def test_a_crash_after_the_file_before_the_log_rewrite_restarts_from_the_new_one(
    tmp_path: Path,
) -> None:
    await crash_while_writing(tmp_path, after_file=True)


async def test_on_the_loop_when_asked(tmp_path: Path) -> None:
    """``snapshot_off_loop=False``: each snapshot is whole on the loop (nothing in flight)."""
    config = three_replicas(tmp_path)
    nodes = [ReplicaNode(config, i, KVStore(), fsync=False, snapshot_every=EVERY,
                         snapshot_off_loop=False) for i in range(3)]
    writes = HeldWrites(nodes[0].snapshots.writer, hold=0)
    for n in nodes:
        await n.start()
    try:
        for first in range(0, 3 * EVERY, EVERY):  # a snapshot per round at least
            await load(nodes[0], first, EVERY)
        await wait_until(lambda: nodes[0].stats.snapshots_taken >= 2, "no snapshots")
        assert writes.slots == [] and nodes[0].snapshots.in_flight is None
    finally:
        for n in nodes:
            await n.stop()


def test_the_worker_thread_ends_with_the_node(tmp_path: Path) -> None:
    async def run() -> list[str]:
        nodes = cluster(tmp_path)
        for n in nodes:
            await n.start()
        try:
            await load(nodes[0], 0, EVERY + 10)
            await wait_until(lambda: nodes[0].snapshots.latest is not None, "no snapshot")
        finally:
            for n in nodes:
                await n.stop()
        return [t.name for t in threading.enumerate()]

    names = asyncio.run(asyncio.wait_for(run(), 60))
    assert not [name for name in names if name.startswith("snapshot-")]

