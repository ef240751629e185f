"""Native async client: msgpack over TCP to the replica at the client's own site.

Requests are pipelined on one connection. A request not answered within ``timeout_s`` is sent
again with the same ``(client_id, seq)`` to the next replica (the session table on the
replicated state machine executes it at most once and returns its first result). What an
answer means for the request follows ``consensus.attempts``: a ``DefiniteFailure`` is final
only if no earlier attempt may have left a copy of the request behind; otherwise, and after
``attempts`` tries without an answer, the client *settles* the request — a cancel under its
own ``(client_id, seq)`` that the log orders against every copy — and its answer is the
request's outcome: the result if a copy executed, a ``DefiniteFailure`` if none did (none
ever will). Only if that too goes unanswered does the request fail with ``IndefiniteFailure``.
Membership changes cannot be settled (no session table keeps them): they end indefinite
instead.

A client is a session of the replicated session table (``consensus.sessions``): its sequence
numbers carry the session's open-by time. If the table evicted the session (idle too long, or
over a cap), a request fails with ``SessionExpired``: not applied. One this client numbered
itself and had sent nowhere before is then sent again, once, in a new session (it never ran);
one it had sent before without an answer fails with ``IndefiniteFailure`` (it may have run
before the session was evicted; it will not run from now on). ``execute(..., last=True)``
closes the session with that request: what a one-shot client (a CLI verb) sends.

A replica closes client connections idle for long (``conn_limits``): a request lost because
its pooled connection turned out closed is sent again at once on a new connection to the same
replica, without using up an attempt (once per attempt; a fresh connection's loss counts).

The replicas a client was given are where it starts: ``sync`` (etcd's ``Sync``) asks them for
the current members (``consensus.runtime.members``: the log's member list, every address of
every member) and talks to the voters' client ports from then on, so a client never keeps
asking a member that was removed. A client made with ``sync_every_s`` syncs before its first
request, again once that long has passed, and after a request found no replica answering.

A TLS cluster (``tls``: an ``ssl.SSLContext`` from ``consensus.runtime.tls``, e.g.
``config.tls.tool()``) is reached over mutual TLS 1.3; what the client's certificate names is
the principal its requests are checked as, and a refused one raises
``consensus.auth.PermissionDenied`` (a ``DefiniteFailure``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import math
import secrets
import ssl
import time
from collections.abc import Sequence
from typing import Any

import msgpack

from consensus.attempts import Answer, Attempts, Step
from consensus.attempts import Kind as AttemptKind
from consensus.auth import PermissionDenied
from consensus.codec import FrameReader, frame_to_wire
from consensus.errors import (
    DecodeError,
    DefiniteFailure,
    IndefiniteFailure,
    SDPaxosError,
    SessionExpired,
    Unreachable,
)
from consensus.messages import Command
from consensus.protocol.membership import MEMBER_OP, Change, encode_change
from consensus.runtime.client_protocol import ClientRequest, ClientResponse, Kind, decode_response
from consensus.runtime.members import KnownMember, members_of_status
from consensus.sessions import CANCEL_OP, SessionNumbers

__all__ = ["Client", "Reply", "cut_off", "new_client_id", "newest_status", "statuses"]

#: the client id of status requests (a status opens no session)
STATUS_CLIENT_ID = 1 << 44

Reply = ClientResponse


def new_client_id() -> int:
    """A fresh random client id. The top half of the id space is left to random ids, so
    they never meet the small hand-picked ones that tests and demos use."""
    return (1 << 62) + secrets.randbelow(1 << 62)


class _Connection:
    def __init__(self, address: tuple[str, int], tls: ssl.SSLContext | None = None) -> None:
        self.address = address
        self.tls = tls
        self.writer: asyncio.StreamWriter | None = None
        self.reader_task: asyncio.Task[None] | None = None
        self.pending: dict[int, asyncio.Future[ClientResponse]] = {}
        # Concurrent first calls must share one connection: each opening its own would
        # replace the writer under the others, and a replaced connection's reader, on
        # closing, would fail every pending call.
        self._connecting = asyncio.Lock()

    async def ensure(self) -> bool:
        """Connect unless connected; True if this opened a new connection."""
        async with self._connecting:
            if self.writer is not None and not self.writer.is_closing():
                return False
            reader, writer = await _open(self.address, self.tls)
            self.writer = writer
            self.reader_task = asyncio.create_task(self._read(reader, writer))
            return True

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader()
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                for payload in frames.feed(data):
                    response = decode_response(payload)
                    future = self.pending.pop(response.req_id, None)
                    if future is not None and not future.done():
                        future.set_result(response)
        except (OSError, ConnectionError, DecodeError):
            pass
        finally:
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("connection to replica lost"))
            self.pending.clear()
            writer.close()

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.reader_task is not None:
            self.reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader_task


class Client:
    """A session with the cluster. Not safe to share between event loops."""

    def __init__(
        self,
        client_id: int,
        addresses: Sequence[tuple[str, int]],
        *,
        home: int = 0,
        timeout_s: float = 2.0,
        attempts: int = 3,
        tls: ssl.SSLContext | None = None,
        sync_every_s: float | None = None,
    ) -> None:
        """``addresses``: replicas' client ports, ``addresses[home]`` asked first.
        ``sync_every_s``: follow the member list (``sync``) before the first request and
        then this often (``math.inf``: once); None: talk to ``addresses`` only."""
        if not addresses:
            raise ValueError("a client needs at least one replica address")
        self.client_id = client_id
        self._tls = tls
        self._connections = [_Connection(address, tls) for address in addresses]
        self._home = home % len(addresses)
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.sync_every_s = sync_every_s
        self._synced_at = -math.inf
        #: the members the last ``sync`` learnt (None: none yet)
        self.synced_members: list[KnownMember] | None = None
        self._numbers = SessionNumbers()
        self._req_ids = itertools.count(1)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The replicas this client talks to, in order (the home one first)."""
        count = len(self._connections)
        return [self._connections[(self._home + k) % count].address for k in range(count)]

    async def sync(self) -> list[KnownMember] | None:
        """etcd's ``Sync``: ask the replicas this client knows for the current members (the
        newest answer: the highest epoch, then the furthest applied) and talk to the voters'
        client ports from now on, in the epoch's order, home kept while it votes. Returns
        the members, or None, changing nothing, if no replica answered with a member list
        (none reachable, or a core without membership: its members are its cluster
        file's)."""
        self._synced_at = time.monotonic()
        answers = await statuses([c.address for c in self._connections], tls=self._tls,
                                 timeout_s=self.timeout_s)
        status = newest_status(answers.values())
        try:
            members = members_of_status(status) if status is not None else None
        except DecodeError:
            return None
        voters = [m.info.client_address for m in members or () if m.voter and m.info]
        if members is None or not voters:
            return None
        self.synced_members = members
        home = self._connections[self._home].address
        kept: dict[tuple[str, int], _Connection | None] = {
            c.address: c for c in self._connections}
        self._connections = [kept.pop(address, None) or _Connection(address, self._tls)
                             for address in voters]
        self._home = voters.index(home) if home in voters else 0
        for gone in kept.values():  # removed members' (and learners') connections
            if gone is not None:
                await gone.close()
        return members

    async def _maybe_sync(self) -> None:
        if self.sync_every_s is not None and (
            time.monotonic() - self._synced_at >= self.sync_every_s
        ):
            await self.sync()

    def next_seq(self) -> int:
        return self._numbers.next()

    async def execute(
        self, op: bytes, keys: Sequence[str] = (), *, blind: bool = False, seq: int | None = None,
        last: bool = False,
    ) -> Reply:
        """Run a command through the log; returns the replica's ``ok`` reply. ``seq``: the
        caller numbers its requests itself (``consensus.sessions.session_seq``); ``last``:
        the session's last request (closed once it ran)."""
        renewed = False
        while True:
            command = Command(
                client_id=self.client_id,
                seq=self._numbers.next(last=last) if seq is None else seq,
                op=op,
                keys=tuple(keys),
                blind=blind,
            )
            try:
                return await self._call("cmd", command)
            except SessionExpired as exc:
                if seq is not None or renewed:
                    raise
                # it never ran (sent once, refused): again, once, in a session opened from
                # the cluster's log time
                self._numbers.renew(exc.log_time)
                renewed = True

    async def read(self, op: bytes, keys: Sequence[str] = (), *, stale: bool = False) -> Reply:
        command = Command(client_id=self.client_id, seq=self.next_seq(), op=op, keys=tuple(keys))
        return await self._call("stale" if stale else "read", command)

    async def backup(self) -> bytes:
        """A consistent snapshot of the cluster's state, as a snapshot file's bytes: one
        replica takes it after a linearizable read barrier and hands it over in chunks, all
        from that replica (``consensus.runtime.backup``). Raises ``DefiniteFailure`` if the
        replica drops it meanwhile or its checksum does not match, ``PermissionDenied`` for a
        non-admin of a TLS cluster."""
        await self._maybe_sync()
        last_error: BaseException | None = None
        for attempt in range(self.attempts):
            connection = self._connections[(self._home + attempt) % len(self._connections)]
            command = Command(client_id=self.client_id, seq=self.next_seq(), op=b"", keys=())
            try:
                await connection.ensure()
                reply = await self._request(connection, "backup", command)
                if reply.status != "ok":
                    last_error = _failure(reply)
                    if reply.status == "indefinite":
                        continue
                    raise last_error
                token, size, digest, _ = msgpack.unpackb(reply.payload)
                data = bytearray()
                while len(data) < size:
                    ask = Command(client_id=self.client_id, seq=command.seq,
                                  op=msgpack.packb([token, len(data)]), keys=())
                    chunk = await self._request(connection, "backup-chunk", ask)
                    if chunk.status != "ok":
                        raise _failure(chunk)
                    if not isinstance(chunk.payload, bytes) or not chunk.payload:
                        raise DefiniteFailure(f"backup {token} ended at {len(data)} of "
                                              f"{size} bytes")
                    data += chunk.payload
            except (OSError, ConnectionError, TimeoutError) as exc:
                last_error = exc
                continue
            if hashlib.sha256(data).hexdigest() != digest:
                raise DefiniteFailure(f"backup {token}: checksum mismatch after transfer")
            return bytes(data)
        raise IndefiniteFailure(f"no backup after {self.attempts} tries: {last_error}")

    async def status(self) -> dict[str, Any]:
        """What the home replica reports about itself (``consensus.runtime.status``): asked of
        that replica alone, once (a status is about one replica, so no other may answer it).
        Raises ``OSError``/``TimeoutError``/``ConnectionError`` if it is unreachable,
        ``DecodeError`` if its answer is not a status."""
        return await self._status_of(self._connections[self._home])

    async def _status_of(self, connection: _Connection) -> dict[str, Any]:
        await connection.ensure()
        command = Command(client_id=self.client_id, seq=self.next_seq(), op=b"", keys=())
        reply = await self._request(connection, "status", command)
        if reply.status != "ok":
            raise _failure(reply)
        try:
            status = msgpack.unpackb(reply.payload) if isinstance(reply.payload, bytes) else None
        except Exception as exc:
            raise DecodeError(f"status answer is not msgpack: {exc}") from None
        if not isinstance(status, dict):
            raise DecodeError("status answer is not a map")
        return status

    async def change_members(self, change: Change) -> str:
        """Propose a membership change (``consensus.protocol.membership``) through the log;
        its answer once executed: "ok: ..." or "refused: ..." (``DefiniteFailure`` if a
        replica refused it at once: one change at a time, say)."""
        reply = await self.execute(encode_change(change), ())
        payload = reply.payload
        return payload.decode() if isinstance(payload, bytes) else str(payload)

    async def members(self) -> dict[str, Any] | None:
        """The live member set as the home replica's log has it (``status``'s membership)."""
        membership: dict[str, Any] | None = (await self.status()).get("membership")
        return membership

    async def _call(self, kind: Kind, command: Command) -> Reply:
        """``command``'s outcome: attempts at replica after replica, as ``Attempts`` rules
        (the module documentation), settled through the log when an attempt's fate stays
        unknown."""
        attempts = Attempts(_kind_of(kind, command), self.attempts, self.attempts)
        request, request_kind = command, kind
        await self._maybe_sync()
        last_error: BaseException | None = None
        k = 0
        while True:
            connection = self._connections[(self._home + k) % len(self._connections)]
            k += 1
            answer, reply, error = await self._attempt(connection, request_kind, request)
            step = attempts.after(answer)
            if step is Step.DONE:
                if reply is not None and reply.status == "ok":
                    return reply
                assert error is not None
                raise error
            last_error = error
            if step is Step.GIVE_UP:
                self._synced_at = -math.inf  # nobody answered: the members may have changed
            if step is Step.GIVE_UP and not attempts.uncertain:
                raise Unreachable(f"no replica reachable for ({command.client_id}, "
                                  f"{command.seq}); it was never sent: {last_error}")
            if step is Step.GIVE_UP and answer is Answer.EXPIRED:
                raise IndefiniteFailure(
                    f"({command.client_id}, {command.seq}) may have been applied before its "
                    f"session expired (it will not be from now on): {last_error}"
                ) from last_error
            if step is Step.GIVE_UP:
                what = "nor a settled outcome " if attempts.settling else ""
                hint = ("; a membership change is not sent twice: `sdpaxos member list` tells "
                        "whether it took effect" if attempts.kind is AttemptKind.CHANGE else "")
                raise IndefiniteFailure(
                    f"no answer {what}for ({command.client_id}, {command.seq}) after "
                    f"{attempts.made or 1} tries: {last_error}{hint}"
                )
            if step is Step.SETTLE and request is command:
                # settle it: a cancel under its own (client id, seq), ordered by the log
                # against every copy of it (consensus.statemachine.CANCEL_OP)
                request = Command(client_id=command.client_id, seq=command.seq, op=CANCEL_OP)
                request_kind = "cmd"

    async def _attempt(
        self, connection: _Connection, kind: Kind, command: Command
    ) -> tuple[Answer, Reply | None, SDPaxosError | BaseException | None]:
        """One attempt on ``connection``: what it tells (``Answer``), the reply, the error."""
        try:
            fresh = await connection.ensure()
        except (OSError, ConnectionError, TimeoutError) as exc:
            return Answer.UNSENT, None, exc  # never left: no copy of it anywhere
        try:
            try:
                reply = await self._request(connection, kind, command)
            except ConnectionError:
                if fresh:
                    raise
                # the replica closed the pooled connection (idle) as this request went
                # out: the same (client_id, seq) on a new one executes at most once
                await connection.ensure()
                reply = await self._request(connection, kind, command)
        except (OSError, ConnectionError, TimeoutError) as exc:
            return Answer.UNKNOWN, None, exc  # it left: a copy may exist
        if reply.status == "ok":
            return Answer.OK, reply, None
        answer = {"indefinite": Answer.UNKNOWN, "expired": Answer.EXPIRED}.get(reply.status,
                                                                              Answer.REFUSED)
        return answer, reply, _failure(reply)

    async def _request(self, connection: _Connection, kind: Kind, command: Command) -> Reply:
        """Send one request on ``connection`` (connected) and wait for its answer."""
        assert connection.writer is not None
        req_id = next(self._req_ids)
        future: asyncio.Future[ClientResponse] = asyncio.get_running_loop().create_future()
        connection.pending[req_id] = future
        request = ClientRequest(req_id, kind, command)
        connection.writer.write(frame_to_wire(request.encode()))
        async with asyncio.timeout(self.timeout_s):
            return await future

    async def close(self) -> None:
        for connection in self._connections:
            await connection.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _kind_of(kind: Kind, command: Command) -> AttemptKind:
    if kind != "cmd":
        return AttemptKind.READ
    return AttemptKind.CHANGE if command.op.startswith(MEMBER_OP) else AttemptKind.COMMAND


