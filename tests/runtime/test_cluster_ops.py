"""``sdpaxos cluster health`` / ``netem``: a health probe and the tc commands of a replica."""

from __future__ import annotations

import asyncio
from pathlib import Path

from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.cluster_ops import check_health, netem_commands
from consensus.runtime.local_cluster import free_base_port


def test_netem_commands_delay_each_peer_by_its_one_way_time(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, 7000, wan=True).replace("127.0.0.1:7001", "10.0.0.2:7001"))
    config = load_cluster_config(path)
    commands = [" ".join(c) for c in netem_commands(config, 0, "eth0", resolve=False)]
    assert commands[0].startswith("tc qdisc replace dev eth0 root handle 1: prio bands 3")
    # CA-OR is a 20 ms round trip, CA-OH 52 ms (the paper's table): half of each, one way
    assert "tc qdisc add dev eth0 parent 1:2 handle 20: netem delay 10.000ms" in commands
    assert "tc qdisc add dev eth0 parent 1:3 handle 30: netem delay 26.000ms" in commands
    assert any("match ip dst 10.0.0.2/32 flowid 1:2" in c for c in commands)


def test_health_fails_when_nothing_serves(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    config = load_cluster_config(path)
    assert asyncio.run(check_health(config, 0, timeout_s=0.3)) is False


def test_health_succeeds_once_a_view_serves(tmp_path: Path) -> None:
    from consensus.runtime.node import ReplicaNode
    from consensus.statemachine import KVStore

    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    config = load_cluster_config(path)

    async def run() -> bool:
        nodes = [ReplicaNode(config, i, KVStore(), fsync=False) for i in range(3)]
        for node in nodes:
            await node.start()
        try:
            for _ in range(50):
                if await check_health(config, 2, timeout_s=0.5):
                    return True
            return False
        finally:
            for node in nodes:
                await node.stop()

    assert asyncio.run(run())
