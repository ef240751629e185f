"""The replica mesh: one outgoing TCP connection to every peer, frames in both directions.

Each replica dials every peer and sends on that connection; it receives on the connections its
peers dial to it. A connection opens with a handshake frame ``[cluster_id, replica_id,
FORMAT_VERSION, stamped, incarnation, member_token]``: ``stamped`` is true if the dialer stamps
its frames (WAN emulation, below); the last two are the dialer's identity
(``consensus.storage.identity``). Older peers send the first three or four elements: "not
stamped", no identity. A listener refuses (and logs why) a peer of another cluster, an unknown
id, another wire version or a stamping other than its own; and a peer whose identity ``admit``
refuses (a retired incarnation, a wiped data directory), to which it first writes one frame
``["refused", reason]``: the dialer hands the reason to ``on_refused`` (its replica stops). A
listener writes nothing else on a connection. After that every frame is
``codec.frame_to_wire(payload)``, or with stamping ``codec.frame_to_wire(stamp + payload)``:
``stamp`` is 8 bytes, big-endian unsigned, the sender's ``CLOCK_MONOTONIC`` in µs
(``time.monotonic_ns() // 1000``) at its ``send`` call.

WAN emulation: a transport of a cluster with any non-zero one-way delay configured stamps its
frames (``stamped``: the whole cluster shares one delay table, so every replica agrees; without
delays nothing changes on the wire). The sender writes each frame at once; the receiver holds
it until ``stamp + one_way_delay`` of the link from that peer (its own table's entry: the
cluster file's table is symmetric, ``cluster_config`` checks it) and then hands it to
``on_frame``, woken by a kernel timer (``PreciseTimer``: the loop's own timers are
millisecond-grained). So the loopback transit and the receiver's wake-up are spent inside the
emulated delay instead of being added to it. ``CLOCK_MONOTONIC`` is one clock for all processes
of a machine (and of one host's containers), which is the only setting this emulation is for. A
connection's frames reach ``on_frame`` in order (delays are constant per link and stamps grow,
and a frame is never delivered before an earlier one of its connection); a frame whose time has
passed is delivered at once. A stamp ahead of the receiver's clock is impossible on one
machine, so it is taken as "now" (counted in ``stamps_clamped``, logged once per connection): a
frame never waits longer than its link's delay after it arrived. (A frame over a second past
its time is logged once per connection too: it hints at a stalled loop or at peers on different
machines, whose stamps this emulation cannot use.) Negative configured delays count as zero.
``TransportStats.delay_samples`` records (intended, actual) per delivered frame, actual =
delivery time - stamp: the whole hop from the send call.

Bounds: a link's send backlog (frames not yet written plus the socket's write buffer) is at
most ``max_queue_bytes``; beyond it new frames to that peer are dropped. Frames a
connection holds for delivery are bounded by ``max_queue_bytes`` too (payloads plus a small
per-frame charge); beyond it arriving frames are dropped. Both count in
``frames_dropped``; the protocol retransmits. A connection closed for a bad frame (or an
``on_frame`` that raised) drops what it held; one the peer closed still delivers it.
Inbound connections are capped (``conn_limits``): those still in their handshake by
``max_handshakes`` (a newcomer takes the place of the oldest one that sent nothing, else it is
closed at once) and ``handshake_timeout_s`` (the TLS handshake, in a TLS cluster, and the
handshake frame); those whose handshake proved a configured peer by ``max_connections`` (more
are closed at once); a first frame too long to be a handshake closes its connection before it
is buffered. What the network can make happen again and again is logged once per
``logs.LOG_INTERVAL_S`` with the count since (``logs.RateLimited``).

``drop_to`` and ``drop_from`` (test-only): frames to the peers of ``drop_to`` are dropped at
``send``, frames from those of ``drop_from`` on arrival and again at delivery (all counted in
``frames_dropped``). A peer in both is cut off; in one only, the link works one way.

TLS (``consensus.runtime.tls``; a cluster file with ``[tls]``): every connection is mutual
TLS 1.3 before the handshake frame. The listener requires a certificate of the cluster's CA
that names a replica, and the replica id the handshake claims must be the one the certificate
names; the dialer requires the replica it dialed to present that replica's certificate. A peer
that does not speak TLS, or whose certificate is of another CA, names another replica or is
revoked, is refused with a log line saying why. A reload of the revocation list
(``Revocations.reload``) closes the connections of newly revoked certificates.

Bytes from the network never raise out of this module: a bad frame closes its connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack

from consensus.codec import FORMAT_VERSION, FrameReader, frame_to_wire
from consensus.errors import DecodeError, LocalProtocolError
from consensus.runtime.conn_limits import (
    DEFAULT_PEER_HANDSHAKE_TIMEOUT_S,
    DEFAULT_PEER_MAX_HANDSHAKES,
    HandshakeGuard,
    Handshaking,
    PortGuard,
    peer_connection_cap,
)
from consensus.runtime.logs import RateLimited
from consensus.runtime.precise_timer import PreciseTimer
from consensus.runtime.tls import (
    HANDSHAKE_TIMEOUT_S as TLS_HANDSHAKE_TIMEOUT_S,
)
from consensus.runtime.tls import (
    Identity,
    Revocations,
    TlsServer,
    accept_tls,
    checked_identity,
    refusal_reason,
    start_server,
)
from consensus.storage.identity import NO_INCARNATION

__all__ = ["Handshake", "PeerTraffic", "PeerTransport", "TransportStats"]

log = logging.getLogger("sdpaxos.transport")

RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 1.0
#: a first frame this long is no handshake (one is under 300 bytes: its cluster id is at most
#: 256): refused before more of it is buffered
MAX_HANDSHAKE_BYTES = 1 << 10

#: the send-time stamp in front of every payload when WAN emulation is on
_STAMP = struct.Struct(">Q")
#: the length in front of every frame on the wire
_LENGTH_PREFIX = 4
#: a stamped frame's length prefix and stamp
_STAMPED_HEADER = struct.Struct(">IQ")
#: a frame this late (µs after stamp + delay) is worth one warning per connection
_STALE_US = 1_000_000
#: what a held frame costs beyond its payload, for the bound on held bytes (so a peer cannot
#: queue unboundedly many empty frames)
_HELD_OVERHEAD = 64


@dataclass(frozen=True, slots=True)
class Handshake:
    cluster_id: str
    replica_id: int
    version: int
    #: the dialer's frames carry its send time (WAN emulation on)
    stamped: bool = False
    #: the dialer's incarnation and member token (``NO_INCARNATION``: an older build's)
    incarnation: int = NO_INCARNATION
    token: str = ""

    def encode(self) -> bytes:
        fields: list[object] = [self.cluster_id, self.replica_id, self.version]
        if self.stamped or self.incarnation != NO_INCARNATION:
            fields.append(self.stamped)
        if self.incarnation != NO_INCARNATION:
            fields += [self.incarnation, self.token]
        return frame_to_wire(msgpack.packb(fields))

    @staticmethod
    def decode(payload: bytes) -> Handshake:
        try:
            fields = msgpack.unpackb(payload, max_str_len=256, max_array_len=6, max_bin_len=0)
        except Exception as exc:
            raise DecodeError(f"handshake is not msgpack: {exc}") from None
        match fields:
            case [str(cluster_id), int(replica_id), int(version)] if type(replica_id) is int:
                return Handshake(cluster_id, replica_id, version)
            case [str(cluster_id), int(replica_id), int(version), bool(stamped)] if (
                type(replica_id) is int
            ):
                return Handshake(cluster_id, replica_id, version, stamped)
            case [str(cluster_id), int(replica_id), int(version), bool(stamped),
                  int(incarnation), str(token)] if (
                type(replica_id) is int and type(incarnation) is int and incarnation > 0
            ):
                return Handshake(cluster_id, replica_id, version, stamped, incarnation, token)
        raise DecodeError(
            "handshake must be [cluster_id, replica_id, version(, stamped(, incarnation, "
            f"token))], got {fields!r}"
        )


#: what a listener writes before closing a connection whose dialer's identity it refuses
REFUSED = "refused"
#: a refusal frame is at most this long (a reason is one line)
MAX_REFUSAL_BYTES = 1 << 10


def encode_refusal(reason: str) -> bytes:
    return frame_to_wire(msgpack.packb([REFUSED, reason]))


def decode_refusal(payload: bytes) -> str | None:
    """The reason in a refusal frame, or None for anything else (bytes from the network)."""
    try:
        fields = msgpack.unpackb(payload, max_str_len=MAX_REFUSAL_BYTES, max_array_len=2,
                                 max_bin_len=0)
    except Exception:
        return None
    match fields:
        case [str(kind), str(reason)] if kind == REFUSED:
            return reason
    return None


@dataclass(slots=True)
class PeerTraffic:
    """What went to and came from one peer (the ``peer`` label of ``/metrics``)."""

    frames_sent: int = 0
    frames_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    frames_dropped: int = 0


@dataclass(slots=True)
class TransportStats:
    frames_sent: int = 0
    frames_received: int = 0
    #: frame bytes written to and read from peers (length prefixes and stamps included)
    bytes_sent: int = 0
    bytes_received: int = 0
    frames_dropped: int = 0
    bad_connections: int = 0
    #: stamped frames whose stamp was ahead of this clock (taken as "now")
    stamps_clamped: int = 0
    #: (intended delay, actual delay) in µs of recently delivered emulated frames, actual
    #: from the sender's send call to the call of ``on_frame``, for measuring accuracy
    delay_samples: collections.deque[tuple[int, int]] = field(
        default_factory=lambda: collections.deque(maxlen=4096)
    )
    #: the same counts per peer (the totals above are their sums)
    peers: dict[int, PeerTraffic] = field(default_factory=dict)

    def peer(self, peer: int) -> PeerTraffic:
        """``peer``'s counts (created at its first frame)."""
        traffic = self.peers.get(peer)
        if traffic is None:
            traffic = self.peers[peer] = PeerTraffic()
        return traffic