async def statuses(
    addresses: Sequence[tuple[str, int]], *, tls: ssl.SSLContext | None = None,
    timeout_s: float = 2.0,
) -> dict[tuple[str, int], dict[str, Any] | BaseException]:
    """Every replica's status (``Client.status``), asked at once, or what asking raised
    (unreachable, timed out, refused, a malformed answer), by address."""

    async def ask(address: tuple[str, int]) -> dict[str, Any] | BaseException:
        try:
            async with Client(STATUS_CLIENT_ID, [address], timeout_s=timeout_s, attempts=1,
                              tls=tls) as client:
                async with asyncio.timeout(timeout_s):  # connecting included
                    return await client.status()
        except (OSError, TimeoutError, ConnectionError, SDPaxosError, DecodeError) as exc:
            return exc

    unique = list(dict.fromkeys(addresses))
    return dict(zip(unique, await asyncio.gather(*(ask(a) for a in unique)), strict=True))


def newest_status(answers: Any) -> dict[str, Any] | None:
    """Of status answers (and errors, skipped), the one furthest along: the highest epoch,
    then the furthest applied position (a replica cut off answers an older member list)."""
    found = [a for a in answers if isinstance(a, dict)]
    if not found:
        return None

    def position(status: dict[str, Any]) -> tuple[int, int]:
        membership = status.get("membership")
        epoch = membership.get("epoch", 0) if isinstance(membership, dict) else 0
        applied = status.get("applied", 0)
        return (epoch if type(epoch) is int else 0, applied if type(applied) is int else 0)

    return max(found, key=position)


