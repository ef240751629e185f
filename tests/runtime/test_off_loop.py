"""Work kept off a replica's event loop (``consensus.runtime.snapshot_writer``, issue 38 point
4): a peer's snapshot is built by the worker while the replica goes on turning with its state
machine untouched, then installed with the replica's turns paused (the loop serving) until its
file and the log's rewrite are durable — a crash in between restarts consistently; a backup
holds the state of its barrier whatever applies while the worker encodes it; what a replaced
state held is freed a part at a time, and never what the live state shares."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgpack
import pytest

from consensus.messages import Command
from consensus.runtime import snapshot_pipeline
from consensus.runtime.client import Client
from consensus.runtime.node import ReplicaNode
from consensus.runtime.snapshot_writer import RELEASE_CHUNK, release_gradually
from consensus.statemachine import KVStore, StateMachine, kv_get, kv_put
from consensus.storage.snapshot import decode_snapshot, latest_snapshot

from .polling import wait_until
from .test_snapshot_writer import HOLD_S, Held, crash_image, restarted_from
from .test_snapshots import three_replicas

#: commands between two snapshots
EVERY = 200


async def write(node: ReplicaNode, first: int, count: int) -> None:
    await asyncio.gather(*(
        node.submit(Command(client_id=1, seq=i, op=kv_put(f"k{i % 40}", str(i)),
                            keys=(f"k{i % 40}",), blind=True))
        for i in range(first, first + count)
    ))


@contextlib.asynccontextmanager
async def behind_the_compaction(tmp_path: Path, hold: Held) -> AsyncIterator[list[ReplicaNode]]:
    """Replicas 0 and 1 serving, compacted past replica 2, which is restarted (the caller
    starts it) and must install a snapshot to catch up; ``hold`` let go and every replica
    stopped at the end."""
    config = three_replicas(tmp_path)
    nodes = [ReplicaNode(config, i, KVStore(), fsync=False, snapshot_every=EVERY)
             for i in range(3)]
    try:
        for n in nodes:
            await n.start()
        await nodes[2].stop()
        frontier = nodes[2].executed_slot
        for first in range(0, 4 * EVERY, EVERY):  # a snapshot per round at least
            await write(nodes[0], first, EVERY)
        await wait_until(lambda: all(n.sdpaxos is not None and n.sdpaxos.compacted > frontier
                                     for n in nodes[:2]), "the peers did not compact")
        nodes[2] = ReplicaNode(config, 2, KVStore(), fsync=False, snapshot_every=EVERY)
        yield nodes
    finally:
        hold.released.set()
        for n in nodes:
            await n.stop()


async def caught_up(nodes: list[ReplicaNode]) -> None:
    await wait_until(lambda: nodes[2].executed_slot >= nodes[0].executed_slot > 0,
                     "replica 2 did not catch up")
    await wait_until(lambda: nodes[2].state_machine.snapshot()
                     == nodes[0].state_machine.snapshot(), "replica 2's state differs")


async def test_a_snapshot_is_built_off_the_loop_while_the_replica_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    hold = Held()
    restore = hold.wrap(snapshot_pipeline.prepared_restore)
    monkeypatch.setattr(snapshot_pipeline, "prepared_restore", restore)
    async with behind_the_compaction(tmp_path, hold) as nodes:
        await nodes[2].start()
        await wait_until(hold.holding.is_set, "no snapshot was being built")
        lagging = nodes[2]
        state, turns = lagging.state_machine.snapshot(), lagging.stats.turns
        await write(nodes[0], 10_000, 50)
        # its core goes on turning (heartbeats, the peers' messages) and nothing touches
        # its state machine while the worker builds the new state
        await wait_until(lambda: lagging.stats.turns > turns + 5, "the replica stopped turning")
        assert lagging.state_machine.snapshot() == state
        assert lagging.stats.snapshots_installed == 0
        hold.released.set()
        await caught_up(nodes)
        assert lagging.stats.snapshots_installed == 1


async def test_an_install_pauses_the_turns_until_durable_and_a_crash_then_is_consistent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    hold = Held(after=True)  # the install's snapshot file written, the log not yet
    monkeypatch.setattr(snapshot_pipeline, "write_snapshot",
                        hold.wrap(snapshot_pipeline.write_snapshot))
    async with behind_the_compaction(tmp_path, hold) as nodes:
        await nodes[2].start()
        await wait_until(hold.holding.is_set, "the install's file was not written")
        lagging = nodes[2]
        turns = lagging.stats.turns
        received = lagging.transport.stats.frames_received
        await write(nodes[0], 10_000, 50)
        # the loop still reads its peers' frames, but no turn of the replica runs: the
        # installed core's records wait for its snapshot's file and the log's rewrite
        await wait_until(lambda: lagging.transport.stats.frames_received > received + 20,
                         "the replica's loop stopped reading")
        assert lagging.stats.turns == turns
        image = crash_image(tmp_path, 2, "crash")
        hold.released.set()
        await caught_up(nodes)
        # the files as the crash left them: the new snapshot and the old log, a usable pair
        found = latest_snapshot(image / "replica-2" / "snapshots")
        assert found is not None
        _, meta, state = found
        again = restarted_from(image, 2)
        assert again.core.exec_slot == meta.slot
        assert again.state_machine.snapshot() == state
        again.wal.close()


async def test_a_backup_holds_the_state_of_its_barrier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    captures: list[int] = []
    capture = snapshot_pipeline.capture_state

    def counted(machine: StateMachine) -> Callable[[], bytes]:
        captures.append(1)
        return capture(machine)

    monkeypatch.setattr(snapshot_pipeline, "capture_state", counted)
    config = three_replicas(tmp_path)
    nodes = [ReplicaNode(config, i, KVStore(), fsync=False) for i in range(3)]
    for n in nodes:
        await n.start()
    released = threading.Event()
    try:
        await write(nodes[0], 0, 100)
        await wait_until(lambda: nodes[0].stats.commands_applied >= 100, "not applied")
        before = nodes[0].state_machine.snapshot()
        # the worker busy: the backup is captured at its barrier and encoded afterwards
        nodes[0].snapshots.writer.submit(lambda: released.wait(HOLD_S))
        async with Client(1 << 43, [config.replica(0).client_address]) as client:
            backup = asyncio.ensure_future(client.backup())
            await wait_until(lambda: bool(captures), "the backup's barrier did not run")
            await write(nodes[0], 1000, 100)  # applied while the backup waits for the worker
            assert not backup.done()
            released.set()
            _, state = decode_snapshot(await backup)
        assert state == before
        restored = KVStore()
        restored.restore(state)
        assert msgpack.unpackb(restored.query(kv_get("k1")))[1] == "81"  # not 1001
    finally:
        released.set()
        for n in nodes:
            await n.stop()


class Cell:
    """Something a weak reference can watch."""

    def __init__(self, *held: object) -> None:
        self.held = list(held)


def test_what_nothing_else_holds_is_freed_and_what_is_shared_is_untouched() -> None:
    shared = [Cell() for _ in range(3 * RELEASE_CHUNK)]  # the live state holds it too
    shared_cell = Cell(shared)
    big = {f"g{i}": Cell(i, (i, "x")) for i in range(3 * RELEASE_CHUNK)}
    nested = [[Cell() for _ in range(100)] for _ in range(100)]
    atoms = list(range(5 * RELEASE_CHUNK))
    root = Cell(big, nested, atoms, (shared, Cell(shared_cell)), shared_cell)
    watched = [weakref.ref(x) for x in (root, next(iter(big.values())), nested[7][3])]
    garbage: list[object] = [root]
    del root, big, nested, atoms
    release_gradually(garbage)
    assert garbage == [] and all(ref() is None for ref in watched)
    assert len(shared) == 3 * RELEASE_CHUNK and shared_cell.held == [shared]


def test_a_closure_is_opened_and_the_machine_it_refers_to_is_not_touched() -> None:
    machine: StateMachine = KVStore()
    machine.apply(0, Command(client_id=1, seq=0, op=kv_put("a", "1"), keys=("a",)))
    source = KVStore()
    source.apply(0, Command(client_id=1, seq=0, op=kv_put("b", "2"), keys=("b",)))
    garbage: list[object] = [machine.prepare_restore(source.snapshot())]  # type: ignore[attr-defined]
    state = machine.snapshot()
    release_gradually(garbage)  # never adopted: the state built is freed, the machine kept
    assert garbage == [] and machine.snapshot() == state
