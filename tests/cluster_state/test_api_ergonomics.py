"""Issue 21 point 6 (part): ``AllocationStore.connect`` takes "host:port" strings and refuses
anything else with a clear error; ``ReplicaNode`` is an async context manager that stops what it
started."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cluster_state.client import AllocationStore
from consensus.errors import ConfigError
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.statemachine import KVStore


@pytest.mark.parametrize("bad", ["127.0.0.1", "127.0.0.1:port", "127.0.0.1:0", ":7000",
                                 ("127.0.0.1", "7000"), ("127.0.0.1",), 7000])
def test_connect_refuses_what_is_not_an_address(bad: object) -> None:
    with pytest.raises(ConfigError, match="replica client address"):
        AllocationStore.connect([bad])  # type: ignore[list-item]


async def test_connect_takes_host_port_strings_and_pairs() -> None:
    store = AllocationStore.connect(["127.0.0.1:52101", ("127.0.0.1", 52102), "[::1]:52103"])
    await store.close()


async def test_a_replica_node_in_async_with_is_stopped_on_the_way_out(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(1, free_base_port(), wan=False))
    config = load_cluster_config(path)
    address = config.replica(0).client_address
    async with ReplicaNode(config, 0, KVStore(), fsync=False):
        _, writer = await asyncio.open_connection(*address)  # serving clients
        writer.close()
    with pytest.raises(OSError):  # stopped: its client port is closed
        await asyncio.open_connection(*address)
