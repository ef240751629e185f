"""The native client: concurrent first calls share one connection (a race once failed them all
with "connection to replica lost")."""

from __future__ import annotations

import asyncio
from pathlib import Path

from consensus.runtime.cli import cluster_toml
from consensus.runtime.client import Client
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.statemachine import KVStore, kv_put


def test_concurrent_first_calls_on_a_new_client_all_succeed(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    config = load_cluster_config(path)

    async def run() -> list[str]:
        nodes = [ReplicaNode(config, i, KVStore(), fsync=False) for i in range(3)]
        for node in nodes:
            await node.start()
        client = Client(7, [spec.client_address for spec in config.replicas], timeout_s=5.0)
        try:
            replies = await asyncio.gather(
                *[client.execute(kv_put(f"k{i}", "v"), [f"k{i}"]) for i in range(64)]
            )
            return [reply.status for reply in replies]
        finally:
            await client.close()
            for node in nodes:
                await node.stop()

    assert asyncio.run(asyncio.wait_for(run(), 60)) == ["ok"] * 64
