"""The native client: concurrent first calls share one connection (a race once failed them all
with "connection to replica lost"); a call cancelled as its reply arrives is cancelled."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest

from consensus.codec import FrameReader, frame_to_wire
from consensus.errors import DefiniteFailure, TlsRefused
from consensus.messages import MAX_OP_BYTES, Command
from consensus.runtime.cli import cluster_toml
from consensus.runtime.client import Client, cut_off
from consensus.runtime.client_protocol import (
    NO_REQUEST,
    ClientRequest,
    ClientResponse,
    decode_response,
)
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


def test_an_oversize_request_is_refused_naming_its_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 34: a 1 MiB put got an IndefiniteFailure with an empty reason after the client's
    timeout, and the replica logged nothing."""
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    config = load_cluster_config(path)

    async def run() -> None:
        nodes = [ReplicaNode(config, i, KVStore(), fsync=False) for i in range(3)]
        for node in nodes:
            await node.start()
        try:
            address = config.replica(0).client_address
            async with Client(7, [address], timeout_s=5.0, attempts=1) as client:
                with pytest.raises(DefiniteFailure, match=f"over the limit of {MAX_OP_BYTES} "
                                                          "bytes; nothing was sent"):
                    await client.execute(kv_put("big", "x" * (1 << 20)), ["big"])
            # a client that sends it anyway is answered under the request's own id, at once
            reader, writer = await asyncio.open_connection(*address)
            big = Command(client_id=7, seq=0, op=b"x" * (MAX_OP_BYTES + 8), keys=())
            writer.write(frame_to_wire(ClientRequest(42, "cmd", big).encode()))
            frames = FrameReader()
            async with asyncio.timeout(5):
                while not (payloads := frames.feed(await reader.read(1 << 16))):
                    pass
            answer = decode_response(payloads[0])
            assert (answer.req_id, answer.status) == (42, "error")
            assert f"is over the limit of {MAX_OP_BYTES} bytes" in str(answer.payload)
            writer.close()
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))
    assert any("refusing a request of the client" in r.getMessage() and "over the limit" in
               r.getMessage() for r in caplog.records)


def test_an_answer_to_no_request_fails_every_request_of_the_connection() -> None:
    """A refusal the replica cannot tie to a request (req_id 0: a certificate refused) is
    the answer to every request in flight on the connection, at once."""

    async def run() -> None:
        async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(frame_to_wire(ClientResponse(NO_REQUEST, "denied", "revoked").encode()))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(refuse, "127.0.0.1", 0)
        try:
            async with Client(7, [server.sockets[0].getsockname()[:2]], timeout_s=30.0,
                              attempts=1) as client, asyncio.timeout(10):
                with pytest.raises(TlsRefused, match="revoked"):
                    await client.read(b"op")
        finally:
            server.close()

    asyncio.run(run())