def _failure(reply: Reply) -> SDPaxosError:
    """The error a non-``ok`` reply stands for."""
    if reply.status == "denied":
        return PermissionDenied(str(reply.payload))
    if reply.status == "expired":
        return SessionExpired(str(reply.payload), reply.position)
    if reply.status in ("definite", "error"):
        return DefiniteFailure(str(reply.payload))
    return IndefiniteFailure(str(reply.payload))


async def _open(
    address: tuple[str, int], tls: ssl.SSLContext | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if tls is None:
        return await asyncio.open_connection(*address)
    return await asyncio.open_connection(*address, ssl=tls, server_hostname=address[0])


async def cut_off(
    address: tuple[str, int], peers: Sequence[int], timeout_s: float = 5.0,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Test only: tell the replica at client ``address`` (run with ``--fault-injection``) to
    drop every frame to and from ``peers`` from now on; ``[]`` heals it."""
    reader, writer = await _open(address, tls)
    try:
        command = Command(client_id=0, seq=0, op=msgpack.packb(list(peers)), keys=(), blind=False)
        writer.write(frame_to_wire(ClientRequest(1, "partition", command).encode()))
        frames = FrameReader()
        while True:
            async with asyncio.timeout(timeout_s):
                data = await reader.read(1 << 16)
            if not data:
                raise ConnectionError("the replica closed the connection")
            payloads = frames.feed(data)
            if payloads:
                response = decode_response(payloads[0])
                if response.status != "ok":
                    raise DefiniteFailure(str(response.payload))
                return
    finally:
        writer.close()
