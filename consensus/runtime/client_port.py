"""A replica node's clients: who waits for which answer, and the client port.

Owns: the waiters of every request this replica takes (an in-process caller's future, or a
client connection and its request id), keyed by ``(client_id, seq)``, with when each command
was proposed (``NodeStats.ready_latency`` / ``executed_latency``) and which reads are backup
barriers; the client port's server, its connections and the tasks serving them, and the
answers written to each connection once per loop turn (``answer``).

A connection's requests (``client_protocol``) are checked here (``refusal``: ops reserved for
the replicas, sessions opened too far ahead), sealed for their principal under TLS (``sealed``)
and queued for the turn loop (``Inbox.queue_request``); ``"status"``, ``"partition"`` and
``"backup-chunk"`` are answered at once by the handlers the node gives (``ClientPort``'s
arguments), ``"backup"`` goes through the log as a read barrier. The turn loop resolves the
waiters (``complete``, ``fail``, ``answered``) and this writes their answers.

TLS (a cluster file with ``[tls]``): the port speaks mutual TLS 1.3 (``consensus.runtime.tls``)
and seals every operation of a client in an envelope naming the principal its certificate
names (``consensus.auth``); a connection whose certificate is revoked is closed (``revoked``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from consensus.auth import (
    ADMIN,
    ENVELOPE_MAGIC,
    ENVELOPE_OVERHEAD,
    Denied,
    PermissionDenied,
    Principal,
    sealer,
    session_id,
)
from consensus.codec import MAX_OP_BYTES, FrameReader, frame_to_wire
from consensus.errors import (
    DecodeError,
    DefiniteFailure,
    SDPaxosError,
    SessionExpired,
)
from consensus.messages import Command
from consensus.runtime.client_protocol import (
    NO_REQUEST,
    BadRequest,
    ClientRequest,
    ClientResponse,
    Status,
    decode_request_parts,
    empty_ok_response_wire,
    ok_response_wire,
)
from consensus.runtime.cluster_config import ClusterConfig
from consensus.runtime.conn_limits import ClientPortLimits, Tracked
from consensus.runtime.histogram import Histogram
from consensus.runtime.logs import RateLimited
from consensus.runtime.node_events import Inbox, Propose, Read, Request, StaleRead
from consensus.runtime.tls import Revocations, TlsServer, accept_tls, start_server
from consensus.sessions import (
    OPEN_BY_SHIFT,
    OPEN_WINDOW_S,
    SESSION_MARK,
    SessionTable,
    denied_reason,
    is_log_time_op,
)

__all__ = [
    "CLIENT_CLOSE_S",
    "MAX_OPEN_AHEAD_S",
    "READY",
    "ClientConnection",
    "ClientPort",
    "Result",
    "Waiter",
    "sealed",
    "session_refusal",
    "unblind",
]

#: a stopping replica waits this long for its client connections to close before it cuts them
CLIENT_CLOSE_S = 1.0

#: a client's session may not open later than this after the replica's clock (or the log
#: time, if later): tombstones of evicted sessions are kept until their open-by time
MAX_OPEN_AHEAD_S = 10 * OPEN_WINDOW_S

#: TLS: the longest op a client may send (its principal's envelope must fit the codec's limit)
_MAX_SEALED_OP = MAX_OP_BYTES - ENVELOPE_OVERHEAD

#: the event each kind of client request is queued as
_REQUESTS: Final[dict[str, type[Request]]] = {"cmd": Propose, "read": Read, "stale": StaleRead}

log = logging.getLogger("sdpaxos.node")


@dataclass(frozen=True, slots=True)
class Result:
    """A completed command: the state machine's answer and the command's log position
    (-1 for a blind write acknowledged when ready, before it executed)."""

    value: bytes
    position: int


#: what a blind write acknowledged when ready is answered with (the same for every one)
READY: Final = Result(b"", -1)


class ClientConnection:
    """Answers for one client connection, written once per loop turn."""

    __slots__ = ("out", "principal", "refused_one", "sealer", "serial", "tracked", "writer")

    def __init__(self, writer: asyncio.StreamWriter, tracked: Tracked) -> None:
        self.writer = writer
        #: TLS: who the client's certificate names, and its serial
        self.principal: Principal | None = None
        self.sealer = b""  # what goes in front of its every op (consensus.auth.sealer)
        self.serial = -1
        self.out: list[bytes] = []
        #: its record in the client port's limits (outstanding requests, deadlines)
        self.tracked = tracked
        #: a request of it was refused as undecodable (logged once per connection)
        self.refused_one = False

    def refuse(self, reason: str) -> None:
        """Tell the client why its certificate is refused, before the connection closes:
        the answer to every request it sends (``NO_REQUEST``)."""
        self.writer.write(frame_to_wire(ClientResponse(
            NO_REQUEST, "denied", f"the cluster refuses this client's certificate: {reason}"
        ).encode()))


#: Who waits for a request: an in-process caller's future, or (connection, request id).
Waiter = asyncio.Future[Any] | tuple[ClientConnection, int]


class ClientPort:
    """The waiters of one replica's requests and its client port (see the module
    documentation). ``partition``, ``status`` and ``backup_chunk`` answer those requests at
    once (``partition`` and ``status`` get the request, ``partition`` also the principal)."""

    def __init__(
        self,
        config: ClusterConfig,
        me: int,
        inbox: Inbox,
        *,
        sessions: SessionTable | None,
        tls: ssl.SSLContext | None,
        revocations: Revocations,
        partition: Callable[[ClientRequest, Principal | None], ClientResponse],
        status: Callable[[ClientRequest], ClientResponse],
        backup_chunk: Callable[[ClientRequest], ClientResponse],
    ) -> None:
        self.config = config
        self.me = me
        self.inbox = inbox
        self.sessions = sessions
        self._tls = tls
        self.revocations = revocations
        self._partition = partition
        self._status = status
        self._backup_chunk = backup_chunk
        #: the port's connection caps, idle/slow timeouts and buffer budget
        self.limits = ClientPortLimits(config.limits)
        self._commands: dict[tuple[int, int], list[Waiter]] = defaultdict(list)
        self._reads: dict[tuple[int, int], list[Waiter]] = defaultdict(list)
        #: reads that are backup barriers (answered with a backup's token, not a query)
        self._backup_keys: set[tuple[int, int]] = set()
        #: when each command was proposed (microseconds), until it is answered
        self._proposed_at: dict[tuple[int, int], int] = {}
        self._dirty: set[ClientConnection] = set()
        #: the connections, and the tasks serving them (a stop closes them and waits for
        #: their tasks: cancelled when the process ends, each logged an error)
        self._connections: set[ClientConnection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | TlsServer | None = None
        self._stopping = False
        #: what clients can make happen again and again, logged once an interval
        self._log = RateLimited(log)
        revocations.subscribe(self.revoked)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Listen on this replica's client address."""
        host, port = self.config.replica(self.me).client_address
        self._server = await start_server(self._serve, host, port, tls=self._tls, name="client")

    def stop_accepting(self) -> None:
        """Take no more connections, and no more requests on the open ones."""
        self._stopping = True
        if self._server is not None:
            self._server.close()

    def fail_all(self, error: SDPaxosError) -> None:
        """Answer every request still waiting with ``error`` (the replica stops)."""
        for key in list(self._commands):
            self.fail(key, error, reads=False)
        for key in list(self._reads):
            self.fail(key, error, reads=True)

    async def close(self) -> None:
        """Answer what the clients still wait for (it failed: the replica stops), close their
        connections and let the tasks serving them end by themselves (a task left to the end
        of the process is cancelled, and asyncio logs that as an error, one per client)."""
        self.answer()
        for connection in self._connections:
            connection.writer.close()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=CLIENT_CLOSE_S)
            for connection in self._connections:  # (a TLS close waits for its peer)
                connection.writer.transport.abort()
            if late:
                await asyncio.wait(late)

    # ------------------------------------------------------------------ waiters
    def expect(self, command: Command, *, read: bool) -> asyncio.Future[Result]:
        """An in-process caller's future for ``command``'s answer."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        table = self._reads if read else self._commands
        table[(command.client_id, command.seq)].append(future)
        return future

    def proposed(self, key: tuple[int, int], now: int) -> None:
        """The command ``key`` goes to the core at ``now`` (its first proposal counts)."""
        self._proposed_at.setdefault(key, now)

    def take_read(self, key: tuple[int, int]) -> tuple[list[Waiter], bool]:
        """The waiters of the read ``key``, answered now, and whether it is a backup's
        barrier (both forgotten here)."""
        waiters = self._reads.pop(key, [])
        if key in self._backup_keys:
            self._backup_keys.discard(key)
            return waiters, True
        return waiters, False

    def complete(
        self, key: tuple[int, int], result: Result, now: int, latency: Histogram
    ) -> None:
        if result.value.startswith(SESSION_MARK):  # it never executed: see session_refusal
            self.fail(key, session_refusal(result.value), reads=False)
            return
        started = self._proposed_at.pop(key, None)
        if started is not None:
            latency.observe((now - started) / 1e6)
        for waiter in self._commands.pop(key, ()):
            self.resolve(waiter, result)

    def acknowledge(self, commands: Iterable[Command], now: int, latency: Histogram) -> None:
        """The blind writes among ``commands`` became ready: each answered ``READY``
        (``complete`` of each, in one call for a turn's)."""
        proposed_at, waiting = self._proposed_at.pop, self._commands.pop
        request_done, dirty = self.limits.request_done, self._dirty.add
        #: proposal time -> the writes proposed then: a turn's proposals share its time, so
        #: most of a turn's acknowledgements are one observation
        proposed_then: dict[int, int] = {}
        for command in commands:
            if command.blind:
                key = (command.client_id, command.seq)
                started = proposed_at(key, None)
                if started is not None:
                    proposed_then[started] = proposed_then.get(started, 0) + 1
                for waiter in waiting(key, ()):
                    if type(waiter) is tuple:  # ``resolve(waiter, READY)``, inline
                        connection, req_id = waiter
                        request_done(connection.tracked)
                        connection.out.append(empty_ok_response_wire(req_id))
                        dirty(connection)
                    else:
                        self.resolve(waiter, READY)
        for started, count in proposed_then.items():
            latency.observe_many((now - started) / 1e6, count)

    def fail(self, key: tuple[int, int], error: SDPaxosError, *, reads: bool) -> None:
        self._proposed_at.pop(key, None)
        if reads:
            self._backup_keys.discard(key)  # a failed barrier leaves no backup waiting
        table = self._reads if reads else self._commands
        for waiter in table.pop(key, ()):
            self.resolve(waiter, error)

    def resolve(self, waiter: Waiter, outcome: Result | SDPaxosError) -> None:
        if isinstance(waiter, tuple):
            connection, req_id = waiter
            self.limits.request_done(connection.tracked)
            if isinstance(outcome, Result):
                wire = ok_response_wire(req_id, outcome.value, outcome.position)
            elif isinstance(outcome, SessionExpired):  # its position field: the log time
                wire = frame_to_wire(ClientResponse(req_id, "expired", str(outcome),
                                                    outcome.log_time).encode())
            else:
                status: Status = (
                    "denied" if isinstance(outcome, PermissionDenied)
                    else "definite" if isinstance(outcome, DefiniteFailure) else "indefinite"
                )
                wire = frame_to_wire(ClientResponse(req_id, status, str(outcome)).encode())
            connection.out.append(wire)
            self._dirty.add(connection)
        elif not waiter.done():
            if isinstance(outcome, Result):
                waiter.set_result(outcome)
            else:
                waiter.set_exception(outcome)

    def answered(self, waiters: list[Waiter], answered: bytes | Denied | SDPaxosError, *,
                 now: bool = True) -> None:
        """Resolve a read's waiters (``now=False``: outside a turn, so written at once)."""
        outcome: Result | SDPaxosError = (
            PermissionDenied(answered.reason) if isinstance(answered, Denied)
            else answered if isinstance(answered, SDPaxosError) else Result(answered, -1))
        for waiter in waiters:
            self.resolve(waiter, outcome)
        if not now:
            self.answer()

    def answer(self) -> None:
        """Write each client connection's answers of this turn in one go."""
        for connection in self._dirty:
            if not connection.writer.is_closing():
                connection.writer.write(b"".join(connection.out))
            connection.out.clear()
        self._dirty.clear()

    # ------------------------------------------------------------------ the port
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        limits = self.limits
        tracked = limits.open(writer.transport.abort)
        if tracked is None:  # over the cap: counted and logged by the limits; the client
            # told (a connection closed without a word reads as a refused certificate)
            writer.write(frame_to_wire(ClientResponse(
                NO_REQUEST, "indefinite", "the replica is at its client connection cap "
                f"({limits.config.client_max_connections}); another replica may answer",
            ).encode()))
            writer.close()
            return
        frames = FrameReader(limits.config.client_max_frame_bytes)
        connection = ClientConnection(writer, tracked)
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(connection)
        self._tasks.add(task)
        inbox = self.inbox
        queue, commands, reads = inbox.queue_request, self._commands, self._reads
        try:
            if self._tls is not None and not await self._authenticate(connection):
                return
            principal = connection.principal
            while not self._stopping:
                data = await reader.read(1 << 16)
                if not data:
                    return
                payloads = frames.feed(data)
                if not limits.received(tracked, frames.buffered, len(payloads)):
                    writer.transport.abort()  # over the buffer budget (or timed out)
                    return
                for payload in payloads:
                    try:
                        req_id, kind, command = decode_request_parts(payload)
                    except BadRequest as exc:  # answered, under its own req_id if it has one
                        if not connection.refused_one:  # logged once per connection
                            connection.refused_one = True
                            log.warning("refusing a request of the client at %s: %s",
                                        writer.get_extra_info("peername"), exc)
                        writer.write(frame_to_wire(
                            ClientResponse(exc.req_id, "error", str(exc)).encode()))
                        continue
                    if kind not in _REQUESTS:  # partitions, status, backups
                        self._serve_apart(ClientRequest(req_id, kind, command), connection)
                        continue
                    if kind == "cmd":
                        refusal = self.refusal(command)
                        if refusal is not None:
                            writer.write(frame_to_wire(ClientResponse(
                                req_id, "error", refusal).encode()))
                            continue
                    if principal is not None:
                        if len(command.op) > _MAX_SEALED_OP:
                            writer.write(frame_to_wire(ClientResponse(
                                req_id, "error", f"op over {_MAX_SEALED_OP} bytes (a "
                                "TLS cluster's commands carry their principal)").encode()))
                            continue
                        command = sealed(command, principal, connection.sealer)
                    table = commands if kind == "cmd" else reads
                    table[command.client_id, command.seq].append((connection, req_id))
                    limits.request_started(tracked)
                    queue(_REQUESTS[kind](unblind(command)))
                inbox.wake()
        except DecodeError as exc:
            self._log.warning("bad client bytes", "closing client connection from %s: %s",
                              writer.get_extra_info("peername"), exc)
        except (OSError, ConnectionError):
            pass
        finally:
            writer.close()
            self._connections.discard(connection)
            self._tasks.discard(task)
            limits.closed(tracked)

    def _serve_apart(self, request: ClientRequest, connection: ClientConnection) -> None:
        """A request that is not a command or a read: a partition, the status or a backup
        (answered here at once; a backup's barrier is a read through the log)."""
        writer, principal = connection.writer, connection.principal
        if request.kind == "partition":
            writer.write(frame_to_wire(self._partition(request, principal).encode()))
            return
        if request.kind == "status":
            writer.write(frame_to_wire(self._status(request).encode()))
            return
        assert request.kind in ("backup", "backup-chunk"), request.kind
        if principal is not None and principal.role != ADMIN:
            writer.write(frame_to_wire(ClientResponse(
                request.req_id, "denied", "backups are an admin's: "
                f"{principal.describe()} may not take one").encode()))
            return
        if request.kind == "backup-chunk":
            writer.write(frame_to_wire(self._backup_chunk(request).encode()))
            return
        key = (request.command.client_id, request.command.seq)
        self._reads[key].append((connection, request.req_id))
        self._backup_keys.add(key)
        self.limits.request_started(connection.tracked)
        barrier = Command(client_id=key[0], seq=key[1], op=b"", keys=())
        self.inbox.queue_request(Read(barrier))

    def refusal(self, command: Command) -> str | None:
        """Why a client's command (a "cmd" request's) is refused before it is proposed (None:
        it is not): an op reserved for the replicas' log-time commands, or a session that
        would open too far ahead (its tombstone would be kept that long)."""
        if is_log_time_op(command.op):
            return "ops starting with the log-time magic are the replicas' own"
        open_by = command.seq >> OPEN_BY_SHIFT
        if open_by:
            now = max(int(time.time()), self.sessions.now if self.sessions is not None else 0)
            if open_by > now + MAX_OPEN_AHEAD_S:
                return (f"the session's open-by time {open_by} is more than "
                        f"{MAX_OPEN_AHEAD_S} s ahead of this replica's clock and log time "
                        f"({now}): is the client's clock ahead?")
        return None

    async def _authenticate(self, connection: ClientConnection) -> bool:
        """TLS: the handshake and the principal of the client's certificate (False: refused,
        logged saying why)."""
        assert self._tls is not None
        identity = await accept_tls(
            connection.writer, self._tls, port="client", cluster_id=self.config.cluster_id,
            revocations=self.revocations, refused=connection.refuse,
        )
        if identity is None:
            return False
        if identity.principal is None:
            log.warning("refusing client connection from %s: %s is no client",
                        connection.writer.get_extra_info("peername"), identity.describe())
            connection.refuse(f"{identity.describe()} is no client")
            return False
        connection.principal = identity.principal
        connection.sealer = sealer(identity.principal)
        connection.serial = identity.serial
        return True

    def revoked(self, serials: frozenset[int]) -> None:
        """Close the client connections of certificates just revoked."""
        for connection in list(self._connections):
            if connection.serial in serials:
                log.warning("closing the connection of a client whose certificate (serial %x) "
                            "was revoked", connection.serial)
                connection.writer.transport.abort()


def sealed(command: Command, principal: Principal, prefix: bytes = b"") -> Command:
    """``command`` on behalf of ``principal``: its op in an envelope. Only an admin's writes
    may stay blind (acknowledged before they apply): anyone else's may be refused as they
    apply, and the refusal must reach the client. ``prefix``: ``sealer(principal)``, if
    known. Its client id becomes the principal's own session (``consensus.auth.session_id``).
    An admin's op travels bare, as an in-process caller's: an admin may do everything, so the
    verdict does not depend on the envelope, and opening one at every replica cost a quarter
    of the throughput at 16 B (an op that looks like an envelope is sealed all the same, so
    the nested-envelope check refuses it)."""
    prefix = prefix or sealer(principal)
    op = command.op
    if principal.role != ADMIN or op.startswith(ENVELOPE_MAGIC):
        op = prefix + op
    return Command(client_id=session_id(prefix, command.client_id), seq=command.seq, op=op,
                   keys=command.keys, blind=command.blind and principal.role == ADMIN)


def unblind(command: Command) -> Command:
    """``command`` answered once it executed if its session may be evicted: acknowledged
    when ready, it would be told "done" before the session table could refuse it
    (``consensus.sessions``; pinned sessions keep blind writes)."""
    if command.blind and command.seq >> OPEN_BY_SHIFT:
        return command._replace(blind=False)
    return command


def session_refusal(result: bytes) -> DefiniteFailure:
    """The error a request is answered with when the session table gave it one of its own
    results (``consensus.statemachine.SESSION_MARK``): it never executed and never will,
    because it was refused by authorization as it applied (``PermissionDenied``) or because
    its client cancelled it before any copy of it executed."""
    reason = denied_reason(result)
    if reason is not None:
        return PermissionDenied(reason)
    return DefiniteFailure("not applied: the request was cancelled before any copy of it "
                           "executed (it never will)")
