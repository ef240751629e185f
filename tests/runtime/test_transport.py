"""The peer transport's WAN emulation: frames carry the sender's send time and wait at the
receiver until ``stamp + delay`` (never early, in order, per connection); bad stamps from a
misbehaving peer neither hang nor crash the receiver; the handshake says whether frames are
stamped and a mismatch is refused; without delays the wire is what it always was."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import msgpack

from consensus.codec import FORMAT_VERSION, frame_to_wire
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.transport import Handshake, PeerTransport

CLUSTER = "t"


def _now_us() -> int:
    return time.monotonic_ns() // 1000


def stamped(payload: bytes, stamp: int) -> bytes:
    """A stamped frame as a sender writes it."""
    return frame_to_wire(struct.pack(">Q", stamp) + payload)


class Inbox:
    """``on_frame`` for a test: (peer, payload, arrival µs) of every frame, and a way to wait
    for a number of them."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, bytes, int]] = []
        self._changed = asyncio.Event()

    def __call__(self, peer: int, payload: bytes) -> None:
        self.frames.append((peer, payload, _now_us()))
        self._changed.set()

    @property
    def payloads(self) -> list[bytes]:
        return [payload for _, payload, _ in self.frames]

    def arrival(self, payload: bytes) -> int:
        return next(at for _, p, at in self.frames if p == payload)

    async def wait_for(self, count: int, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.frames) < count:
                self._changed.clear()
                await self._changed.wait()


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait (polling the loop) until ``condition()`` holds; fail after ``timeout``."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


@asynccontextmanager
async def transport(
    me: int,
    addresses: dict[int, tuple[str, int]],
    delay_us: int,
    on_frame: Callable[[int, bytes], None],
    **kw: int,
) -> AsyncIterator[PeerTransport]:
    peers = {peer: delay_us for peer in addresses if peer != me}
    node = PeerTransport(
        cluster_id=CLUSTER, me=me, addresses=addresses, one_way_us=peers, on_frame=on_frame, **kw
    )
    await node.start()
    try:
        yield node
    finally:
        await node.close()


def two_addresses() -> dict[int, tuple[str, int]]:
    base = free_base_port()
    return {0: ("127.0.0.1", base), 1: ("127.0.0.1", base + 1)}


