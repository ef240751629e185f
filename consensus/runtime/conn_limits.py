"""Connection hygiene for a replica's listening ports: caps, timeouts, a buffer budget.

Without these a replica kept every connection it accepted, for ever: slow-loris connections
(a frame trickling in a byte at a time) and idle ones stayed open, any number of them were
accepted, and each could hold a partial frame of up to 16 MiB (24 such connections took a
replica from 35 to 228 MB). The policy, in the spirit of ZooKeeper's ``maxClientCnxns`` /
``jute.maxbuffer`` and etcd's ``--max-request-bytes``:

* **Caps on connections per port.** A connection over the cap is closed at once (it is
  refused, counted in ``PortStats.refused``, and logged once per ``logs.LOG_INTERVAL_S`` with
  the count since, never once per connection: a flood must not flood the log too). The peer
  port's cap counts only connections whose handshake proved a configured peer: it defaults to
  ``PEER_CONNECTIONS_PER_REPLICA`` per other replica (its live connection and a dead one not
  noticed yet) plus ``PEER_SPARE_CONNECTIONS`` (members added later).
* **Connections still in their handshake have a cap of their own** (``HandshakeGuard``: the
  peer port's ``peer_max_handshakes``, a TLS port's ``tls.MAX_HANDSHAKES``) and a short
  deadline (``peer_handshake_timeout_s``), so idle or hostile connections never take an
  authenticated peer's room: 40 loops holding silent connections to two replicas' peer ports
  made a restarted third one take 8.1 s to serve instead of 1.7 s, when they counted against
  the peer cap. When that cap is full, a newcomer takes the place of the oldest connection
  that has sent nothing at all for ``SILENT_GRACE_S`` (a peer's dialer writes its handshake
  at once, and a TLS client its hello): silent connections, however many, never keep a peer
  out; only a newcomer finding every place taken by connections that did talk is refused.
* **Idle client connections time out**: no complete request and no answer sent for
  ``client_idle_timeout_s``, and nothing outstanding (a connection waiting on the answer to a
  request is never idle; the client port has no watches). The native client reconnects
  transparently when the replica closed its pooled connection (``consensus.runtime.client``).
* **Slow frames time out**: a partial frame not completed within ``client_frame_timeout_s``
  (slow-loris). This is a deadline for the whole frame, not for progress, so trickling bytes
  does not keep a connection alive.
* **Buffered bytes are bounded** per connection (``client_max_frame_bytes``, the largest frame
  the client port takes: the biggest valid request fits with room to spare; the peer port keeps
  16 MiB frames) and across all client connections (``client_max_buffered_bytes``, a global
  budget of partial-frame bytes). A connection whose partial frame would take the total over
  the budget is closed: a legitimate request completes within one round trip, so only a
  connection that holds its partial frame (or a flood of them) is hit, and the slow-frame
  timeout frees the budget from the ones that hold it. Closing the newcomer, not the oldest,
  keeps the accounting O(1) and a request in progress unharmed by a flood.

Idle and slow deadlines are enforced by one sweep per port (``loop.call_later``, armed while
the port has connections) every ``sweep_interval`` (a quarter of the shorter timeout, between
``MIN_SWEEP_S`` and ``MAX_SWEEP_S``): the read path only records times, so a connection costs
no timer of its own. A connection is closed at most one sweep interval after its deadline.

``ClientPortLimits``, ``PortGuard`` and ``HandshakeGuard`` do no I/O of their own: the port's
server calls ``open`` / ``admit`` on accept, reports what it read and what it answered, and the
policy calls the connection's ``close`` callback when a deadline passes or it makes room. Tests
drive it with a fake clock and ``sweep(now)``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Literal

from consensus.errors import ConfigError
from consensus.messages import MAX_KEY_BYTES, MAX_KEYS_PER_COMMAND, MAX_OP_BYTES
from consensus.runtime.logs import RateLimited

__all__ = [
    "ClientPortLimits",
    "HandshakeGuard",
    "Handshaking",
    "LimitsConfig",
    "PortGuard",
    "PortStats",
    "Tracked",
    "peer_connection_cap",
]

log = logging.getLogger("sdpaxos.conn_limits")

#: the sweep runs this many times per (shortest) timeout ...
SWEEPS_PER_TIMEOUT = 4
#: ... but not more often than this (a short test timeout must not spin the loop) ...
MIN_SWEEP_S = 0.01
#: ... nor less often than this (how late a close may come)
MAX_SWEEP_S = 1.0
#: inbound peer connections per other replica: its live one, and one it gave up on that this
#: side has not seen closed yet
PEER_CONNECTIONS_PER_REPLICA = 2
#: room on the peer port for members added later (``membership``)
PEER_SPARE_CONNECTIONS = 8
#: peer connections in their handshake at once (``HandshakeGuard``), and how long one may
#: take to prove a configured peer: a peer's dialer writes its handshake frame at once (after
#: the TLS handshake, in a TLS cluster), so a second covers a WAN round trip several times
DEFAULT_PEER_MAX_HANDSHAKES = 16
DEFAULT_PEER_HANDSHAKE_TIMEOUT_S = 2.0
#: a connection in its handshake that sent nothing for this long makes room for a newcomer
#: when the handshakes' cap is full (a dialer writes at once: the first bytes follow the TCP
#: handshake's last packet)
SILENT_GRACE_S = 0.1
#: msgpack framing of a request around its op and keys: array header, req_id, kind, client_id,
#: seq, bin/str headers, blind (a generous bound)
_REQUEST_OVERHEAD = 1 << 10
#: the largest valid client request: a client port that took less would refuse valid requests
LARGEST_REQUEST_BYTES = (
    MAX_OP_BYTES + MAX_KEYS_PER_COMMAND * (MAX_KEY_BYTES + 8) + _REQUEST_OVERHEAD
)

#: a client sends no request and waits for no answer this long: its connection is closed (the
#: native client reconnects on its next request; it sends no heartbeats, hence generous)
DEFAULT_CLIENT_IDLE_TIMEOUT_S = 300.0
#: a frame must arrive whole within this: 30 s takes the largest request at ~40 KB/s
DEFAULT_CLIENT_FRAME_TIMEOUT_S = 30.0
#: client connections per replica (ZooKeeper's maxClientCnxns is 60 per client host; this is
#: for all hosts, and below the common 1024-descriptor default only with the peers on top)
DEFAULT_CLIENT_MAX_CONNECTIONS = 1000
#: the largest client frame: the largest valid request (about 1.1 MiB), rounded up
DEFAULT_CLIENT_MAX_FRAME_BYTES = 2 << 20
#: partial-frame bytes across all client connections: 32 largest frames arriving at once
DEFAULT_CLIENT_MAX_BUFFERED_BYTES = 64 << 20

Reason = Literal["idle", "slow"]


def peer_connection_cap(replicas: int) -> int:
    """The default cap on the peer port of a cluster of ``replicas``."""
    return PEER_CONNECTIONS_PER_REPLICA * max(0, replicas - 1) + PEER_SPARE_CONNECTIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitsConfig:
    """The cluster file's ``[limits]`` table (every key optional); seconds and bytes."""

    client_idle_timeout_s: float = DEFAULT_CLIENT_IDLE_TIMEOUT_S
    client_frame_timeout_s: float = DEFAULT_CLIENT_FRAME_TIMEOUT_S
    client_max_connections: int = DEFAULT_CLIENT_MAX_CONNECTIONS
    client_max_frame_bytes: int = DEFAULT_CLIENT_MAX_FRAME_BYTES
    client_max_buffered_bytes: int = DEFAULT_CLIENT_MAX_BUFFERED_BYTES
    #: 0: ``peer_connection_cap(replicas)``
    peer_max_connections: int = 0
    #: peer connections in their handshake at once, and how long one may take
    peer_max_handshakes: int = DEFAULT_PEER_MAX_HANDSHAKES
    peer_handshake_timeout_s: float = DEFAULT_PEER_HANDSHAKE_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("client_idle_timeout_s", "client_frame_timeout_s",
                     "peer_handshake_timeout_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigError(f"[limits].{name} must be seconds > 0, got {value!r}")
        minimums = {
            "client_max_connections": 1,
            "client_max_frame_bytes": LARGEST_REQUEST_BYTES,
            "client_max_buffered_bytes": LARGEST_REQUEST_BYTES,
            "peer_max_connections": 0,
            "peer_max_handshakes": 1,
        }
        for name, minimum in minimums.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                why = " (the largest valid request)" if minimum == LARGEST_REQUEST_BYTES else ""
                raise ConfigError(
                    f"[limits].{name} must be an integer >= {minimum}{why}, got {value!r}"
                )
        if self.client_max_frame_bytes > 0xFFFFFFFF:
            raise ConfigError(
                f"[limits].client_max_frame_bytes must fit the 4-byte length prefix, got "
                f"{self.client_max_frame_bytes}"
            )
        if self.client_max_buffered_bytes < self.client_max_frame_bytes:
            raise ConfigError(
                f"[limits].client_max_buffered_bytes ({self.client_max_buffered_bytes}) must be "
                f">= [limits].client_max_frame_bytes ({self.client_max_frame_bytes})"
            )

    @staticmethod
    def keys() -> frozenset[str]:
        return frozenset(f.name for f in fields(LimitsConfig))

    def peer_cap(self, replicas: int) -> int:
        return self.peer_max_connections or peer_connection_cap(replicas)

    def sweep_interval(self) -> float:
        shortest = min(self.client_idle_timeout_s, self.client_frame_timeout_s)
        return min(MAX_SWEEP_S, max(MIN_SWEEP_S, shortest / SWEEPS_PER_TIMEOUT))


@dataclass(slots=True)
class PortStats:
    #: connections open now (gauge)
    open: int = 0
    #: connections closed at once for being over the cap
    refused: int = 0
    #: closed for the idle timeout / the slow-frame timeout
    closed_idle: int = 0
    closed_slow: int = 0
    #: closed for taking the partial-frame bytes over the budget
    closed_over_budget: int = 0
    #: partial-frame bytes held now, all connections (gauge)
    buffered_bytes: int = 0


@dataclass(slots=True)
class HandshakeStats:
    #: connections in their handshake now (gauge)
    open: int = 0
    #: refused at once, every place taken by a connection that talked
    refused: int = 0
    #: closed to make room for a newcomer, having sent nothing
    evicted_silent: int = 0
    #: closed for not finishing their handshake in time
    timed_out: int = 0


class PortGuard:
    """The open connections of one port and their cap."""

    def __init__(
        self, port: str, max_connections: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or (
            max_connections < 1
        ):
            raise ConfigError(f"{port} port: max_connections must be >= 1, got {max_connections!r}")
        self.port = port
        self.max_connections = max_connections
        self.stats = PortStats()
        self._clock = clock
        self._log = RateLimited(log, clock=clock)

    def admit(self) -> bool:
        """Count a new connection in; False (counted, maybe logged) if the port is full: the
        caller closes it at once."""
        stats = self.stats
        if stats.open < self.max_connections:
            stats.open += 1
            return True
        stats.refused += 1
        self._log.warning("refused", "%s port: refused a connection over its cap of %d",
                          self.port, self.max_connections)
        return False

    def release(self) -> None:
        """An admitted connection closed."""
        self.stats.open -= 1


class Tracked:
    """What the policy knows of one client connection."""

    __slots__ = ("buffered", "close", "closed", "last_active", "outstanding", "partial_since")

    def __init__(self, close: Callable[[], None], now: float) -> None:
        #: closes the connection (the server's read then ends and it calls ``closed``)
        self.close = close
        self.closed = False
        #: the last complete request or answer
        self.last_active = now
        #: requests waiting for their answer
        self.outstanding = 0
        #: when the partial frame now buffered started (None: nothing buffered)
        self.partial_since: float | None = None
        self.buffered = 0


class ClientPortLimits(PortGuard):
    """The client port's policy: the cap, the idle and slow-frame deadlines, the budget."""

    def __init__(
        self, config: LimitsConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__("client", config.client_max_connections, clock=clock)
        self.config = config
        self._connections: set[Tracked] = set()
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ the server's calls
    def open(self, close: Callable[[], None]) -> Tracked | None:
        """A connection was accepted: its record, or None if over the cap (the caller closes
        it at once)."""
        if not self.admit():
            return None
        tracked = Tracked(close, self._clock())
        self._connections.add(tracked)
        self._arm()
        return tracked

    def received(self, tracked: Tracked, buffered: int, frames: int) -> bool:
        """After a read: ``frames`` whole frames came out and ``buffered`` bytes of a partial
        one are held. False if that takes the port over its budget: the caller closes the
        connection (counted here)."""
        if tracked.closed:
            return False  # a sweep closed it while this read was on its way
        now = self._clock()
        if frames:
            tracked.last_active = now
            # the partial frame left over (if any) is a new one
            tracked.partial_since = now if buffered else None
        elif buffered and tracked.partial_since is None:
            tracked.partial_since = now
        elif not buffered:
            tracked.partial_since = None
        stats = self.stats
        stats.buffered_bytes += buffered - tracked.buffered
        tracked.buffered = buffered
        if buffered and stats.buffered_bytes > self.config.client_max_buffered_bytes:
            stats.closed_over_budget += 1
            self._log.warning(
                "over budget", "client port: closed a connection for partial frames over "
                "[limits].client_max_buffered_bytes = %d (it held %d bytes)",
                self.config.client_max_buffered_bytes, buffered,
            )  # fmt: skip
            self._forget_bytes(tracked)
            return False
        return True

    def request_started(self, tracked: Tracked) -> None:
        tracked.outstanding += 1

    def request_done(self, tracked: Tracked) -> None:
        """An answer to one of its requests is on its way."""
        if tracked.outstanding:
            tracked.outstanding -= 1
        tracked.last_active = self._clock()

    def closed(self, tracked: Tracked) -> None:
        """The connection is gone (whoever closed it)."""
        if tracked.closed:
            return
        tracked.closed = True
        self._connections.discard(tracked)
        self._forget_bytes(tracked)
        self.release()
        if not self._connections and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------------------ deadlines
    def expired(self, tracked: Tracked, now: float) -> Reason | None:
        config = self.config
        if tracked.partial_since is not None:
            if now - tracked.partial_since >= config.client_frame_timeout_s:
                return "slow"
            return None  # a frame on its way is governed by the frame deadline alone
        if tracked.outstanding == 0 and now - tracked.last_active >= config.client_idle_timeout_s:
            return "idle"
        return None

    def sweep(self, now: float) -> list[tuple[Tracked, Reason]]:
        """Close (and count) every connection past a deadline; returns them."""
        gone: list[tuple[Tracked, Reason]] = []
        for tracked in list(self._connections):
            reason = self.expired(tracked, now)
            if reason is None:
                continue
            gone.append((tracked, reason))
            if reason == "idle":
                self.stats.closed_idle += 1
            else:
                self.stats.closed_slow += 1
            # its partial frame no longer counts, whenever its server task gets to run
            self._forget_bytes(tracked)
            tracked.close()
            self.closed(tracked)
        if gone:
            log.info(
                "client port: closed %d idle and %d slow connection(s)",
                sum(1 for _, reason in gone if reason == "idle"),
                sum(1 for _, reason in gone if reason == "slow"),
            )
        return gone

    def _forget_bytes(self, tracked: Tracked) -> None:
        self.stats.buffered_bytes -= tracked.buffered
        tracked.buffered = 0

    def _arm(self) -> None:
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # driven by hand (tests): ``sweep`` is called directly
        self._timer = loop.call_later(self.config.sweep_interval(), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        try:
            self.sweep(self._clock())
        except Exception:  # a close callback that raised must not end the sweeps
            log.exception("client port: sweeping connections failed")
        if self._connections:
            self._arm()


class Handshaking:
    """A connection of a ``HandshakeGuard``: when it came, whether it sent anything yet."""

    __slots__ = ("close", "since", "talked")

    def __init__(self, close: Callable[[], object], since: float) -> None:
        #: closes it (making room for a newcomer)
        self.close = close
        self.since = since
        self.talked = False


class HandshakeGuard:
    """The connections of a port still in their handshake: a cap of their own, and room made
    for a newcomer by closing the oldest one that sent nothing (see the module's header).
    The server calls ``admit`` on accept, ``talked`` when the first bytes come, and
    ``finished`` once the handshake ended either way (``timed_out`` for its deadline)."""

    def __init__(self, port: str, max_handshakes: int, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(max_handshakes, bool) or not isinstance(max_handshakes, int) or (
            max_handshakes < 1
        ):
            raise ConfigError(f"{port} port: max_handshakes must be >= 1, got "
                              f"{max_handshakes!r}")
        self.port = port
        self.max_handshakes = max_handshakes
        self.stats = HandshakeStats()
        self._clock = clock
        self._log = RateLimited(log, clock=clock)
        #: in the order they came (the oldest first)
        self._open: dict[Handshaking, None] = {}

    def admit(self, close: Callable[[], object]) -> Handshaking | None:
        """A connection was accepted: its record, or None if it is refused (counted, maybe
        logged; the caller closes it at once). Over the cap, the oldest connection silent
        for ``SILENT_GRACE_S`` is closed (``close``) to make room."""
        now = self._clock()
        if len(self._open) >= self.max_handshakes:
            silent = next((entry for entry in self._open
                           if not entry.talked and now - entry.since >= SILENT_GRACE_S), None)
            if silent is None:
                self.stats.refused += 1
                self._log.warning(
                    "refused", "%s port: refused a connection: %d handshakes under way, each "
                    "of which sent something", self.port, self.max_handshakes,
                )  # fmt: skip
                return None
            self.stats.evicted_silent += 1
            self._log.warning(
                "evicted", "%s port: closed a connection silent for %.1f s to make room for "
                "a newcomer (%d handshakes under way)", self.port, now - silent.since,
                self.max_handshakes,
            )  # fmt: skip
            self.finished(silent)
            silent.close()
        entry = Handshaking(close, now)
        self._open[entry] = None
        self.stats.open = len(self._open)
        return entry

    def talked(self, entry: Handshaking) -> None:
        """Its first bytes came: it no longer makes room for newcomers."""
        entry.talked = True

    def finished(self, entry: Handshaking, *, timed_out: bool = False) -> None:
        """Its handshake ended (proved, refused, timed out or closed); idempotent."""
        if entry in self._open:
            del self._open[entry]
            self.stats.open = len(self._open)
            if timed_out:
                self.stats.timed_out += 1
