"""How a replica's loop takes client requests into its turns (``MAX_READS_PER_TURN``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack

from consensus.messages import CAccept, CAck, Command, OAccept, OAck
from consensus.protocol.ready import Ready
from consensus.runtime.cli import cluster_toml
from consensus.runtime.client import Client
from consensus.runtime.cluster_config import ClusterConfig, load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.runtime.node_events import MAX_READS_PER_TURN, Inbox, Propose, Read, StaleRead
from consensus.statemachine import KVStore, kv_get, kv_put


def _config(tmp_path: Path) -> ClusterConfig:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    return load_cluster_config(path)


def test_a_turn_takes_every_write_but_a_bounded_number_of_reads() -> None:
    inbox = Inbox()
    kinds = ([Read] * (MAX_READS_PER_TURN + 5) + [Propose] * 3) * 2 + [Propose] * 7
    queued = [kind(Command(client_id=1, seq=i, op=b"")) for i, kind in enumerate(kinds)]
    for request in queued:
        inbox.queue_request(request)
    turns = []
    while not inbox.idle:
        turns.append(inbox.take())
    assert [request for turn in turns for request in turn] == queued  # order kept
    for turn in turns:
        assert sum(type(request) is not Propose for request in turn) <= MAX_READS_PER_TURN
    # the writes behind a held-back read wait with it; the rest all go in one turn
    assert len(turns) == 3
    assert [type(request) for request in turns[-1]] == [Read] * 10 + [Propose] * 10


def test_posted_events_go_first_and_count_no_reads() -> None:
    inbox = Inbox()
    reads = [Read(Command(client_id=1, seq=i, op=b"")) for i in range(MAX_READS_PER_TURN + 1)]
    for request in reads:
        inbox.queue_request(request)
    stale = StaleRead(Command(client_id=2, seq=0, op=b""))
    inbox.post(stale)
    assert inbox.wakeup.is_set()  # a post wakes the loop; a queued request waits for wake()
    assert inbox.take() == [stale, *reads[:MAX_READS_PER_TURN]]
    assert inbox.take() == reads[MAX_READS_PER_TURN:]
    assert inbox.idle


def test_reads_over_many_turns_see_the_writes_acknowledged_before_them(tmp_path: Path) -> None:
    config = _config(tmp_path)
    count = 3 * MAX_READS_PER_TURN

    async def run() -> list[object]:
        nodes = [ReplicaNode(config, i, KVStore(), fsync=False) for i in range(3)]
        for node in nodes:
            await node.start()
        # a client of replica 1, which is not the sequencer: its reads go through RRequests
        client = Client(7, [spec.client_address for spec in config.replicas], home=1,
                        timeout_s=10.0)
        try:
            await asyncio.gather(*[client.execute(kv_put(f"k{i}", f"v{i}"), [f"k{i}"])
                                   for i in range(count)])
            replies = await asyncio.gather(*[client.read(kv_get(f"k{i}"), [f"k{i}"])
                                             for i in range(count)])
            assert max(node.stats.turns for node in nodes) > 0
            return [msgpack.unpackb(reply.payload) for reply in replies]
        finally:
            await client.close()
            for node in nodes:
                await node.stop()

    values = asyncio.run(asyncio.wait_for(run(), 60))
    assert values == [["value", f"v{i}"] for i in range(count)]


def test_blind_writes_in_flight_together_are_each_answered_ready_and_timed(
        tmp_path: Path) -> None:
    # many writes proposed in one turn become ready together: each client request gets its
    # own READY answer (its req_id, no payload, no position) and the ready histogram counts
    # every write, however many shared a proposal time
    config = _config(tmp_path)
    count = 300

    async def run() -> None:
        nodes = [ReplicaNode(config, i, KVStore(), fsync=False) for i in range(3)]
        for node in nodes:
            await node.start()
        home = nodes[0]
        client = Client(7, [spec.client_address for spec in config.replicas], home=0,
                        timeout_s=10.0)
        try:
            before = home.stats.ready_latency.count
            replies = await asyncio.gather(*[
                client.execute(kv_put(f"k{i}", f"v{i}"), [f"k{i}"], blind=True, seq=i + 1)
                for i in range(count)])
            assert [(r.status, r.payload, r.position) for r in replies] == [
                ("ok", b"", -1)] * count
            assert len({r.req_id for r in replies}) == count
            assert home.stats.ready_latency.count - before == count
            assert home.clients.limits._connections  # the client's connection ...
            assert all(t.outstanding == 0 for t in home.clients.limits._connections)  # idle
            reply = await client.read(kv_get(f"k{count - 1}"), [f"k{count - 1}"])
            assert msgpack.unpackb(reply.payload) == ["value", f"v{count - 1}"]
        finally:
            await client.close()
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_an_accept_reserved_ahead_is_written_before_the_leaders_fsync(tmp_path: Path) -> None:
    """The peer links' writers run on the loop: a turn's early messages (a CAccept below a
    durable index reservation, a sequencer's OAccept) must be handed to the sockets at once
    (``PeerTransport.send(at_once=True)``) before the turn's fsync holds the loop, or they
    leave after it anyway."""
    config = _config(tmp_path)

    async def run() -> list[tuple[int, int]]:
        nodes = [ReplicaNode(config, i, KVStore(), fsync=False) for i in range(3)]
        leader = nodes[0]  # the sequencer of view 0: both its Accepts may leave early
        transport, wal = leader.transport, leader.wal
        sent_early = 0
        at_sync: list[tuple[int, int]] = []  # (early messages so far, frames still queued)
        carry_out = leader.turns._carry_out

        async def counting_carry_out(ready: Ready, now: int) -> None:
            nonlocal sent_early
            sent_early += sum(isinstance(o.message, CAccept | OAccept) for o in ready.send)
            await carry_out(ready, now)

        sync = wal.sync

        def watching_sync(*, fsync: bool = True) -> None:
            queued = sum(len(link.queue) for link in transport._links.values())
            at_sync.append((sent_early, queued))
            sync(fsync=fsync)

        leader.turns._carry_out = counting_carry_out  # type: ignore[method-assign]
        wal.sync = watching_sync  # type: ignore[method-assign]
        for node in nodes:
            await node.start()
        client = Client(7, [spec.client_address for spec in config.replicas], home=0,
                        timeout_s=10.0)
        try:
            for i in range(20):  # one write at a time
                await client.execute(kv_put(f"k{i}", f"v{i}"), [f"k{i}"], blind=True)
            return at_sync
        finally:
            await client.close()
            for node in nodes:
                await node.stop()

    at_sync = asyncio.run(asyncio.wait_for(run(), 60))
    assert at_sync[-1][0] >= 2 * 15  # most writes sent their CAccept and OAccept early
    assert all(queued == 0 for _, queued in at_sync), at_sync


def test_acknowledgements_leave_before_the_turn_applies_its_commands(tmp_path: Path) -> None:
    """What waited for a turn's fsync (a follower's CAck and OAck) is handed to the sockets
    at once too: it does not wait for the commands the turn applies next (a loaded turn
    applies hundreds) nor for the links' writers to run on a later loop turn."""
    config = _config(tmp_path)

    async def run() -> list[tuple[int, int]]:
        nodes = [ReplicaNode(config, i, KVStore(), fsync=False) for i in range(3)]
        seen: list[tuple[int, int]] = []  # per follower turn that acks and applies: (acks, queued)

        def watch(follower: ReplicaNode) -> None:
            turns, transport = follower.turns, follower.transport
            carry_out, apply = turns._carry_out, turns._apply
            acks = 0

            async def counting_carry_out(ready: Ready, now: int) -> None:
                nonlocal acks
                acks = sum(isinstance(o.message, CAck | OAck) for o in ready.send_after_persist)
                await carry_out(ready, now)
                acks = 0

            async def watching_apply(batches: Any, now: int) -> None:
                if acks:
                    queued = sum(len(link.queue) for link in transport._links.values())
                    seen.append((acks, queued))
                await apply(batches, now)

            turns._carry_out = counting_carry_out  # type: ignore[method-assign]
            turns._apply = watching_apply  # type: ignore[method-assign]

        for follower in nodes[1:]:
            watch(follower)
        for node in nodes:
            await node.start()
        addresses = [spec.client_address for spec in config.replicas]
        clients = [Client(7 + k, addresses, home=0, timeout_s=10.0) for k in range(8)]
        try:
            for round_ in range(30):  # eight writes in flight: turns that ack and apply
                await asyncio.gather(*(
                    client.execute(kv_put(f"k{k}", f"v{round_}"), [f"k{k}"], blind=True)
                    for k, client in enumerate(clients)))
            return seen
        finally:
            for client in clients:
                await client.close()
            for node in nodes:
                await node.stop()

    seen = asyncio.run(asyncio.wait_for(run(), 60))
    assert len(seen) >= 10, seen  # followers' turns that acknowledged and then applied
    assert all(queued == 0 for _, queued in seen), seen
