"""The native client: concurrent first calls share one connection (a race once failed them all
with "connection to replica lost"); a call cancelled as its reply arrives is cancelled."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest

from consensus.errors import DefiniteFailure
from consensus.runtime.cli import cluster_toml
from consensus.runtime.client import Client, cut_off
from consensus.runtime.client_protocol import ClientResponse
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.statemachine import CANCELLED, KVStore, kv_cas, kv_get, kv_put


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


def test_a_request_whose_fate_was_lost_is_settled_through_the_log(tmp_path: Path) -> None:
    """Issue 39: the client's home replica is cut off from its peers with the client's cas in
    an instance of its own. The client hears nothing, and settles the request at the next
    replica: the cancel comes first in the log, so the request failed for good — and when
    the home replica is healed and its copy is chosen and executed after all, that copy is
    answered ``cancelled`` and changes nothing."""
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    config = load_cluster_config(path)
    addresses = [spec.client_address for spec in config.replicas]

    async def run() -> None:
        nodes = [ReplicaNode(config, i, KVStore(), fsync=False, fault_injection=True)
                 for i in range(3)]
        for node in nodes:
            await node.start()
        home = 1  # not the sequencer: its instance is stuck without a majority
        client = Client(7, addresses, home=home, timeout_s=0.5, attempts=1)
        try:
            await client.execute(kv_put("warm", "up"), ["warm"])
            await cut_off(addresses[home], [0, 2])
            seq = client.next_seq()
            with pytest.raises(DefiniteFailure, match="cancelled before any copy"):
                await client.execute(kv_cas("k", None, "mine"), ["k"], seq=seq)
            await cut_off(addresses[home], [])  # heal: the stuck copy is chosen and runs
            stores = [node.state_machine for node in nodes]
            assert all(isinstance(store, KVStore) for store in stores)
            await client.execute(kv_put("after", "heal"), ["after"])  # ordered after it all
            deadline = asyncio.get_running_loop().time() + 10
            while any(store.data.get("after") is None for store in stores):  # type: ignore[attr-defined]
                assert asyncio.get_running_loop().time() < deadline, "replicas did not catch up"
                await asyncio.sleep(0.05)
            for store in stores:
                assert store.sessions.lookup(7, seq) == CANCELLED  # type: ignore[attr-defined]
                assert store.data.get("k") is None  # type: ignore[attr-defined]
            # the same request again (a retry the client sends later): still failed for good
            with pytest.raises(DefiniteFailure, match="cancelled before any copy"):
                await client.execute(kv_cas("k", None, "mine"), ["k"], seq=seq)
            reply = await client.read(kv_get("k"), ["k"])
            assert msgpack.unpackb(reply.payload) == ["value", None]
        finally:
            await client.close()
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))
