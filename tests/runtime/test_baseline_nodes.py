"""The asyncio node runs the baseline cores too (``[protocol] name`` in the cluster file)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest

from consensus.errors import ConfigError
from consensus.messages import Command
from consensus.protocol.mencius import MenciusReplica
from consensus.protocol.multipaxos import MultiPaxosReplica
from consensus.runtime.cluster_config import ClusterConfig, parse_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.metrics import render
from consensus.runtime.node import ReplicaNode
from consensus.statemachine import KVStore, kv_cas, kv_get, kv_put

from .polling import wait_until


def cluster(tmp_path: Path, protocol: dict[str, object]) -> ClusterConfig:
    base = free_base_port()
    raw = {
        "cluster_id": "baseline",
        "data_dir": str(tmp_path),
        "replica": [
            {"id": i, "address": f"127.0.0.1:{base + i}",
             "client_address": f"127.0.0.1:{base + 100 + i}", "site": site}
            for i, site in enumerate(["CA", "OR", "OH"])
        ],
        "protocol": protocol,
    }  # fmt: skip
    return parse_cluster_config(raw, base=tmp_path, source="test")


async def scenario(config: ClusterConfig) -> None:
    nodes = [ReplicaNode(config, i, KVStore(), fsync=False) for i in range(3)]
    for node in nodes:
        await node.start()
    try:
        writes = [
            nodes[i % 3].submit(
                Command(
                    client_id=i, seq=1, op=kv_put(f"k{i}", f"v{i}"), keys=(f"k{i}",), blind=True
                )
            )
            for i in range(30)
        ]
        await asyncio.gather(*writes)
        swapped = await nodes[1].submit(
            Command(client_id=99, seq=1, op=kv_cas("k4", "v4", "new"), keys=("k4",))
        )
        assert msgpack.unpackb(swapped.value) == ["cas", True, "v4"]
        value = await nodes[2].read(Command(client_id=98, seq=1, op=kv_get("k4"), keys=("k4",)))
        assert msgpack.unpackb(value) == ["value", "new"]
        await wait_until(lambda: len({node.executed_slot for node in nodes}) == 1,
                         "replicas did not converge", timeout_s=5)
        assert len({node.state_machine.snapshot() for node in nodes}) == 1
        assert "sdpaxos_is_sequencer 0" in render(nodes[0])
        leads = config.protocol_name == "multipaxos"  # (its leader: replica 1)
        assert f"sdpaxos_is_sequencer {int(leads)}" in render(nodes[1])
        assert "sdpaxos_c_recoveries_total 0" in render(nodes[0])
    finally:
        for node in nodes:
            await node.stop()


@pytest.mark.parametrize(
    ("name", "core"), [("multipaxos", MultiPaxosReplica), ("mencius", MenciusReplica)]
)
def test_nodes_run_a_baseline_core(tmp_path: Path, name: str, core: type) -> None:
    config = cluster(tmp_path, {"name": name, "heartbeat_us": 20_000, "leader": 1})
    assert config.protocol_name == name and config.protocol.leader == 1
    node = ReplicaNode(config, 0, KVStore(), fsync=False)
    assert isinstance(node.core, core)
    node.wal.close()
    asyncio.run(asyncio.wait_for(scenario(config), 30))


def test_the_protocol_name_is_checked(tmp_path: Path) -> None:
    assert cluster(tmp_path, {}).protocol_name == "sdpaxos"
    with pytest.raises(ConfigError, match=r"\[protocol\].name must be one of"):
        cluster(tmp_path, {"name": "raft"})


async def lagging_follower(config: ClusterConfig) -> None:
    def node(i: int) -> ReplicaNode:
        return ReplicaNode(config, i, KVStore(), fsync=False, snapshot_every=100)

    nodes = [node(i) for i in range(3)]
    for n in nodes:
        await n.start()
    try:
        await nodes[2].stop()  # a follower misses everything while the others compact
        for seq in (1, 2):  # two snapshots: the log is compacted to the first
            await asyncio.gather(*(
                nodes[i % 2].submit(Command(
                    client_id=i, seq=seq, op=kv_put(f"k{i}", "v"), keys=(f"k{i}",), blind=True
                ))
                for i in range(400)
            ))  # fmt: skip
        # the second snapshot is written off the loop: it may still be in flight here
        await wait_until(lambda: nodes[0].stats.snapshots_taken >= 2, "two snapshots taken")
        nodes[2] = node(2)
        await nodes[2].start()
        await wait_until(lambda: nodes[2].executed_slot >= nodes[0].executed_slot,
                         "the lagging follower did not catch up")
        assert nodes[2].stats.snapshots_installed == 1
        assert nodes[2].state_machine.snapshot() == nodes[0].state_machine.snapshot()
    finally:
        for n in nodes:
            await n.stop()


def test_a_multipaxos_follower_behind_the_compaction_point_installs_a_snapshot(
    tmp_path: Path,
) -> None:
    config = cluster(tmp_path, {"name": "multipaxos", "heartbeat_us": 20_000,
                                "catchup_us": 50_000})  # fmt: skip
    asyncio.run(asyncio.wait_for(lagging_follower(config), 30))
