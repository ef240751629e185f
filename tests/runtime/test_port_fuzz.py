"""Random and mutated bytes sent to a live replica's peer and client ports: the replica stays
up, answers afterwards, and its state does not change."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import msgpack
import pytest

from consensus.codec import FORMAT_VERSION, FrameReader, encode_frame, frame_to_wire
from consensus.errors import DefiniteFailure
from consensus.messages import Command, Heartbeat
from consensus.runtime.client import Client, cut_off
from consensus.runtime.client_protocol import ClientRequest, decode_response, encode_partition
from consensus.runtime.cluster_config import parse_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.runtime.transport import Handshake
from consensus.statemachine import KVStore, kv_get, kv_put
from tests.runtime.kv_state import applied_alike, requests_state


def cluster(
    tmp_path: Path, *, fault_injection: bool = False
) -> tuple[list[ReplicaNode], list[tuple[str, int]]]:
    base = free_base_port()
    raw = {
        "cluster_id": "fuzz",
        "data_dir": str(tmp_path),
        "replica": [
            {
                "id": i,
                "address": f"127.0.0.1:{base + i}",
                "client_address": f"127.0.0.1:{base + 100 + i}",
                "site": site,
            }
            for i, site in enumerate(["CA", "OR", "OH"])
        ],
    }
    config = parse_cluster_config(raw, base=tmp_path, source="test")
    nodes = [ReplicaNode(config, i, KVStore(), fsync=False, fault_injection=fault_injection)
             for i in range(3)]
    return nodes, [spec.client_address for spec in config.replicas]


def garbage(rng: random.Random, valid: bytes) -> bytes:
    choice = rng.randrange(4)
    if choice == 0:
        return rng.randbytes(rng.randrange(1, 300))
    data = bytearray(valid)
    for _ in range(rng.randrange(1, 6)):
        position = rng.randrange(len(data))
        if choice == 1:
            data[position] ^= 1 << rng.randrange(8)
        elif choice == 2:
            del data[position]
        else:
            data.insert(position, rng.randrange(256))
    return bytes(data)


async def blast(address: tuple[str, int], chunks: list[bytes]) -> None:
    try:
        _, writer = await asyncio.open_connection(*address)
    except OSError:
        return
    try:
        for chunk in chunks:
            writer.write(chunk)
        await writer.drain()
        await asyncio.sleep(0.01)
    except (OSError, ConnectionError):
        pass
    finally:
        writer.close()


async def scenario(tmp_path: Path) -> None:
    nodes, clients = cluster(tmp_path)
    for node in nodes:
        await node.start()
    try:
        client = Client(7, clients, timeout_s=2.0)
        for i in range(20):
            await client.execute(kv_put(f"k{i % 5}", str(i)), [f"k{i % 5}"], blind=True)
        await client.read(kv_get("k0"), ["k0"])
        before = await applied_alike(nodes)  # everyone has executed what came before
        target = nodes[1]
        peer_address = target.config.replica(1).address
        rng = random.Random(2024)
        hello = Handshake("fuzz", 0, FORMAT_VERSION).encode()
        valid_frame = encode_frame([Heartbeat(src=0, view=0, executed=0, lease_request=-1)])
        valid_request = msgpack.packb([1, "cmd", 5, 0, kv_put("x", "y"), ["x"], True])
        for _ in range(60):
            # no handshake / a mangled handshake / a valid one followed by mangled frames
            await blast(peer_address, [garbage(rng, hello)])
            await blast(
                peer_address,
                [hello] + [frame_to_wire(garbage(rng, valid_frame)) for _ in range(5)],
            )
            await blast(peer_address, [hello, rng.randbytes(64)])
            await blast(
                target.config.replica(1).client_address,
                [frame_to_wire(garbage(rng, valid_request)) for _ in range(3)]
                + [rng.randbytes(40)],
            )
        await asyncio.sleep(0.3)
        assert all(node.serving for node in nodes)
        assert [requests_state(node.state_machine) for node in nodes] == before
        assert target.stats.bad_frames + target.transport.stats.bad_connections > 0
        # still serving
        reply = await client.execute(kv_put("after", "fuzz"), ["after"])
        assert reply.status == "ok"
        await client.close()
    finally:
        for node in nodes:
            await node.stop()


def test_fuzzed_ports_leave_replica_up_and_unchanged(tmp_path: Path) -> None:
    asyncio.run(asyncio.wait_for(scenario(tmp_path), 60))


def test_oversized_length_header_closes_only_that_connection(tmp_path: Path) -> None:
    async def run() -> None:
        nodes, clients = cluster(tmp_path)
        for node in nodes:
            await node.start()
        try:
            address = nodes[0].config.replica(0).client_address
            reader, writer = await asyncio.open_connection(*address)
            writer.write((1 << 31).to_bytes(4, "big") + b"x" * 10)
            assert await asyncio.wait_for(reader.read(100), 5) == b""  # closed by the replica
            writer.close()
            client = Client(9, clients, timeout_s=2.0)
            assert (await client.execute(kv_put("a", "b"), ["a"])).status == "ok"
            await client.close()
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 30))


def test_partition_requests_are_refused_without_fault_injection(tmp_path: Path) -> None:
    async def run() -> None:
        nodes, clients = cluster(tmp_path)
        for node in nodes:
            await node.start()
        try:
            with pytest.raises(DefiniteFailure, match="fault injection is disabled"):
                await cut_off(clients[0], [1, 2])
            assert nodes[0].transport.drop_from == nodes[0].transport.drop_to == frozenset()
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 30))


def test_a_partition_request_cuts_one_way_or_both_and_a_bad_one_changes_nothing(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        nodes, clients = cluster(tmp_path, fault_injection=True)
        node = nodes[1]

        async def ask(op: bytes) -> str:
            """A partition request through replica 1's client port: its answer's status."""
            reader, writer = await asyncio.open_connection(*clients[1])
            try:
                command = Command(client_id=0, seq=0, op=op, keys=())
                writer.write(frame_to_wire(ClientRequest(4, "partition", command).encode()))
                frames = FrameReader()
                while True:
                    data = await reader.read(1 << 16)
                    assert data, "the replica closed the connection"
                    payloads = frames.feed(data)
                    if payloads:
                        return decode_response(payloads[0]).status
            finally:
                writer.close()

        await node.start()
        try:
            assert await ask(encode_partition(drop_from=[0], drop_to=[])) == "ok"  # 1 hears not 0
            assert (node.transport.drop_from, node.transport.drop_to) == ({0}, set())
            assert await ask(msgpack.packb([0, 1, 2])) == "ok"  # both ways; never itself
            assert node.transport.drop_from == node.transport.drop_to == {0, 2}
            assert await ask(msgpack.packb({"from": [0], "to": [7]})) == "error"
            assert node.transport.drop_from == node.transport.drop_to == {0, 2}
            assert await ask(msgpack.packb([])) == "ok"
            assert node.transport.drop_from == node.transport.drop_to == frozenset()
        finally:
            for each in nodes:
                await each.stop()

    asyncio.run(asyncio.wait_for(run(), 30))
