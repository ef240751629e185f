"""The native client: concurrent first calls share one connection (a race once failed them all
with "connection to replica lost"); a call cancelled as its reply arrives is cancelled."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from consensus.runtime.cli import cluster_toml
from consensus.runtime.client import Client
from consensus.runtime.client_protocol import ClientResponse
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


def test_a_call_cancelled_as_its_reply_arrives_is_cancelled() -> None:
    """Python 3.11's ``asyncio.wait_for`` returns the result when the awaited future completes
    in the same loop turn as the cancel (CPython gh-86296): a watch loop around such a call
    then ran on after its task was cancelled (the end-to-end test's hang at teardown)."""

    async def run() -> None:
        server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
        client = Client(7, [server.sockets[0].getsockname()[:2]], timeout_s=5.0)
        try:
            call = asyncio.create_task(client.read(b"op"))
            connection = client._connections[0]
            while not connection.pending:
                await asyncio.sleep(0)
            (req_id, future), = connection.pending.items()
            future.set_result(ClientResponse(req_id, "ok", b"value"))
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        finally:
            await client.close()
            server.close()

    asyncio.run(asyncio.wait_for(run(), 10))
