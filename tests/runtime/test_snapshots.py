"""Snapshots: the log is compacted, a replica that fell behind the compaction point rejoins by
installing a peer's snapshot, and a restart rebuilds from snapshot + compacted log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from consensus.messages import Command
from consensus.runtime import snapshot_pipeline
from consensus.runtime.cluster_config import ClusterConfig, parse_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.statemachine import KVStore, kv_get, kv_put

from .polling import wait_until


def three_replicas(tmp_path: Path) -> ClusterConfig:
    base = free_base_port()
    raw = {
        "cluster_id": "snap",
        "data_dir": str(tmp_path),
        "replica": [
            {"id": i, "address": f"127.0.0.1:{base + i}",
             "client_address": f"127.0.0.1:{base + 100 + i}", "site": site}
            for i, site in enumerate(["CA", "OR", "OH"])
        ],
    }
    return parse_cluster_config(raw, base=tmp_path, source="test")


def drain_replay(node: ReplicaNode) -> None:
    """Apply what a restarted core hands out first (its replay), as the loop's first turn."""
    ready = node.core.ready()
    for execution in ready.executions():
        node.state_machine.apply(execution.position, execution.command)
    node.core.advance(ready)


async def scenario(tmp_path: Path) -> None:
    config = three_replicas(tmp_path)

    def node(i: int) -> ReplicaNode:
        return ReplicaNode(config, i, KVStore(), fsync=False, snapshot_every=2000)

    nodes = [node(i) for i in range(3)]
    for n in nodes:
        await n.start()
    try:
        await asyncio.sleep(0.3)
        await nodes[2].stop()  # down while the others move on and compact
        seq = 0
        for _ in range(5):
            await asyncio.gather(*(
                nodes[i % 2].submit(Command(
                    client_id=i % 2, seq=seq + i, op=kv_put(f"k{(seq + i) % 500}", str(seq + i)),
                    keys=(f"k{(seq + i) % 500}",), blind=True,
                ))
                for i in range(2000)
            ))
            seq += 2000
        # (snapshots are written off the loop, one at a time: the last ones finish as the
        # replicas' heartbeats keep their turns going)
        await wait_until(lambda: all(n.stats.snapshots_taken >= 4 for n in nodes[:2]),
                         "the working replicas did not snapshot every 2000 commands")
        for n in nodes[:2]:
            assert n.sdpaxos is not None
            assert len(n.sdpaxos.o_log.executed) < 50  # per-slot state was compacted away
            assert len(list((tmp_path / f"replica-{n.me}" / "wal").glob("wal-*"))) == 1
        nodes[2] = node(2)
        await nodes[2].start()
        await wait_until(lambda: nodes[2].executed_slot >= nodes[0].executed_slot,
                         "the lagging replica did not catch up")
        assert nodes[2].stats.snapshots_installed == 1
        assert nodes[2].state_machine.snapshot() == nodes[0].state_machine.snapshot()
        # restart from snapshot + compacted log, then keep serving
        frontier = nodes[0].core.exec_slot
        state = nodes[0].state_machine.snapshot()
        nodes[0].snapshot_on_stop = False  # as if killed: its log holds what it executed
        await nodes[0].stop()
        nodes[0] = node(0)
        # it executes again from its own records what it executed before, with no peer
        assert nodes[0].core.exec_slot == frontier
        drain_replay(nodes[0])
        assert nodes[0].state_machine.snapshot() == state
        await nodes[0].start()
        result = await nodes[0].submit(Command(client_id=9, seq=0, op=kv_get("k1"), keys=("k1",)))
        assert result.value == nodes[1].state_machine.query(kv_get("k1"))
    finally:
        for n in nodes:
            await n.stop()


def test_compaction_snapshot_install_and_restart(tmp_path: Path) -> None:
    asyncio.run(asyncio.wait_for(scenario(tmp_path), 60))


async def brief_outage(tmp_path: Path) -> None:
    config = three_replicas(tmp_path)

    def node(i: int) -> ReplicaNode:
        return ReplicaNode(config, i, KVStore(), fsync=False, snapshot_every=500)

    async def write(first: int, count: int) -> None:
        await asyncio.gather(*(
            nodes[i % 2].submit(Command(client_id=i % 2, seq=i, op=kv_put(f"k{i % 50}", str(i)),
                                        keys=(f"k{i % 50}",), blind=True))
            for i in range(first, first + count)
        ))  # fmt: skip

    async def caught_up(replica: int) -> None:
        await wait_until(lambda: nodes[replica].executed_slot >= nodes[0].executed_slot,
                         "replica did not catch up")

    nodes = [node(i) for i in range(3)]
    for n in nodes:
        await n.start()
    try:
        await write(0, 600)
        await caught_up(2)
        await nodes[2].stop()  # misses one snapshot interval
        await write(600, 600)
        # blind writes are answered before they execute
        await wait_until(lambda: all(n.stats.commands_applied >= 1200 for n in nodes[:2]),
                         "the writes did not execute")
        assert [n.stats.snapshots_taken for n in nodes[:2]] == [2, 2]
        nodes[2] = node(2)
        await nodes[2].start()
        await caught_up(2)
        # the peers' logs still hold the interval it missed: no snapshot needed
        assert nodes[2].stats.snapshots_installed == 0
        assert nodes[2].state_machine.snapshot() == nodes[0].state_machine.snapshot()
    finally:
        for n in nodes:
            await n.stop()


