"""The replica mesh: one outgoing TCP connection to every peer, frames in both directions.

Each replica dials every peer and sends on that connection; it receives on the connections its
peers dial to it. A connection opens with a handshake frame ``[cluster_id, replica_id,
FORMAT_VERSION]``; a listener refuses (and logs why) a peer of another cluster, an unknown id
or another wire version. After that every frame is ``codec.frame_to_wire(payload)``.

WAN emulation: ``send`` stamps each frame with ``now + one_way_delay`` of its link and the
link's writer releases it at that time, woken by a kernel timer (``PreciseTimer``: the loop's
own timers are millisecond-grained); delays are constant per link, so the link stays FIFO.
All frames due at once leave in one write. A link's queue is bounded: beyond ``max_queue_bytes``
new frames to that peer are dropped (the protocol retransmits) and ``congested`` reports it so
the node can stop taking client requests (backpressure).

Bytes from the network never raise out of this module: a bad frame closes its connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack

from consensus.codec import FORMAT_VERSION, FrameReader, frame_to_wire
from consensus.errors import DecodeError
from consensus.runtime.precise_timer import PreciseTimer

__all__ = ["Handshake", "PeerTransport", "TransportStats"]

log = logging.getLogger("sdpaxos.transport")

RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 1.0
HANDSHAKE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Handshake:
    cluster_id: str
    replica_id: int
    version: int

    def encode(self) -> bytes:
        return frame_to_wire(msgpack.packb([self.cluster_id, self.replica_id, self.version]))

    @staticmethod
    def decode(payload: bytes) -> Handshake:
        try:
            fields = msgpack.unpackb(payload, max_str_len=256, max_array_len=3, max_bin_len=0)
        except Exception as exc:
            raise DecodeError(f"handshake is not msgpack: {exc}") from None
        match fields:
            case [str(cluster_id), int(replica_id), int(version)] if not isinstance(
                replica_id, bool
            ):
                return Handshake(cluster_id, replica_id, version)
        raise DecodeError(f"handshake must be [cluster_id, replica_id, version], got {fields!r}")


@dataclass(slots=True)
class TransportStats:
    frames_sent: int = 0
    frames_received: int = 0
    frames_dropped: int = 0
    bad_connections: int = 0
    #: (intended delay, actual delay) in µs of recent emulated frames, for measuring accuracy
    delay_samples: collections.deque[tuple[int, int]] = field(
        default_factory=lambda: collections.deque(maxlen=4096)
    )


class _Link:
    __slots__ = ("bytes_queued", "connected", "delay_us", "queue", "wakeup")

    def __init__(self, delay_us: int) -> None:
        self.delay_us = delay_us
        self.connected = False
        self.queue: collections.deque[tuple[int, int, bytes]] = collections.deque()
        self.bytes_queued = 0
        self.wakeup = asyncio.Event()


class PeerTransport:
    """Frames between this replica and its peers."""

    def __init__(
        self,
        *,
        cluster_id: str,
        me: int,
        addresses: dict[int, tuple[str, int]],
        one_way_us: dict[int, int],
        on_frame: Callable[[int, bytes], None],
        max_frame: int = 16 << 20,
        max_queue_bytes: int = 64 << 20,
    ) -> None:
        self.cluster_id = cluster_id
        self.me = me
        self.addresses = addresses
        self.on_frame = on_frame
        self.max_frame = max_frame
        self.max_queue_bytes = max_queue_bytes
        self.stats = TransportStats()
        self._links = {
            peer: _Link(one_way_us.get(peer, 0)) for peer in sorted(addresses) if peer != me
        }
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._readers: set[asyncio.Task[None]] = set()
        self._closing = False
        self._timer: PreciseTimer | None = None
        #: test-only fault layer: peers cut off in both directions (frames to and from them
        #: are dropped, connections stay up), like a partition that loses packets
        self.blocked: frozenset[int] = frozenset()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        host, port = self.addresses[self.me]
        if any(link.delay_us for link in self._links.values()):
            self._timer = PreciseTimer()
        self._server = await asyncio.start_server(self._accept, host, port)
        for peer in self._links:
            self._tasks.append(asyncio.create_task(self._dial(peer), name=f"dial-{peer}"))

    async def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in [*self._tasks, *self._readers]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._readers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        if self._timer is not None:
            self._timer.close()

    # ------------------------------------------------------------------ sending
    def send(self, peer: int, payload: bytes) -> None:
        """Queue one frame for ``peer``; it leaves after the link's one-way delay."""
        link = self._links.get(peer)
        if link is None:
            return
        if (
            not link.connected
            or peer in self.blocked
            or link.bytes_queued + len(payload) > self.max_queue_bytes
        ):
            # a peer we cannot reach gets nothing queued: by the time it is back it would all
            # be stale, and the protocol retransmits what matters
            self.stats.frames_dropped += 1
            return
        now = _now_us()
        wire = frame_to_wire(payload, max_frame=self.max_frame)
        link.queue.append((now + link.delay_us, now, wire))
        link.bytes_queued += len(payload)
        link.wakeup.set()

    def congested(self) -> bool:
        return any(link.bytes_queued > self.max_queue_bytes // 2 for link in self._links.values())

    async def _dial(self, peer: int) -> None:
        backoff = RECONNECT_MIN_S
        host, port = self.addresses[peer]
        link = self._links[peer]
        while not self._closing:
            try:
                _, writer = await asyncio.open_connection(host, port)
            except OSError:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)
                continue
            backoff = RECONNECT_MIN_S
            link.connected = True
            try:
                writer.write(Handshake(self.cluster_id, self.me, FORMAT_VERSION).encode())
                await self._pump(link, writer)
            except asyncio.CancelledError:
                raise
            except (OSError, ConnectionError, RuntimeError) as exc:
                log.info("connection to replica %d lost (%s); reconnecting", peer, exc)
            except Exception:
                log.exception("sending to replica %d failed; reconnecting", peer)
            finally:
                link.connected = False
                writer.close()
            # What was queued for the dead connection is stale: the protocol retransmits.
            link.queue.clear()
            link.bytes_queued = 0
            await asyncio.sleep(backoff)

    async def _pump(self, link: _Link, writer: asyncio.StreamWriter) -> None:
        while True:
            if not link.queue:
                link.wakeup.clear()
                await link.wakeup.wait()
                continue
            due = link.queue[0][0]
            if due > _now_us():
                assert self._timer is not None  # only delayed links queue frames for later
                await self._timer.sleep_until(due)
            now = _now_us()
            chunks = []
            while link.queue and link.queue[0][0] <= now:
                _, queued_at, wire = link.queue.popleft()
                link.bytes_queued -= len(wire) - 4
                chunks.append(wire)
                if link.delay_us:
                    self.stats.delay_samples.append((link.delay_us, now - queued_at))
            writer.write(b"".join(chunks))
            self.stats.frames_sent += len(chunks)
            await writer.drain()

    # ------------------------------------------------------------------ receiving
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._readers.add(task)
        peername = writer.get_extra_info("peername")
        frames = FrameReader(self.max_frame)
        try:
            peer = await asyncio.wait_for(self._handshake(reader, frames), HANDSHAKE_TIMEOUT_S)
            if peer is None:
                return
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    return
                for payload in frames.feed(data):
                    self.stats.frames_received += 1
                    if peer not in self.blocked:
                        self.on_frame(peer, payload)
        except DecodeError as exc:
            self.stats.bad_connections += 1
            log.warning("closing connection from %s: %s", peername, exc)
        except (TimeoutError, OSError, ConnectionError):
            pass
        except asyncio.CancelledError:
            if not self._closing:
                raise
        finally:
            writer.close()
            self._readers.discard(task)

    async def _handshake(self, reader: asyncio.StreamReader, frames: FrameReader) -> int | None:
        while True:
            data = await reader.read(4096)
            if not data:
                return None
            payloads = frames.feed(data)
            if payloads:
                break
        hello = Handshake.decode(payloads[0])
        problem = None
        if hello.cluster_id != self.cluster_id:
            problem = f"cluster id {hello.cluster_id!r}, expected {self.cluster_id!r}"
        elif hello.version != FORMAT_VERSION:
            problem = f"wire version {hello.version}, this build speaks {FORMAT_VERSION}"
        elif hello.replica_id not in self._links:
            problem = f"unknown replica id {hello.replica_id}"
        if problem is not None:
            self.stats.bad_connections += 1
            log.warning("refusing peer connection: %s", problem)
            return None
        for payload in payloads[1:]:
            self.stats.frames_received += 1
            if hello.replica_id not in self.blocked:
                self.on_frame(hello.replica_id, payload)
        return hello.replica_id


def _now_us() -> int:
    return time.monotonic_ns() // 1000