@asynccontextmanager
async def raw_peer(
    address: tuple[str, int], hello: bytes
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A hand-written connection to a transport's listener, opened with ``hello``."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(hello)
    try:
        yield reader, writer
    finally:
        writer.close()


async def closed_by_peer(reader: asyncio.StreamReader, timeout: float = 5.0) -> bool:
    async with asyncio.timeout(timeout):
        try:
            return await reader.read(100) == b""
        except ConnectionError:
            return True


# ---------------------------------------------------------------------------- delays


async def test_delayed_frames_are_never_early_and_arrive_in_order() -> None:
    addresses = two_addresses()
    delay_us = 12_000
    inbox = Inbox()
    async with (
        transport(1, addresses, delay_us, inbox) as receiver,
        transport(0, addresses, delay_us, Inbox()) as sender,
    ):
        await until(lambda: sender._links[1].connected)
        sent_at: dict[bytes, int] = {}
        count = 60
        for n in range(count):
            payload = n.to_bytes(2, "big") + b"x" * (n * 37 % 500)
            sent_at[payload] = _now_us()
            sender.send(1, payload)
            if n % 4 == 0:  # bursts within a loop turn and gaps across turns
                await asyncio.sleep(0.0005 * (n % 3))
        await inbox.wait_for(count)
        samples = list(receiver.stats.delay_samples)
    assert inbox.payloads == list(sent_at)
    assert all(peer == 0 for peer, _, _ in inbox.frames)
    assert all(at - sent_at[payload] >= delay_us for _, payload, at in inbox.frames)
    # the transport's own accuracy figures: one per frame, measured from the send call
    assert len(samples) == count
    assert all(intended == delay_us and actual >= intended for intended, actual in samples)
    assert not sender.stats.delay_samples  # the sender no longer holds frames back


async def test_both_directions_and_the_link_delay_of_each_peer() -> None:
    base = free_base_port()
    addresses = {i: ("127.0.0.1", base + i) for i in range(3)}
    delays = {(0, 1): 5_000, (0, 2): 30_000, (1, 2): 15_000}

    def one_way(me: int) -> dict[int, int]:
        return {p: delays[min(me, p), max(me, p)] for p in addresses if p != me}

    inboxes = [Inbox() for _ in addresses]
    nodes = [
        PeerTransport(
            cluster_id=CLUSTER, me=i, addresses=addresses, one_way_us=one_way(i), on_frame=inbox
        )
        for i, inbox in zip(addresses, inboxes, strict=True)
    ]
    for node in nodes:
        await node.start()
    try:
        await until(lambda: all(link.connected for n in nodes for link in n._links.values()))
        sent_at = {}
        for node in nodes:
            for peer in addresses:
                if peer != node.me:
                    payload = bytes([node.me, peer])
                    sent_at[payload] = _now_us()
                    node.send(peer, payload)
        for inbox in inboxes:
            await inbox.wait_for(2)
    finally:
        for node in nodes:
            await node.close()
    for me, inbox in enumerate(inboxes):
        for peer, payload, at in inbox.frames:
            assert payload == bytes([peer, me])
            assert at - sent_at[payload] >= delays[min(me, peer), max(me, peer)]


async def test_a_stamped_peer_that_closes_still_has_its_frames_delivered() -> None:
    addresses = two_addresses()
    inbox = Inbox()
    async with transport(1, addresses, 50_000, inbox):
        hello = Handshake(CLUSTER, 0, FORMAT_VERSION, stamped=True).encode()
        async with raw_peer(addresses[1], hello) as (_, writer):
            start = _now_us()
            writer.write(stamped(b"a", start) + stamped(b"b", start))
            await writer.drain()
        await inbox.wait_for(2)
    assert inbox.payloads == [b"a", b"b"]
    assert inbox.arrival(b"a") >= start + 50_000


# ---------------------------------------------------------------------------- bad stamps


async def test_bad_stamps_neither_hang_nor_crash_the_receiver() -> None:
    """A stamp ahead of the clock counts as "sent on arrival" (so a frame waits at most the
    link's delay); a stamp long past is due at once; a connection's order holds either way."""
    addresses = two_addresses()
    delay_us = 300_000
    inbox = Inbox()
    hello = Handshake(CLUSTER, 0, FORMAT_VERSION, stamped=True).encode()
    async with transport(1, addresses, delay_us, inbox) as receiver:
        # a stamp in the past, alone on its connection: delivered at once
        async with raw_peer(addresses[1], hello) as (_, writer):
            written = _now_us()
            writer.write(stamped(b"past", 0))
            await inbox.wait_for(1)
        assert inbox.arrival(b"past") - written < delay_us // 2
        # stamps far ahead (the largest one too), then one long past, then an honest one
        async with raw_peer(addresses[1], hello) as (_, writer):
            written = _now_us()
            writer.write(
                stamped(b"future", written + 10_000_000)
                + stamped(b"max", 2**64 - 1)
                + stamped(b"old", 1)
                + stamped(b"honest", _now_us())
            )
            await inbox.wait_for(5)
        assert inbox.payloads == [b"past", b"future", b"max", b"old", b"honest"]
        for payload in (b"future", b"max", b"old"):
            # the clamped frames wait their link's delay after arrival, not 10 s or forever;
            # "old" is held behind them: never before an earlier frame of its connection
            assert written + delay_us <= inbox.arrival(payload) < written + 5_000_000
        assert receiver.stats.stamps_clamped == 2
        assert receiver.stats.bad_connections == 0
        # a frame too short to hold a stamp closes its connection and nothing else
        async with raw_peer(addresses[1], hello) as (reader, writer):
            writer.write(frame_to_wire(b"1234567"))
            assert await closed_by_peer(reader)
        assert receiver.stats.bad_connections == 1
        async with raw_peer(addresses[1], hello) as (_, writer):
            writer.write(stamped(b"after", _now_us() - delay_us))
            await inbox.wait_for(6)
    assert inbox.payloads[-1] == b"after"


async def test_held_frames_are_bounded_and_blocked_peers_are_dropped_at_delivery() -> None:
    addresses = two_addresses()
    delay_us = 200_000
    inbox = Inbox()
    hello = Handshake(CLUSTER, 0, FORMAT_VERSION, stamped=True).encode()
    async with transport(1, addresses, delay_us, inbox, max_queue_bytes=1200) as receiver:
        async with raw_peer(addresses[1], hello) as (_, writer):
            now = _now_us()
            # room for three of these (each also costs a per-frame charge), then one small one
            writer.write(b"".join(stamped(bytes([n]) * 300, now) for n in range(10)))
            writer.write(stamped(b"last", now))
            await until(lambda: receiver.stats.frames_received == 11)
            await inbox.wait_for(4)
        # dropped or not, every frame read off the wire counts: prefix, stamp and payload
        assert receiver.stats.bytes_received == 10 * (4 + 8 + 300) + (4 + 8 + 4)
        assert inbox.payloads == [bytes([n]) * 300 for n in range(3)] + [b"last"]
        assert receiver.stats.frames_dropped == 7
        # frames held when the partition starts are lost to it
        async with raw_peer(addresses[1], hello) as (_, writer):
            writer.write(stamped(b"cut", _now_us()))
            await until(lambda: receiver.stats.frames_received == 12)
            receiver.drop_from = frozenset({0})
            await until(lambda: receiver.stats.frames_dropped == 8)
        assert len(inbox.frames) == 4


async def test_a_one_way_cut_drops_one_direction_and_the_other_still_works() -> None:
    """The test-only fault layer: 0 drops what it sends to 1 (1 cannot hear 0, 0 hears 1),
    then what arrives from 1 (0 cannot hear 1, 1 hears 0). A frame sent after a dropped one
    on the same connection proves the first was dropped, not late."""
    addresses = two_addresses()
    inboxes = [Inbox(), Inbox()]
    async with (
        transport(0, addresses, 0, inboxes[0]) as zero,
        transport(1, addresses, 0, inboxes[1]) as one,
    ):
        await until(lambda: zero._links[1].connected and one._links[0].connected)
        zero.drop_to = frozenset({1})
        zero.send(1, b"lost to 1")
        one.send(0, b"heard by 0")
        await inboxes[0].wait_for(1)
        zero.drop_to, zero.drop_from = frozenset(), frozenset({1})
        one.send(0, b"lost at 0")
        zero.send(1, b"heard by 1")
        await inboxes[1].wait_for(1)
        await until(lambda: zero.stats.frames_dropped == 2)  # one at send, one on arrival
        zero.drop_from = frozenset()
        one.send(0, b"healed")
        await inboxes[0].wait_for(2)
    assert inboxes[0].payloads == [b"heard by 0", b"healed"]
    assert inboxes[1].payloads == [b"heard by 1"]
    assert zero.stats.frames_dropped == 2 and one.stats.frames_dropped == 0


async def test_an_on_frame_that_raises_closes_only_that_connection() -> None:
    addresses = two_addresses()
    inbox = Inbox()

    def on_frame(peer: int, payload: bytes) -> None:
        if payload == b"boom":
            raise RuntimeError("a bug in the node")
        inbox(peer, payload)

    hello = Handshake(CLUSTER, 0, FORMAT_VERSION, stamped=True).encode()
    async with transport(1, addresses, 20_000, on_frame) as receiver:
        for stamp in (_now_us(), 0):  # a frame held for its time, and one due at once
            async with raw_peer(addresses[1], hello) as (reader, writer):
                writer.write(stamped(b"boom", stamp))
                assert await closed_by_peer(reader)
        async with raw_peer(addresses[1], hello) as (_, writer):
            writer.write(stamped(b"fine", _now_us()))
            await inbox.wait_for(1)
    assert inbox.payloads == [b"fine"]
    assert receiver.stats.bad_connections == 0


# ---------------------------------------------------------------------------- handshakes


def test_handshake_decodes_old_and_new_forms() -> None:
    three = Handshake.decode(msgpack.packb([CLUSTER, 2, FORMAT_VERSION]))
    assert three == Handshake(CLUSTER, 2, FORMAT_VERSION, stamped=False)
    four = Handshake(CLUSTER, 2, FORMAT_VERSION, stamped=True)
    assert Handshake.decode(four.encode()[4:]) == four
    # not stamped: the three-element form older builds speak and expect
    assert Handshake(CLUSTER, 2, FORMAT_VERSION).encode() == frame_to_wire(
        msgpack.packb([CLUSTER, 2, FORMAT_VERSION])
    )


async def test_a_stamping_mismatch_is_refused_in_both_directions() -> None:
    for receiver_delay, peer_stamps in ((10_000, False), (0, True)):
        addresses = two_addresses()
        inbox = Inbox()
        async with transport(1, addresses, receiver_delay, inbox) as receiver:
            hello = Handshake(CLUSTER, 0, FORMAT_VERSION, stamped=peer_stamps).encode()
            frame = stamped(b"x", _now_us()) if peer_stamps else frame_to_wire(b"x")
            async with raw_peer(addresses[1], hello + frame) as (reader, _):
                assert await closed_by_peer(reader)
            assert receiver.stats.bad_connections == 1
            assert inbox.frames == []


async def test_transports_that_disagree_on_emulation_do_not_talk() -> None:
    addresses = two_addresses()
    inbox = Inbox()
    async with (
        transport(1, addresses, 0, inbox) as receiver,
        transport(0, addresses, 10_000, Inbox()) as sender,
    ):
        # each refuses the other's connection
        await until(lambda: min(receiver.stats.bad_connections, sender.stats.bad_connections) > 0)
        sender.send(1, b"x")
    assert inbox.frames == []


# ---------------------------------------------------------------------------- the wire


async def listen_as(port: int) -> tuple[asyncio.Server, asyncio.Queue[asyncio.StreamReader]]:
    accepted: asyncio.Queue[asyncio.StreamReader] = asyncio.Queue()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(reader)
        await asyncio.Event().wait()  # keep it open until the server closes

    return await asyncio.start_server(on_connect, "127.0.0.1", port), accepted


@asynccontextmanager
async def unstamped_link() -> AsyncIterator[tuple[PeerTransport, asyncio.StreamReader]]:
    """Replica 0's transport without delays, connected to a bare listener as replica 1: the
    reader sees the wire past the handshake."""
    addresses = two_addresses()
    server, accepted = await listen_as(addresses[1][1])
    try:
        async with transport(0, addresses, 0, Inbox()) as sender:
            async with asyncio.timeout(10):
                reader = await accepted.get()
                hello = frame_to_wire(msgpack.packb([CLUSTER, 0, FORMAT_VERSION]))
                assert await reader.readexactly(len(hello)) == hello
                await until(lambda: sender._links[1].connected)
                yield sender, reader
    finally:
        server.close()


async def test_without_delays_the_wire_carries_no_stamp() -> None:
    async with unstamped_link() as (sender, reader):
        sender.send(1, b"hello")
        assert await reader.readexactly(9) == frame_to_wire(b"hello")
    assert not sender.stats.delay_samples
    assert sender.stats.bytes_sent == 9  # what went on the wire, length prefix included


async def test_a_frame_sent_at_once_is_written_before_the_loop_turns_and_keeps_its_order(
) -> None:
    """``at_once`` (a turn's early Accepts before its fsync holds the loop): the frame is
    handed to the connection in the call, not when the link's writer runs; behind a queued
    frame it is queued too, so frames still arrive in the order they were sent."""
    async with unstamped_link() as (sender, reader):
        link = sender._links[1]
        sender.send(1, b"early", at_once=True)
        assert not link.queue and sender.stats.frames_sent == 1  # no loop turn yet
        sender.send(1, b"queued")
        sender.send(1, b"behind", at_once=True)  # not ahead of "queued"
        assert len(link.queue) == 2 and sender.stats.frames_sent == 1
        wire = b"".join(frame_to_wire(p) for p in (b"early", b"queued", b"behind"))
        assert await reader.readexactly(len(wire)) == wire
        assert sender.stats.frames_sent == 3 and sender.stats.bytes_sent == len(wire)


async def test_with_delays_each_frame_carries_its_send_time_and_leaves_at_once() -> None:
    addresses = two_addresses()
    server, accepted = await listen_as(addresses[1][1])
    try:
        async with transport(0, addresses, 10_000_000, Inbox()) as sender:  # a 10 s delay
            async with asyncio.timeout(5):  # ...that the sender does not wait for
                reader = await accepted.get()
                hello = Handshake(CLUSTER, 0, FORMAT_VERSION, stamped=True).encode()
                assert await reader.readexactly(len(hello)) == hello
                await until(lambda: sender._links[1].connected)
                before = _now_us()
                sender.send(1, b"hello")
                after = _now_us()
                length, stamp = struct.unpack(">IQ", await reader.readexactly(12))
                assert length == 8 + 5 and before <= stamp <= after
                assert await reader.readexactly(5) == b"hello"
                assert sender.stats.bytes_sent == 4 + 8 + 5
    finally:
        server.close()


async def test_a_replica_without_delays_of_its_own_stamps_when_its_cluster_emulates_a_wan() -> None:
    # replica 0 sits next to both others; only 1-2 is a WAN link. Every replica must stamp
    # (cluster-wide ``stamped``), or 0's frames are refused by its peers and theirs by it.
    base = free_base_port()
    addresses = {i: ("127.0.0.1", base + i) for i in range(3)}
    delays = {(0, 1): 0, (0, 2): 0, (1, 2): 5_000}
    inboxes = [Inbox() for _ in addresses]
    nodes = [
        PeerTransport(
            cluster_id=CLUSTER, me=i, addresses=addresses, on_frame=inbox, stamped=True,
            one_way_us={p: delays[min(i, p), max(i, p)] for p in addresses if p != i},
        )
        for i, inbox in zip(addresses, inboxes, strict=True)
    ]  # fmt: skip
    for node in nodes:
        await node.start()
    try:
        await until(lambda: all(link.connected for n in nodes for link in n._links.values()))
        for node in nodes:
            for peer in addresses:
                if peer != node.me:
                    node.send(peer, bytes([node.me, peer]))
        for inbox in inboxes:
            await inbox.wait_for(2)
    finally:
        for node in nodes:
            await node.close()
    assert all(node.stats.bad_connections == 0 for node in nodes)
    for me, inbox in enumerate(inboxes):
        assert sorted(inbox.payloads) == sorted(bytes([p, me]) for p in addresses if p != me)