def test_a_replica_that_missed_less_than_an_interval_catches_up_from_the_log(
    tmp_path: Path,
) -> None:
    asyncio.run(asyncio.wait_for(brief_outage(tmp_path), 60))


async def load(node: ReplicaNode, client: int, count: int, size: int = 16) -> None:
    await asyncio.gather(*(
        node.submit(Command(client_id=client, seq=i, op=kv_put(f"k{i % 50}", "v" * size),
                            keys=(f"k{i % 50}",), blind=True))
        for i in range(count)
    ))


async def test_snapshots_are_also_taken_by_log_bytes_and_by_time(tmp_path: Path) -> None:
    """Counting commands alone let big commands, or a slow trickle, grow the log (and what a
    restart reads and executes again) without bound."""
    config = three_replicas(tmp_path)
    by_bytes = [ReplicaNode(config, i, KVStore(), fsync=False, snapshot_every=10**9,
                            snapshot_bytes=200_000) for i in range(3)]
    for n in by_bytes:
        await n.start()
    try:
        for client in range(3):  # three rounds of ~200 KB of commands each
            await load(by_bytes[0], client, 100, size=2000)
        await wait_until(lambda: by_bytes[1].stats.snapshots_taken >= 2, "no snapshot by bytes")
        assert by_bytes[0].stats.snapshots_taken >= 2
    finally:
        for n in by_bytes:
            await n.stop()
    config = three_replicas(tmp_path / "time")
    by_time = [ReplicaNode(config, i, KVStore(), fsync=False, snapshot_every=10**9,
                           snapshot_interval_s=0.2) for i in range(3)]
    for n in by_time:
        await n.start()
    try:
        await asyncio.sleep(0.25)  # the interval passes; the next command's turn snapshots
        await load(by_time[0], 2, 10)  # a few commands: neither count nor bytes reached
        await wait_until(lambda: by_time[0].stats.snapshots_taken >= 1, "no snapshot by time")
        idle = by_time[0].stats.snapshots_taken
        await asyncio.sleep(0.3)  # nothing applied: no snapshot for time alone
        assert by_time[0].stats.snapshots_taken == idle
    finally:
        for n in by_time:
            await n.stop()


async def test_a_clean_stop_snapshots_so_a_restart_executes_nothing_again(tmp_path: Path) -> None:
    config = three_replicas(tmp_path)
    nodes = [ReplicaNode(config, i, KVStore(), fsync=False) for i in range(3)]
    for n in nodes:
        await n.start()
    try:
        await load(nodes[0], 1, 500)
        await wait_until(lambda: nodes[1].executed_slot == nodes[0].executed_slot > 0,
                         "replica 1 did not execute everything")
        frontier, state = nodes[1].core.exec_slot, nodes[1].state_machine.snapshot()
        assert nodes[1].stats.snapshots_taken == 0
        await nodes[1].stop()
        again = ReplicaNode(config, 1, KVStore(), fsync=False)
        assert again.core.exec_slot == frontier  # from the snapshot the stop took
        await again.turns.replay()
        assert again.stats.replayed_slots == 0 and again.stats.commands_applied == 0
        assert again.state_machine.snapshot() == state
        again.wal.close()
    finally:
        for n in (nodes[0], nodes[2]):
            await n.stop()


async def test_snapshots_are_taken_every_so_many_slots_whatever_the_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightly loaded, every command is a slot of its own: the command count alone let the
    log grow past what one vote can report (a restart that lost its executed records then
    could not finish a view change)."""
    monkeypatch.setattr(snapshot_pipeline, "SNAPSHOT_MAX_SLOTS", 20)
    config = three_replicas(tmp_path)
    nodes = [ReplicaNode(config, i, KVStore(), fsync=False, snapshot_every=10**9)
             for i in range(3)]
    for n in nodes:
        await n.start()
    try:
        for seq in range(45):  # one at a time: one command a slot
            await load_one(nodes[0], seq)
        await wait_until(lambda: nodes[0].stats.snapshots_taken >= 2, "no snapshot by slots")
        assert nodes[0].stats.commands_applied < 50
    finally:
        for n in nodes:
            await n.stop()


async def load_one(node: ReplicaNode, seq: int) -> None:
    await node.submit(Command(client_id=3, seq=seq, op=kv_put("k", str(seq)), keys=("k",),
                              blind=False))