class _Link:
    """The outgoing connection to one peer."""

    __slots__ = (
        "bytes_queued", "connected", "delay_us", "queue", "serial", "tls_problem", "wakeup",
        "writer",
    )  # fmt: skip

    def __init__(self, delay_us: int) -> None:
        self.delay_us = max(0, delay_us)
        #: TLS: the serial of the certificate the peer presented, and the last reason a TLS
        #: dial failed (logged when it changes, not at every retry)
        self.serial = -1
        self.tls_problem = ""
        self.connected = False
        self.writer: asyncio.StreamWriter | None = None
        self.queue: collections.deque[bytes] = collections.deque()
        self.bytes_queued = 0
        self.wakeup = asyncio.Event()


class _Inbound:
    """One incoming connection: its peer and, if stamped, the frames waiting for their time."""

    __slots__ = (
        "bytes_held", "delay_us", "eof", "failed", "last_due", "peer", "pending", "wakeup",
        "warned",
    )  # fmt: skip

    def __init__(self, peer: int, delay_us: int) -> None:
        self.peer = peer
        self.delay_us = delay_us
        #: (due µs, stamp µs or -1 if it was clamped, payload)
        self.pending: collections.deque[tuple[int, int, bytes]] = collections.deque()
        self.bytes_held = 0
        self.last_due = 0
        #: the peer closed: deliver what is held, then stop
        self.eof = False
        #: handing a frame to on_frame failed: the connection is closing, drop the rest
        self.failed = False
        self.warned = False
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
        stamped: bool | None = None,
        max_connections: int | None = None,
        tls_server: ssl.SSLContext | None = None,
        tls_dialer: ssl.SSLContext | None = None,
        revocations: Revocations | None = None,
        identity: tuple[int, str] | None = None,
        admit: Callable[[int, int, str], str | None] | None = None,
        on_refused: Callable[[int, str], None] | None = None,
        max_handshakes: int = DEFAULT_PEER_MAX_HANDSHAKES,
        handshake_timeout_s: float = DEFAULT_PEER_HANDSHAKE_TIMEOUT_S,
    ) -> None:
        """``stamped``: whether this cluster emulates WAN delays (every replica must agree;
        default: whether any of this replica's links has a delay). A replica whose own links
        all have none still stamps when its peers' links have delays. ``max_connections``:
        inbound connections of configured peers at most (default
        ``conn_limits.peer_connection_cap``); more are closed at once.
        ``tls_server``/``tls_dialer``: mutual TLS on every connection (both or neither),
        certificates checked against ``revocations``. ``identity``: this replica's
        (incarnation, member token), sent in its handshakes; ``admit(peer, incarnation,
        token)``: None to take a dialer's frames, else the reason it is refused (sent back to
        it); ``on_refused(peer, reason)``: a peer refused this replica's identity.
        ``max_handshakes``, ``handshake_timeout_s``: inbound connections that have not proved
        a configured peer yet, at most, and how long one has (``conn_limits.HandshakeGuard``);
        they do not count against ``max_connections``."""
        if (tls_server is None) != (tls_dialer is None):
            raise ValueError("TLS needs both a server and a dialer context")
        self.cluster_id = cluster_id
        self.identity = identity
        self.admit = admit
        self.on_refused = on_refused
        self._tls_server = tls_server
        self._tls_dialer = tls_dialer
        self.revocations = revocations if revocations is not None else Revocations(frozenset())
        self.revocations.subscribe(self._revoked)
        #: TLS inbound connections: writer -> the serial of the peer's certificate
        self._inbound_serials: dict[asyncio.StreamWriter, int] = {}
        self.me = me
        self.addresses = addresses
        self.on_frame = on_frame
        self.max_frame = max_frame
        self.max_queue_bytes = max_queue_bytes
        self.stats = TransportStats()
        #: inbound connections that proved a configured peer: their count and cap
        self.inbound_limits = PortGuard(
            "peer",
            peer_connection_cap(len(addresses)) if max_connections is None else max_connections,
        )
        #: inbound connections in their handshake, and how long one may take
        self.handshakes = HandshakeGuard("peer", max_handshakes)
        self.handshake_timeout_s = handshake_timeout_s
        self._log = RateLimited(log)
        self._links = {
            peer: _Link(one_way_us.get(peer, 0)) for peer in sorted(addresses) if peer != me
        }
        #: WAN emulation on: frames carry their send time and wait at the receiver
        self._stamped = (
            any(link.delay_us for link in self._links.values()) if stamped is None else stamped
        )
        self._server: asyncio.Server | TlsServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: the task dialing each peer, and the peers that left the membership: their link
        #: goes once its connection is down (``remove_peer``)
        self._dialers: dict[int, asyncio.Task[None]] = {}
        self._departed: set[int] = set()
        self._readers: set[asyncio.Task[None]] = set()
        self._closing = False
        self._timer: PreciseTimer | None = None
        #: test-only fault layer: peers whose frames are dropped on arrival, and peers the
        #: frames to which are dropped at send (connections stay up), like a partition that
        #: loses packets (in both directions if a peer is in both)
        self.drop_from: frozenset[int] = frozenset()
        self.drop_to: frozenset[int] = frozenset()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        host, port = self.addresses[self.me]
        if self._stamped:
            self._timer = PreciseTimer()
        self._server = await start_server(self._accept, host, port, tls=self._tls_server,
                                          name="peer", on_refused=self._refused,
                                          handshake_timeout_s=self.handshake_timeout_s)
        for peer in self._links:
            self._start_dialing(peer)

    def _start_dialing(self, peer: int) -> None:
        task = asyncio.create_task(self._dial(peer), name=f"dial-{peer}")
        self._tasks.append(task)
        self._dialers[peer] = task

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

    def add_peer(self, peer: int, address: tuple[str, int], delay_us: int = 0) -> None:
        """A member joined, or runs at another address now (membership): connect to it
        there (a connection up to the old address stays until it drops), and take its
        connections."""
        if peer == self.me or peer in self._departed:
            return
        self.addresses[peer] = address
        if peer in self._links:
            return
        self._links[peer] = _Link(delay_us)
        if self._server is not None and not self._closing:
            self._start_dialing(peer)

    def remove_peer(self, peer: int) -> None:
        """A member left (membership): forget it once its connection is down (until then
        it may still learn from us that it was removed); its connections are refused then."""
        link = self._links.get(peer)
        if peer == self.me or link is None:
            return
        self._departed.add(peer)
        if not link.connected:
            self._forget(peer)

    def _forget(self, peer: int) -> None:
        self._links.pop(peer, None)
        self.addresses.pop(peer, None)
        dialer = self._dialers.pop(peer, None)
        if dialer is not None and dialer is not asyncio.current_task():
            dialer.cancel()

    # ------------------------------------------------------------------ sending
    def send(self, peer: int, payload: bytes, *, at_once: bool = False) -> None:
        """Queue one frame for ``peer``; it is written on this loop turn's end. With WAN
        emulation it carries the time of this call and the receiver holds it for the delay.

        ``at_once``: hand it to the connection now when nothing is queued before it (the
        order stays the queue's), rather than when the link's writer next runs: the turn
        loop's frames, which must travel while the turn goes on to hold the loop (its fsync,
        the commands it applies)."""
        link = self._links.get(peer)
        if link is None:
            return
        if (
            not link.connected
            or peer in self.drop_to
            or _backlog(link) + len(payload) > self.max_queue_bytes
        ):
            # a peer we cannot reach gets nothing queued: by the time it is back it would all
            # be stale, and the protocol retransmits what matters
            self.stats.frames_dropped += 1
            self.stats.peer(peer).frames_dropped += 1
            return
        if self._stamped:
            if len(payload) > self.max_frame:
                raise LocalProtocolError(f"frame of {len(payload)} bytes is over {self.max_frame}")
            wire = _STAMPED_HEADER.pack(len(payload) + _STAMP.size, _now_us()) + payload
        else:
            wire = frame_to_wire(payload, max_frame=self.max_frame)
        writer = link.writer
        if at_once and not link.queue and writer is not None and not writer.is_closing():
            # what the link's writer would do with it, without a loop turn to wake it: the
            # writer waits for the buffer to drain before it writes again (``_pump``)
            writer.write(wire)
            self._count_sent(self.stats.peer(peer), len(wire), 1)
            return
        link.queue.append(wire)
        link.bytes_queued += len(wire)
        link.wakeup.set()

    async def _dial(self, peer: int) -> None:
        backoff = RECONNECT_MIN_S
        link = self._links[peer]
        incarnation, token = self.identity or (NO_INCARNATION, "")
        hello = Handshake(self.cluster_id, self.me, FORMAT_VERSION, self._stamped, incarnation,
                          token).encode()
        while not self._closing:
            if peer in self._departed:
                self._forget(peer)
                return
            host, port = self.addresses[peer]  # (it may have moved: ``add_peer``)
            try:
                if self._tls_dialer is None:
                    reader, writer = await asyncio.open_connection(host, port)
                else:
                    reader, writer = await asyncio.open_connection(
                        host, port, ssl=self._tls_dialer, server_hostname=host,
                        ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S,
                    )
                    if not self._dialed_right(peer, link, writer):
                        writer.close()
                        raise ConnectionRefusedError
            except (OSError, TimeoutError) as exc:
                if isinstance(exc, ssl.SSLError | TimeoutError):
                    self._tls_dial_failed(peer, link, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)
                continue
            link.tls_problem = ""
            backoff = RECONNECT_MIN_S
            link.connected = True
            link.writer = writer
            refusal = asyncio.create_task(self._watch_refusal(peer, reader),
                                          name=f"refusal-{peer}")
            try:
                writer.write(hello)
                await self._pump(link, writer, self.stats.peer(peer))
            except asyncio.CancelledError:
                raise
            except (OSError, ConnectionError, RuntimeError) as exc:
                log.info("connection to replica %d lost (%s); reconnecting", peer, exc)
            except Exception:
                log.exception("sending to replica %d failed; reconnecting", peer)
            finally:
                refusal.cancel()
                link.connected = False
                link.writer = None
                writer.close()
            # What was queued for the dead connection is stale: the protocol retransmits.
            link.queue.clear()
            link.bytes_queued = 0
            await asyncio.sleep(backoff)

    async def _watch_refusal(self, peer: int, reader: asyncio.StreamReader) -> None:
        """A listener writes on our connection only to refuse us: hand its reason on."""
        frames = FrameReader(MAX_REFUSAL_BYTES)
        with contextlib.suppress(DecodeError, OSError, ConnectionError):
            while (data := await reader.read(MAX_REFUSAL_BYTES)) != b"":
                payloads = frames.feed(data)
                if payloads:
                    reason = decode_refusal(payloads[0])
                    if reason is not None and self.on_refused is not None:
                        log.error("replica %d refuses this replica: %s", peer, reason)
                        self.on_refused(peer, reason)
                    return

    def _dialed_right(self, peer: int, link: _Link, writer: asyncio.StreamWriter) -> bool:
        """TLS: the replica dialed presented its own certificate (logged once if not)."""
        identity = checked_identity(writer, port="outgoing peer", cluster_id=self.cluster_id,
                                    revocations=self.revocations)
        if identity is not None and identity.replica == peer:
            link.serial = identity.serial
            return True
        problem = (
            "its certificate is refused" if identity is None
            else f"it presents the certificate of {identity.describe()}"
        )
        if problem != link.tls_problem:
            link.tls_problem = problem
            log.warning("not connecting to replica %d at %s:%d: %s", peer,
                        *self.addresses[peer], problem)
        return False

    def _tls_dial_failed(self, peer: int, link: _Link, exc: BaseException) -> None:
        problem = refusal_reason(exc)
        if problem != link.tls_problem:
            link.tls_problem = problem
            log.warning("TLS connection to replica %d failed: %s", peer, problem)

    def _refused(self) -> None:
        """A TLS handshake failed (logged by the server)."""
        self.stats.bad_connections += 1

    def _revoked(self, serials: frozenset[int]) -> None:
        """Close the connections of certificates just revoked (they cannot come back)."""
        for writer, serial in list(self._inbound_serials.items()):
            if serial in serials:
                log.warning("closing a peer connection: its certificate (serial %x) was "
                            "revoked", serial)
                writer.transport.abort()
        for peer, link in self._links.items():
            if link.serial in serials and link.writer is not None:
                log.warning("closing the connection to replica %d: its certificate (serial "
                            "%x) was revoked", peer, link.serial)
                link.writer.transport.abort()

    async def _pump(
        self, link: _Link, writer: asyncio.StreamWriter, traffic: PeerTraffic
    ) -> None:
        while True:
            if not link.queue:
                link.wakeup.clear()
                await link.wakeup.wait()
                continue
            chunks = list(link.queue)
            link.queue.clear()
            self._count_sent(traffic, link.bytes_queued, len(chunks))
            link.bytes_queued = 0
            writer.write(b"".join(chunks))
            await writer.drain()

    def _count_sent(self, traffic: PeerTraffic, nbytes: int, frames: int) -> None:
        """What was handed to a peer's connection, in the transport's and the peer's counts."""
        self.stats.bytes_sent += nbytes
        self.stats.frames_sent += frames
        traffic.bytes_sent += nbytes
        traffic.frames_sent += frames

    # ------------------------------------------------------------------ receiving
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        # room made for a newcomer closes this one: its read ends (``HandshakeGuard``)
        entry = self.handshakes.admit(writer.transport.abort)
        if entry is None:
            writer.transport.abort()  # every place taken by a talking one: counted, logged
            return
        self._readers.add(task)
        peername = writer.get_extra_info("peername")
        extra = _STAMP.size if self._stamped else 0
        frames = FrameReader(min(self.max_frame + extra, 0xFFFFFFFF))
        deliverer: asyncio.Task[None] | None = None
        admitted = False
        deadline = asyncio.timeout(self.handshake_timeout_s)
        try:
            identity: Identity | None = None
            async with deadline:
                if self._tls_server is not None:
                    self.handshakes.talked(entry)  # (its TLS handshake is done)
                    identity = await accept_tls(
                        writer, self._tls_server, port="peer", cluster_id=self.cluster_id,
                        revocations=self.revocations,
                    )
                    if identity is None:
                        self.stats.bad_connections += 1
                        return
                    self._inbound_serials[writer] = identity.serial
                hello = await self._handshake(reader, writer, frames, identity, entry)
            if hello is None:
                return
            self.handshakes.finished(entry)
            peer, early = hello
            admitted = self.inbound_limits.admit()  # a configured peer: now it counts
            if not admitted:
                return  # over the cap: counted and logged by the guard
            inbound = _Inbound(peer, self._links[peer].delay_us)
            if self._stamped:
                deliverer = asyncio.create_task(
                    self._deliver_held(inbound, writer), name=f"deliver-{peer}"
                )
                self._readers.add(deliverer)
                deliverer.add_done_callback(self._readers.discard)
            self._received(inbound, early)
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                self._received(inbound, frames.feed(data))
            if deliverer is not None:
                # the peer closed: what it sent is on the emulated wire and still arrives
                inbound.eof = True
                inbound.wakeup.set()
                await deliverer
        except DecodeError as exc:
            self.stats.bad_connections += 1
            self._log.warning("bad bytes", "closing peer connection from %s: %s", peername, exc)
        except TimeoutError:
            if deadline.expired():
                self.handshakes.finished(entry, timed_out=True)
                self._log.warning("timed out", "closing peer connection from %s: no handshake "
                                  "within %g s", peername, self.handshake_timeout_s)
        except (OSError, ConnectionError):
            pass
        except asyncio.CancelledError:
            if not self._closing:
                raise
        except Exception:
            log.exception("handling a frame from %s failed; closing its connection", peername)
        finally:
            writer.close()
            self._inbound_serials.pop(writer, None)
            if deliverer is not None:
                deliverer.cancel()
            self._readers.discard(task)
            self.handshakes.finished(entry)
            if admitted:
                self.inbound_limits.release()

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frames: FrameReader,
        identity: Identity | None, entry: Handshaking,
    ) -> tuple[int, list[bytes]] | None:
        """The peer's id and the frames that came with its handshake, or None if refused.
        ``identity``: what the peer's TLS certificate names (None: plaintext cluster)."""
        while True:
            data = await reader.read(4096)
            if not data:
                return None
            self.handshakes.talked(entry)
            payloads = frames.feed(data)
            if payloads:
                break
            if frames.buffered > MAX_HANDSHAKE_BYTES:
                raise DecodeError(f"a first frame of over {MAX_HANDSHAKE_BYTES} bytes is no "
                                  "handshake")
        hello = Handshake.decode(payloads[0])
        problem, kind = None, ""  # (the kind keys its rate-limited log line)
        if hello.cluster_id != self.cluster_id:
            kind = "cluster"
            problem = f"cluster id {hello.cluster_id!r}, expected {self.cluster_id!r}"
        elif hello.version != FORMAT_VERSION:
            kind = "version"
            problem = f"wire version {hello.version}, this build speaks {FORMAT_VERSION}"
        elif hello.replica_id not in self._links:
            kind = "unknown"
            problem = f"unknown replica id {hello.replica_id}"
        elif identity is not None and identity.replica != hello.replica_id:
            kind = "certificate"
            problem = (
                f"its handshake claims replica id {hello.replica_id} but its certificate "
                f"names {identity.describe()}"
            )
        elif hello.stamped and not self._stamped:
            kind = "stamping"
            problem = (
                f"replica {hello.replica_id} stamps its frames (WAN emulation on), this one "
                "does not"
            )
        elif self._stamped and not hello.stamped:
            kind = "stamping"
            problem = (
                f"replica {hello.replica_id} does not stamp its frames (WAN emulation off or "
                "an older build), this one emulates WAN delays"
            )
        elif self.admit is not None and (
            refused := self.admit(hello.replica_id, hello.incarnation, hello.token)
        ) is not None:
            kind = f"identity {hello.replica_id}"  # (ids of the configuration: bounded)
            problem = refused
            writer.write(encode_refusal(refused))  # the peer stops, saying why
            with contextlib.suppress(OSError, ConnectionError):
                await writer.drain()
        if problem is not None:
            self.stats.bad_connections += 1
            self._log.warning(f"refused {kind}", "refusing peer connection: %s", problem)
            return None
        return hello.replica_id, payloads[1:]

    def _received(self, inbound: _Inbound, payloads: list[bytes]) -> None:
        """Frames off the socket: delivered now, or held until their time if stamped."""
        peer = inbound.peer
        traffic = self.stats.peer(peer)
        for payload in payloads:
            self.stats.frames_received += 1
            traffic.frames_received += 1
            self.stats.bytes_received += _LENGTH_PREFIX + len(payload)  # stamp included
            traffic.bytes_received += _LENGTH_PREFIX + len(payload)
            if inbound.failed:
                continue
            if peer in self.drop_from:
                self.stats.frames_dropped += 1
                traffic.frames_dropped += 1
                continue
            if not self._stamped:
                self.on_frame(peer, payload)
                continue
            if len(payload) < _STAMP.size:
                raise DecodeError(f"stamped frame of {len(payload)} bytes has no stamp")
            (stamp,) = _STAMP.unpack_from(payload)
            body = payload[_STAMP.size :]
            now = _now_us()
            if stamp > now:
                self.stats.stamps_clamped += 1
                if not inbound.warned:
                    inbound.warned = True
                    log.warning(
                        "replica %d stamps frames %d µs ahead of this clock (WAN emulation needs "
                        "one machine's CLOCK_MONOTONIC); taking them as sent on arrival",
                        peer, stamp - now,
                    )  # fmt: skip
                due = now + inbound.delay_us
                stamp = -1
            else:
                due = stamp + inbound.delay_us
                if now - due > _STALE_US and not inbound.warned:
                    inbound.warned = True
                    log.warning(
                        "a frame from replica %d arrived %d ms after its emulated delay (a "
                        "stalled loop, or another machine's clock: WAN emulation needs one)",
                        peer, (now - due) // 1000,
                    )  # fmt: skip
            # never before an earlier frame of this connection
            due = max(due, inbound.last_due)
            inbound.last_due = due
            if due <= now and not inbound.pending:
                self._deliver(inbound, stamp, body)
            elif inbound.bytes_held + len(body) + _HELD_OVERHEAD > self.max_queue_bytes:
                self.stats.frames_dropped += 1
                traffic.frames_dropped += 1
            else:
                inbound.pending.append((due, stamp, body))
                inbound.bytes_held += len(body) + _HELD_OVERHEAD
                inbound.wakeup.set()

    async def _deliver_held(self, inbound: _Inbound, writer: asyncio.StreamWriter) -> None:
        """Hands a stamped connection's held frames to ``on_frame`` at their time, in order,
        until the connection ended and nothing is left."""
        timer = self._timer
        assert timer is not None  # stamped transports have one
        try:
            while True:
                if not inbound.pending:
                    if inbound.eof:
                        return
                    inbound.wakeup.clear()
                    await inbound.wakeup.wait()
                    continue
                due = inbound.pending[0][0]
                if due > _now_us():
                    await timer.sleep_until(due)
                now = _now_us()
                while inbound.pending and inbound.pending[0][0] <= now:
                    _, stamp, body = inbound.pending.popleft()
                    inbound.bytes_held -= len(body) + _HELD_OVERHEAD
                    self._deliver(inbound, stamp, body)
        except DecodeError as exc:
            self.stats.bad_connections += 1
            self._log.warning(f"bad bytes {inbound.peer}", "closing connection from replica "
                              "%d: %s", inbound.peer, exc)
        except Exception:
            log.exception(
                "handling a frame from replica %d failed; closing its connection", inbound.peer
            )
        inbound.failed = True
        inbound.pending.clear()
        inbound.bytes_held = 0
        writer.close()

    def _deliver(self, inbound: _Inbound, stamp: int, body: bytes) -> None:
        if inbound.peer in self.drop_from:
            self.stats.frames_dropped += 1
            self.stats.peer(inbound.peer).frames_dropped += 1
            return
        if stamp >= 0 and inbound.delay_us:
            self.stats.delay_samples.append((inbound.delay_us, _now_us() - stamp))
        self.on_frame(inbound.peer, body)


def _backlog(link: _Link) -> int:
    """Bytes on their way to ``link``'s peer and not yet handed to the kernel."""
    writer = link.writer
    buffered = writer.transport.get_write_buffer_size() if writer is not None else 0
    return link.bytes_queued + buffered


def _now_us() -> int:
    return time.monotonic_ns() // 1000
