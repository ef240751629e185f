"""Snapshots: the log is compacted, a replica that fell behind the compaction point rejoins by
installing a peer's snapshot, and a restart rebuilds from snapshot + compacted log."""

from __future__ import annotations

import asyncio
from pathlib import Path

from consensus.messages import Command
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
        for n in nodes[:2]:
            assert n.stats.snapshots_taken >= 4
            assert len(n.core.log) < 50  # per-slot state was compacted away
            assert len(list((tmp_path / f"replica-{n.me}" / "wal").glob("wal-*"))) == 1
        nodes[2] = node(2)
        await nodes[2].start()
        await wait_until(lambda: nodes[2].core.exec_slot >= nodes[0].core.exec_slot,
                         "the lagging replica did not catch up")
        assert nodes[2].stats.snapshots_installed == 1
        assert nodes[2].state_machine.snapshot() == nodes[0].state_machine.snapshot()
        # restart from snapshot + compacted log, then keep serving
        frontier = nodes[0].core.exec_slot
        await nodes[0].stop()
        nodes[0] = node(0)
        assert nodes[0].core.exec_slot >= frontier - 1 or nodes[0].core.exec_slot > 0
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
        await wait_until(lambda: nodes[replica].core.exec_slot >= nodes[0].core.exec_slot,
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
