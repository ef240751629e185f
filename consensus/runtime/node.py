"""One replica as an asyncio service: the thin driver around a sans-I/O core.

Every loop turn: hand the core everything that arrived (peer frames, client requests with at
most ``MAX_READS_PER_TURN`` reads among them), tick it when due, take its ``Ready``, then —
in this order — send what needs no durability, append the records to the write-ahead log and
fsync once (group commit, on the loop: the next turn batches whatever came in meanwhile),
answer the blind writes that became ready, send the acknowledgements, apply committed commands
to the state machine, answer the rest, ``advance``.

Work too long for a turn runs in the node's worker thread (``snapshot_writer``, whose header
says how the worker never reads a state machine while the loop changes it): writing snapshots,
building a peer's snapshot's state (installed at a turn's start once built), encoding a
backup, answering a query the state machine defers (``DefersQueries``: the store's digest).

Clients reach the node through ``submit`` / ``read`` (in-process, for embedding) or the client
port (``client_protocol``). A request waits on a future keyed by ``(client_id, seq)``.

TLS (a cluster file with ``[tls]``): the peer mesh and the client port speak mutual TLS 1.3
(``consensus.runtime.tls``). The client port seals every operation of a client in an envelope
naming the principal its certificate names (``consensus.auth``), and the node applies commands
and answers reads through ``AuthorizingMachine``: a refused one changes nothing and its client
gets ``PermissionDenied`` (the native port's ``"denied"`` status).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import msgpack

from consensus.auth import (
    ADMIN,
    ENVELOPE_MAGIC,
    ENVELOPE_OVERHEAD,
    AuthorizingMachine,
    Denied,
    PermissionDenied,
    Principal,
    sealer,
    session_id,
)
from consensus.codec import (
    MAX_OP_BYTES,
    FrameReader,
    decode_frame,
    decode_record,
    encode_frame,
    encode_record,
    frame_to_wire,
)
from consensus.errors import (
    DecodeError,
    DefiniteFailure,
    IndefiniteFailure,
    LocalProtocolError,
    MemberRefused,
    MemberRemoved,
    SDPaxosError,
    SessionExpired,
)
from consensus.messages import Command, Record, SnapshotChunk
from consensus.protocol.admission import check_frame
from consensus.protocol.base import DrivenCore
from consensus.protocol.membership import Change, MemberReplica, encode_change
from consensus.protocol.ready import SLOT_STRIDE, Execution, Outgoing, Ready
from consensus.protocol.registry import load_core
from consensus.protocol.sdpaxos import VIEW_SPAN, SDPaxosReplica
from consensus.protocol.types import SnapshotMeta
from consensus.runtime.client_protocol import (
    ClientRequest,
    ClientResponse,
    Status,
    decode_partition,
    decode_request,
    ok_response_wire,
)
from consensus.runtime.cluster_config import ClusterConfig
from consensus.runtime.conn_limits import ClientPortLimits, Tracked
from consensus.runtime.framing import frames_by_peer
from consensus.runtime.histogram import Histogram
from consensus.runtime.logs import RateLimited
from consensus.runtime.members import address_text, info_of_spec, known_members
from consensus.runtime.snapshot_writer import (
    InFlight,
    SnapshotWriter,
    capture_state,
    prepared_restore,
    release_gradually,
)
from consensus.runtime.status import membership_status, replica_status
from consensus.runtime.tls import Revocations, TlsServer, accept_tls, start_server
from consensus.runtime.transport import PeerTransport
from consensus.sessions import (
    LOG_TIME_STAGGERS,
    OPEN_BY_SHIFT,
    OPEN_WINDOW_S,
    SESSION_EXPIRED,
    SESSION_MARK,
    SessionTable,
    denied_reason,
    is_log_time_op,
    log_time_command,
)
from consensus.statemachine import DefersQueries, StateMachine, batch_applier
from consensus.storage.identity import KnownMembers, mark_removed, open_identity
from consensus.storage.snapshot import (
    decode_snapshot,
    encode_snapshot,
    latest_snapshot,
    write_snapshot,
)
from consensus.storage.wal import WriteAheadLog

#: a snapshot is sent to the same peer again only after this long (unless a newer one exists)
SNAPSHOT_RESEND_S = 1.0
#: bytes of snapshot per SnapshotChunk (the codec caps a bin field at 1 MiB)
SNAPSHOT_CHUNK = 512 << 10
#: linearizable reads taken into one loop turn at most (later requests wait for the next
#: turns): a turn's length is how long a peer's message waits behind this replica's clients
#: (above all, a read request at the sequencer, which closed-loop readers keep busy). Writes
#: are not counted: a turn's writes go out as one C-instance, and fewer, bigger instances are
#: what keeps the sequencer's ordering work small.
MAX_READS_PER_TURN = 128
#: applying a turn's commands yields to the loop every this many seconds (checked every
#: APPLY_CHECK_EVERY commands)
APPLY_SLICE_S = 0.01
APPLY_CHECK_EVERY = 256
#: the event-loop lag probe's period (``NodeStats.longest_stall_s``)
LAG_PROBE_S = 0.02
#: default: a snapshot once this many commands were applied since the last one
SNAPSHOT_EVERY = 100_000
#: a snapshot at least every this many slots, whatever the commands per slot: a restart that
#: lost what it executed (a new disk, a power loss before the lazy records' fsync) learns
#: again only what lies beyond its snapshot, and a view change reports at most
#: ``sdpaxos.VIEW_SPAN`` slots a vote (lightly loaded, every command is a slot of its own)
SNAPSHOT_MAX_SLOTS = VIEW_SPAN
#: default: a snapshot once this many bytes went into the write-ahead log since the last one
SNAPSHOT_LOG_BYTES = 256 << 20
#: default: a snapshot at least this often while commands are applied (seconds)
SNAPSHOT_INTERVAL_S = 600.0

#: bytes of a backup per ``"backup-chunk"`` answer (a client frame holds it easily)
BACKUP_CHUNK = 512 << 10
#: backups a replica keeps for chunked reading (a newer one drops the oldest)
BACKUPS_KEPT = 2

#: a stopping replica waits this long for its client connections to close before it cuts them
CLIENT_CLOSE_S = 1.0

#: a client's session may not open later than this after the replica's clock (or the log
#: time, if later): tombstones of evicted sessions are kept until their open-by time
MAX_OPEN_AHEAD_S = 10 * OPEN_WINDOW_S
#: a replica proposes a log-time command at most this often (seconds)
LOG_TIME_RETRY_S = 1

#: TLS: the longest op a client may send (its principal's envelope must fit the codec's limit)
_MAX_SEALED_OP = MAX_OP_BYTES - ENVELOPE_OVERHEAD

__all__ = ["NodeStats", "ReplicaNode", "Result"]

_T = TypeVar("_T")

log = logging.getLogger("sdpaxos.node")


@dataclass(frozen=True, slots=True)
class Result:
    """A completed command: the state machine's answer and the command's log position
    (-1 for a blind write acknowledged when ready, before it executed)."""

    value: bytes
    position: int


@dataclass(slots=True)
class NodeStats:
    turns: int = 0
    commands_applied: int = 0
    fsyncs: int = 0
    fsync_seconds: float = 0.0
    bad_frames: int = 0
    snapshots_taken: int = 0
    snapshots_installed: int = 0
    #: the longest a snapshot held the event loop at once (seconds): the capture or the
    #: install (the log's rewrite) of one of our own, the core's install of a peer's and its
    #: state's adoption; the files' writing and a peer's snapshot's decoding and building
    #: being off the loop
    longest_snapshot_hold_s: float = 0.0
    #: ... the CPU time the loop's thread spent in it (seconds: the rest is waiting for the
    #: disk, or for the CPU on a busy machine) ...
    longest_snapshot_cpu_s: float = 0.0
    #: ... and the longest rewrite of the write-ahead log after one (seconds: fsyncs)
    longest_log_rewrite_s: float = 0.0
    #: the longest loop turn (seconds), yields to the event loop included
    longest_turn_s: float = 0.0
    #: the longest piece of this replica's own work between two yields to the event loop
    #: (seconds): a loop turn's part, a slice of its applying, a frame's decoding
    longest_busy_s: float = 0.0
    #: the longest the event loop was held by anything (seconds, ``LAG_PROBE_S`` resolution):
    #: how long a peer's frame, a client or /metrics waited at most to be read
    longest_stall_s: float = 0.0
    #: slots executed again from the records at start, and how long that took (seconds)
    replayed_slots: int = 0
    replay_seconds: float = 0.0
    #: peer frames dropped by admission (``consensus.protocol.admission``), by rejection kind
    peer_frames_rejected: dict[str, int] = field(default_factory=dict)
    #: peers whose frames admission rejected (each is logged once)
    rejected_peers: set[int] = field(default_factory=set)
    #: seconds from proposal to answer of the commands led here: blind writes answered
    #: when ready, the others once executed (``/metrics``: sdpaxos_commit_latency_seconds)
    ready_latency: Histogram = field(default_factory=Histogram)
    executed_latency: Histogram = field(default_factory=Histogram)
    #: seconds per fsync of the write-ahead log, per loop turn, and per turn's applying of
    #: its committed commands (the turns that applied any; yields to the loop excluded)
    fsync_latency: Histogram = field(default_factory=Histogram)
    turn_latency: Histogram = field(default_factory=Histogram)
    apply_latency: Histogram = field(default_factory=Histogram)
    #: peer messages handed to the transport and taken from it (admitted), by message class
    messages_sent: dict[type, int] = field(default_factory=dict)
    messages_received: dict[type, int] = field(default_factory=dict)
    #: times the core's view moved on while this node ran
    view_changes: int = 0
    #: commands led here answered ``SessionExpired`` (their session was evicted or closed),
    #: and log-time commands this replica proposed
    sessions_expired: int = 0
    log_times_proposed: int = 0


class _Prepared:
    """A peer's snapshot made ready by the worker: its meta, and what makes its state the
    state machine's (``take``n once: the one reference to it, so that it is let go of
    where the node decides)."""

    __slots__ = ("_adopt", "meta")

    def __init__(self, meta: SnapshotMeta, adopt: Callable[[], object]) -> None:
        self.meta = meta
        self._adopt: Callable[[], object] | None = adopt

    def take(self) -> Callable[[], object]:
        adopt, self._adopt = self._adopt, None
        assert adopt is not None
        return adopt


class _ClientConnection:
    """Answers for one client connection, written once per loop turn."""

    __slots__ = ("out", "principal", "sealer", "serial", "tracked", "writer")

    def __init__(self, writer: asyncio.StreamWriter, tracked: Tracked) -> None:
        self.writer = writer
        #: TLS: who the client's certificate names, and its serial
        self.principal: Principal | None = None
        self.sealer = b""  # what goes in front of its every op (consensus.auth.sealer)
        self.serial = -1
        self.out: list[bytes] = []
        #: its record in the client port's limits (outstanding requests, deadlines)
        self.tracked = tracked


#: Who waits for a request: an in-process caller's future, or (connection, request id).
Waiter = asyncio.Future[Any] | tuple[_ClientConnection, int]


class ReplicaNode:
    def __init__(
        self,
        config: ClusterConfig,
        me: int,
        state_machine: StateMachine,
        *,
        fsync: bool = True,
        tick_us: int | None = None,
        seed: int | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
        snapshot_bytes: int = SNAPSHOT_LOG_BYTES,
        snapshot_interval_s: float = SNAPSHOT_INTERVAL_S,
        snapshot_on_stop: bool = True,
        fault_injection: bool = False,
        bootstrap: bool = True,
        snapshot_off_loop: bool = True,
    ) -> None:
        """``bootstrap``: an empty data directory is a new cluster's replica (it gets an
        identity); False refuses one (``MissingIdentity``: ``serve`` without
        ``--initial-cluster-state new``). Either way peers refuse a directory that was wiped
        after it met them (``consensus.storage.identity``). ``snapshot_off_loop``: periodic
        snapshots are written by a worker thread (``consensus.runtime.snapshot_writer``);
        False takes them whole on the loop (benchmarks compare the two)."""
        self.config = config
        self.fault_injection = fault_injection
        self.me = me
        self.state_machine = state_machine
        self._apply_batch = batch_applier(state_machine)  # runs of a slot at once (_apply)
        table = getattr(state_machine, "sessions", None)
        #: the state machine's session table (``consensus.sessions``), if it keeps one: this
        #: replica proposes the log-time commands it needs
        self.sessions = table if isinstance(table, SessionTable) else None
        self._log_time_proposed = 0  # the clock reading of our last log-time command
        self.fsync = fsync
        self.stats = NodeStats()
        #: a snapshot is taken once any of these is reached since the last one: commands
        #: applied, bytes appended to the write-ahead log, seconds (with something applied).
        #: Bytes and time bound what a restart reads and executes again whatever the
        #: commands' sizes and the load.
        self.snapshot_every = snapshot_every
        self.snapshot_bytes = snapshot_bytes
        self.snapshot_interval_s = snapshot_interval_s
        self.snapshot_on_stop = snapshot_on_stop
        self._logged_since_snapshot = 0
        self._last_snapshot_at = time.monotonic()
        self.snapshot_dir = config.replica_dir(me) / "snapshots"
        #: the latest snapshot (what a peer behind our compaction point is sent) and its meta
        self._snapshot: tuple[bytes, SnapshotMeta] | None = None
        #: peer -> (slot, monotonic time) of the snapshot last sent to it
        self._snapshot_sent: dict[int, tuple[int, float]] = {}
        self._applied_since_snapshot = 0
        self.snapshot_off_loop = snapshot_off_loop
        #: the snapshot being written off the loop (at most one)
        self._in_flight: InFlight | None = None
        #: a peer's snapshot being made ready off the loop (at most one): its bytes, and
        #: what the worker made of them
        self._install: tuple[bytes, Future[_Prepared]] | None = None
        self._incoming: dict[int, tuple[int, int, bytearray]] = {}  # src -> (slot, got, data)
        directory = config.replica_dir(me)
        self.identity = open_identity(directory, config.cluster_id, me, bootstrap=bootstrap)
        self.known_members = KnownMembers(directory)
        #: why a peer refused this replica (it stops: ``wait_failed`` raises it)
        self._refused: MemberRefused | None = None
        self.wal = WriteAheadLog(directory / "wal")
        #: writes snapshot files and prepares the log's rewrites off the loop
        self._snapshot_writer = SnapshotWriter(self.snapshot_dir, self.wal, f"snapshot-{me}")
        records = [decode_record(payload, lazy_batches=True) for payload in self.wal.recovered]
        meta = None
        found = latest_snapshot(self.snapshot_dir)
        if found is not None:
            data, meta, state = found
            self._snapshot = (data, meta)
            state_machine.restore(state)
        rng = random.Random(seed if seed is not None else time.time_ns() ^ me)
        factory = load_core(config.protocol_name)  # SDPaxos unless [protocol] name says
        # a member that joined later asks the cluster file's other replicas to learn the log;
        # every member publishes where it runs (its entry's addresses) through the log
        membership: dict[str, Any] = {
            "contacts": tuple(r.id for r in config.replicas if r.id != me),
            "info": info_of_spec(config.replica(me)).encode(),
        } if factory is MemberReplica else {}
        self.core: DrivenCore = factory(
            config.protocol, me, recovered=records, rng=rng, snapshot=meta, **membership
        )
        protocol = config.protocol
        self.tick_us = tick_us or max(1_000, min(protocol.heartbeat_us // 5, 10_000))
        tls = config.tls
        #: TLS: the revoked serials (``reload`` on SIGHUP), the client port's context and the
        #: state machine behind the principals' check
        self.revocations = tls.revocations() if tls is not None else Revocations(frozenset())
        self._client_tls = tls.server(me) if tls is not None else None
        self._authz = AuthorizingMachine(state_machine) if tls is not None else None
        #: the client port's connections, and the tasks serving them (a stop closes them and
        #: waits for their tasks: cancelled when the process ends, each logged an error)
        self._client_connections: set[_ClientConnection] = set()
        self._client_tasks: set[asyncio.Task[None]] = set()
        #: what peers and clients can make happen again and again, logged once an interval
        self._log = RateLimited(log)
        self.revocations.subscribe(self._revoked)
        self.transport = PeerTransport(
            cluster_id=config.cluster_id,
            me=me,
            addresses={r.id: r.address for r in config.replicas},
            one_way_us=config.delays_from(me),
            stamped=any(any(row) for row in config.one_way_us),
            on_frame=self._on_frame,
            max_connections=config.limits.peer_cap(len(config.replicas)),
            tls_server=tls.server(me) if tls is not None else None,
            tls_dialer=tls.dialer(me) if tls is not None else None,
            revocations=self.revocations,
            identity=(self.identity.incarnation, self.identity.token),
            admit=self.known_members.admit,
            on_refused=self._on_refused,
            max_handshakes=config.limits.peer_max_handshakes,
            handshake_timeout_s=config.limits.peer_handshake_timeout_s,
        )
        #: the client port's connection caps, idle/slow timeouts and buffer budget
        self.client_limits = ClientPortLimits(config.limits)
        self._events: list[tuple[str, object]] = []
        self._client_requests: list[tuple[str, Command]] = []  # from the client port
        self._wakeup = asyncio.Event()
        self._commands: dict[tuple[int, int], list[Waiter]] = defaultdict(list)
        self._reads: dict[tuple[int, int], list[Waiter]] = defaultdict(list)
        #: reads that are backup barriers (answered with a snapshot token, not a query)
        self._backup_keys: set[tuple[int, int]] = set()
        #: token -> a backup's snapshot bytes, kept for chunked reading (BACKUPS_KEPT)
        self._backups: dict[int, bytes] = {}
        self._backup_tokens = itertools.count(1)
        self._dirty: set[_ClientConnection] = set()
        self._proposed_at: dict[tuple[int, int], int] = {}
        self._client_server: asyncio.Server | TlsServer | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._lag_task: asyncio.Task[None] | None = None
        self._busy_since = 0.0  # when the piece of work under way began (longest_busy_s)
        #: one past the last slot applied to the state machine: the core's ``exec_slot`` once
        #: the turn that executed it is done (applying yields to the loop, so the core's runs
        #: ahead while a turn applies thousands of commands)
        self.executed_slot = 0
        self._stopping = False
        self._last_seen_view: tuple[int, object] = (-1, None)
        #: the membership configuration the transport was last told of
        self._known_config: object = None
        self._counted_view = self.core.view  # the view changes counted in NodeStats
        #: called with (position, command, result) after each command applies (watchers)
        self.on_apply: list[Callable[[int, Command, bytes], None]] = []
        #: peer -> time.monotonic() of its last frame (readiness: ``consensus.runtime.health``)
        self.peer_heard_at: dict[int, float] = {}
        if isinstance(self.core, MemberReplica):  # the log's members, not only the file's
            self._members_changed(self.core)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await self._replay()
        self._lag_task = asyncio.create_task(self._probe_lag(), name=f"lag-{self.me}")
        await self.transport.start()
        host, port = self.config.replica(self.me).client_address
        self._client_server = await start_server(self._serve_client, host, port,
                                                 tls=self._client_tls, name="client")
        self._loop_task = asyncio.create_task(self._run(), name=f"replica-{self.me}")

    def _busy_until_now(self) -> None:
        """A piece of work that began at ``_busy_since`` ends here (``longest_busy_s``)."""
        busy = time.perf_counter() - self._busy_since
        if busy > self.stats.longest_busy_s:
            self.stats.longest_busy_s = busy

    async def _probe_lag(self) -> None:
        """Measure how late a short timer fires: the longest stretch anything held the loop."""
        while not self._stopping:
            due = time.perf_counter() + LAG_PROBE_S
            await asyncio.sleep(LAG_PROBE_S)
            stall = time.perf_counter() - due
            if stall > self.stats.longest_stall_s:
                self.stats.longest_stall_s = stall

    async def _replay(self) -> None:
        """Apply what a restarted core executes again from its records (its first ``Ready``)
        before anything is served: one long step at start, instead of a first loop turn that
        peers and clients would wait behind."""
        started = self._busy_since = time.perf_counter()
        first_slot = self._snapshot[1].slot if self._snapshot is not None else 0
        await self._carry_out(self.core.ready(), _now_us())
        self._busy_until_now()
        self.stats.replay_seconds = time.perf_counter() - started
        self.stats.replayed_slots = self.core.exec_slot - first_slot
        if self.stats.commands_applied:
            log.info("replica %d: executed %d commands again from its records in %.2f s",
                     self.me, self.stats.commands_applied, self.stats.replay_seconds)

    async def __aenter__(self) -> ReplicaNode:
        """``async with ReplicaNode(...) as node``: started here, stopped on the way out."""
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._client_server is not None:
            self._client_server.close()
        if self._loop_task is not None:
            await asyncio.gather(self._loop_task, return_exceptions=True)
        if self._lag_task is not None:
            self._lag_task.cancel()
            await asyncio.gather(self._lag_task, return_exceptions=True)
        await self.transport.close()
        if not self.wal.closed:
            self._join_snapshot()
        self._snapshot_writer.close()
        if self.snapshot_on_stop and self._applied_since_snapshot and not self.wal.closed:
            # a clean stop leaves nothing to execute again: the restart reads the snapshot
            # (after a kill -9 the restart executes the log since the last snapshot again: _replay)
            self._take_snapshot()
        self.wal.close()
        for key in list(self._commands):
            self._fail(key, IndefiniteFailure("replica shutting down"), reads=False)
        for key in list(self._reads):
            self._fail(key, IndefiniteFailure("replica shutting down"), reads=True)
        await self._close_clients()

    async def _close_clients(self) -> None:
        """Answer what the clients still wait for (it failed: the replica stops), close their
        connections and let the tasks serving them end by themselves (a task left to the end
        of the process is cancelled, and asyncio logs that as an error, one per client)."""
        self._answer_clients()
        for connection in self._client_connections:
            connection.writer.close()
        if self._client_tasks:
            _, late = await asyncio.wait(self._client_tasks, timeout=CLIENT_CLOSE_S)
            for connection in self._client_connections:  # (a TLS close waits for its peer)
                connection.writer.transport.abort()
            if late:
                await asyncio.wait(late)

    # ------------------------------------------------------------------ embedded API
    async def submit(self, command: Command, *, principal: Principal | None = None) -> Result:
        """Propose ``command``; its result once executed (blind: once ready). ``principal``:
        on whose behalf (TLS: checked as the command applies, ``PermissionDenied``)."""
        if principal is not None:
            command = _sealed(command, principal)
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._commands[(command.client_id, command.seq)].append(future)
        self._post("cmd", _unblind(command))
        return await future

    async def change_members(self, change: Change, *, client_id: int, seq: int) -> str:
        """Propose a membership change (``consensus.protocol.membership``); its answer once
        it executed: "ok: ..." or "refused: ..." (``DefiniteFailure`` if refused at once)."""
        command = Command(client_id=client_id, seq=seq, op=encode_change(change), keys=())
        return (await self.submit(command)).value.decode()

    def members(self) -> dict[str, Any] | None:
        """The live member set as this replica's log has it (``consensus.runtime.status``)."""
        return membership_status(self)

    async def read(
        self, command: Command, *, stale: bool = False, principal: Principal | None = None
    ) -> bytes:
        """A linearizable read through the sequencer (``stale=True``: local, possibly old).
        ``principal``: on whose behalf (checked as the read is answered)."""
        if principal is not None:
            command = _sealed(command, principal)
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._reads[(command.client_id, command.seq)].append(future)
        self._post("stale" if stale else "read", command)
        return (await future).value

    def _post(self, kind: str, item: object) -> None:
        self._events.append((kind, item))
        self._wakeup.set()

    # ------------------------------------------------------------------ network input
    def _on_frame(self, peer: int, payload: bytes) -> None:
        self._busy_since = time.perf_counter()
        self.peer_heard_at[peer] = time.monotonic()
        try:
            self._take_frame(peer, payload)
        finally:
            self._busy_until_now()

    def _take_frame(self, peer: int, payload: bytes) -> None:
        try:
            messages = decode_frame(payload, lazy_batches=True)
        except DecodeError as exc:
            self.stats.bad_frames += 1
            self._log.warning(f"bad frame {peer}", "dropping a bad frame from replica %d "
                              "(counted in sdpaxos_bad_frames_total): %s", peer, exc)
            return
        # every id, index, slot, view and ballot against the configuration and the core's
        # state, and src against the peer the handshake named: one bad message drops it all
        if isinstance(self.core, MemberReplica):  # each message against its epoch's core
            rejection = self.core.check_frame(messages, peer)
        else:
            rejection = check_frame(messages, self.core, self.config.protocol.replicas,
                                    sender=peer, protocol=self.config.protocol_name)
        if rejection is not None:
            rejected = self.stats.peer_frames_rejected
            rejected[rejection.kind] = rejected.get(rejection.kind, 0) + 1
            if peer not in self.stats.rejected_peers:
                self.stats.rejected_peers.add(peer)
                log.warning("dropping frames from replica %d that fail admission (logged once "
                            "per peer; counted in sdpaxos_peer_frames_rejected_total): %s",
                            peer, rejection)
            return
        received = self.stats.messages_received
        for message in messages:
            kind = type(message)
            received[kind] = received.get(kind, 0) + 1
        chunks = [m for m in messages if isinstance(m, SnapshotChunk)]
        for chunk in chunks:
            self._on_snapshot_chunk(chunk)
        if chunks:
            messages = [m for m in messages if not isinstance(m, SnapshotChunk)]
        if messages:
            self._post("msgs", messages)

    # ------------------------------------------------------------------ the loop
    async def wait_failed(self) -> None:
        """Returns (raising its error) only if the replica's loop died: the caller must stop
        the process rather than keep a replica that accepts connections and does nothing."""
        assert self._loop_task is not None
        await asyncio.shield(self._loop_task)

    @property
    def serving(self) -> bool:
        """The log is replayed and the loop runs, not stopping (``consensus.runtime.health``)."""
        task = self._loop_task
        return task is not None and not task.done() and not self._stopping

    @property
    def loop_died(self) -> bool:
        """The loop ended while nobody stopped the replica (it raised, or a peer refused it)."""
        task = self._loop_task
        return task is not None and task.done() and not self._stopping

    @property
    def sdpaxos(self) -> SDPaxosReplica | None:
        """The SDPaxos core of the current epoch (None for a baseline core, or while this
        member learns)."""
        core = self.core
        if isinstance(core, MemberReplica):
            return core.core
        return core if isinstance(core, SDPaxosReplica) else None

    def _members_changed(self, core: MemberReplica) -> None:
        """Follow the log's member set (``consensus.runtime.members``): connect to members
        that joined or published another peer address, forget the ones that left (ids below
        ``next_id`` that are no member: a removed one never comes back)."""
        config = self._known_config = core.config
        transport, files = self.transport, {r.id: r for r in self.config.replicas}
        delays = self.config.delays_from(self.me)
        for member in known_members(config, files):
            info = member.info
            if member.id == self.me or info is None:
                continue
            if transport.addresses.get(member.id) != info.address:
                log.info("replica %d: member %d runs at %s", self.me, member.id,
                         address_text(info.address))
                transport.add_peer(member.id, info.address, delays.get(member.id, 0))
        for peer in sorted(transport.addresses):
            if peer != self.me and peer < config.next_id and config.member(peer) is None:
                log.info("replica %d: member %d left the cluster (epoch %d); no longer "
                         "connecting to it", self.me, peer, config.epoch)
                transport.remove_peer(peer)

    def _removed(self, core: MemberReplica) -> MemberRemoved:
        """A change removed this replica: say so, and mark its directory so that it never
        serves again (``consensus.storage.identity``); the loop stops with the error."""
        error = MemberRemoved(self.me, self.config.cluster_id, core.config.epoch)
        log.warning("replica %d: removed from the cluster at epoch %d (the members are now %s): "
                    "it stops serving and will not start again with this data directory",
                    self.me, core.config.epoch, [m.id for m in core.config.members])
        self.identity = mark_removed(self.config.replica_dir(self.me), self.identity,
                                     core.config.epoch)
        return error

    def _on_refused(self, peer: int, reason: str) -> None:
        """A peer refuses our identity: stop, rather than serve with no vote (and no hope)."""
        if self._refused is None:
            self._refused = MemberRefused(peer, reason)
            self._wakeup.set()

    async def _run(self) -> None:
        try:
            await self._loop()
        except (MemberRefused, MemberRemoved):
            raise  # not a bug: ``serve`` says why and exits
        except Exception:
            log.exception("replica %d: event loop failed", self.me)
            raise

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = 0
        while not self._stopping:
            if self._refused is not None:
                raise self._refused
            if not self._events and not self._client_requests:
                # whole milliseconds, rounded up: the loop's timers are millisecond-grained
                # and fire at once for less, which spun the loop until the tick was due
                timeout = math.ceil(max(0, next_tick - _now_us()) / 1000) / 1000
                timer = loop.call_later(timeout, self._wakeup.set)
                await self._wakeup.wait()
                timer.cancel()
            else:
                await asyncio.sleep(0)  # a turn never yields: let the sockets be read first
            self._wakeup.clear()
            started = self._busy_since = time.perf_counter()
            if self._install is not None and self._install[1].done():
                await self._install_snapshot()
            now = _now_us()
            events, self._events = self._events, []
            events += self._take_client_requests()
            self._feed(events, now)
            if now >= next_tick:
                self.core.tick(now)
                self._propose_log_time(now)
                next_tick = now + self.tick_us
            await self._carry_out(self.core.ready(), now)
            self._busy_until_now()
            turn = time.perf_counter() - started
            self.stats.turn_latency.observe(turn)
            if turn > self.stats.longest_turn_s:
                self.stats.longest_turn_s = turn
            core = self.core
            if core.view != self._counted_view:
                self._counted_view = core.view
                self.stats.view_changes += 1
            inner = self.sdpaxos
            if inner is not None and (core.view, inner.role) != self._last_seen_view:
                self._last_seen_view = (core.view, inner.role)
                log.info(
                    "replica %d: view %d, role %s, sequencer %d, executed through slot %d",
                    self.me, core.view, inner.role.value, getattr(core, "sequencer", 0),
                    core.executed_through(),
                )
            if isinstance(core, MemberReplica):
                if core.config is not self._known_config:
                    self._members_changed(core)
                if core.removed:  # (a restart finds it so if it stopped before it said so)
                    raise self._removed(core)

    def _take_client_requests(self) -> list[tuple[str, Command]]:
        """This turn's client requests, in arrival order, up to ``MAX_READS_PER_TURN`` reads."""
        requests = self._client_requests
        reads = 0
        for taken, (kind, _) in enumerate(requests):
            if kind != "cmd":
                reads += 1
                if reads > MAX_READS_PER_TURN:
                    self._client_requests = requests[taken:]
                    return requests[:taken]
        self._client_requests = []
        return requests

    def _feed(self, events: list[tuple[str, object]], now: int) -> None:
        core = self.core
        for kind, item in events:
            if kind == "msgs":
                assert isinstance(item, list)
                for message in item:
                    core.step(message, now)
                continue
            if kind == "snapshot":
                assert isinstance(item, bytes)
                self._receive_snapshot(item)
                continue
            command = item
            assert isinstance(command, Command)
            key = (command.client_id, command.seq)
            try:
                if kind == "cmd":
                    self._proposed_at.setdefault(key, now)
                    core.propose(command, now)
                elif kind == "read":
                    core.read(command, now)
                else:
                    core.read_stale(command, now)
            except LocalProtocolError as exc:
                self._fail(key, DefiniteFailure(str(exc)), reads=kind != "cmd")

    async def _carry_out(self, ready: Ready, now: int) -> None:
        self.stats.turns += 1
        self._send(ready.send)
        in_flight = self._in_flight  # what is logged meanwhile goes into its log's rewrite
        for record in itertools.chain(ready.persist, ready.log):
            payload = encode_record(record)
            self._logged_since_snapshot += len(payload)
            self.wal.append(payload)
            if in_flight is not None:
                in_flight.logged.append(payload)
        if ready.persist:
            # fsync on the loop itself: handing it to a thread let the loop read sockets
            # meanwhile, but waking an idle worker thread and then the loop cost more (about
            # 0.5 ms a turn on an idle replica) than the fsync; the next turn waits anyway.
            self.wal.sync(fsync=self.fsync)
            self.stats.fsyncs += 1
            self.stats.fsync_seconds += self.wal.last_sync_seconds
            self.stats.fsync_latency.observe(self.wal.last_sync_seconds)
        elif ready.log:
            self.wal.sync(fsync=False)  # written; the next fsync makes it durable
        ready_latency = self.stats.ready_latency
        for command in ready.ready:
            if command.blind:
                self._complete((command.client_id, command.seq), _READY, now, ready_latency)
        self._answer_clients()  # ready writes wait for neither the acks nor the state machine
        self._send(ready.send_after_persist)
        if ready.apply:
            await self._apply(ready.apply, now)
        self.executed_slot = self.core.exec_slot  # applied, every command of it
        for command in ready.reads:
            key = (command.client_id, command.seq)
            waiters = self._reads.pop(key, [])
            if key in self._backup_keys:
                self._backup_keys.discard(key)
                if waiters:
                    self._take_backup(waiters)
            elif waiters:
                self._answer_read(command.op, waiters)
        for failure in ready.failed:
            key = (failure.command.client_id, failure.command.seq)
            error = DefiniteFailure if failure.definite else IndefiniteFailure
            self._fail(key, error(failure.reason), reads=False)
        for command, answer in ready.results:  # membership changes: the core answered
            self._complete((command.client_id, command.seq), Result(answer, -1), now,
                           self.stats.executed_latency)
        for peer in sorted(set(ready.snapshot_requests)):
            self._send_snapshot(peer)
        self.core.advance(ready)
        self._applied_since_snapshot += len(ready.apply)
        self._snapshot_turn(ready.snapshot_now)
        self._answer_clients()

    async def _apply(self, executions: Sequence[Execution], now: int) -> None:
        """Apply a turn's executions in order, answering the clients of those led here.

        Runs of one slot's consecutive commands go to the state machine at once
        (``_apply_run``), unless commands are authorized one by one or hooks watch each of
        them (``_apply_each``: they may read the state each command left). Either way the
        results are those of ``apply`` command by command."""
        one_by_one = self._authz is not None or bool(self.on_apply)
        slices = _ApplySlices(self)
        start, total = 0, len(executions)
        while start < total:
            if start:
                await slices.pause_if_due()
            if one_by_one:
                stop = min(total, start + APPLY_CHECK_EVERY)
                self._apply_each(executions[start:stop], now)
            else:
                stop = _run_end(executions, start)
                self._apply_run(executions[start:stop], now)
            start = stop
        slices.done()

    def _apply_run(self, run: Sequence[Execution], now: int) -> None:
        """Consecutive commands of one slot, to the state machine at once (``batch_applier``:
        its ``apply_batch``, or ``apply`` in a loop)."""
        slot, first = run[0][0], run[0][1]
        position = slot * SLOT_STRIDE + first  # Execution.position of the run's first
        results = self._apply_batch(position, [execution[2] for execution in run])
        self.stats.commands_applied += len(run)
        complete, executed_latency = self._complete, self.stats.executed_latency
        for offset, (execution, result) in enumerate(zip(run, results, strict=True)):
            command = execution[2]
            if execution[3] and not command.blind:  # led here, answered after it ran
                if result is SESSION_EXPIRED:
                    self._session_expired(command)
                    continue
                complete((command.client_id, command.seq),
                         Result(result, position + offset), now, executed_latency)

    def _apply_each(self, executions: Sequence[Execution], now: int) -> None:
        """Commands one at a time: each authorized, each seen by the hooks."""
        apply = self.state_machine.apply
        stats, authz, hooks = self.stats, self._authz, self.on_apply
        executed_latency = stats.executed_latency
        for slot, offset, command, led_here in executions:
            position = slot * SLOT_STRIDE + offset  # Execution.position
            if authz is not None:
                outcome = authz.run(position, command)
                if isinstance(outcome, Denied):  # nothing changed: no hooks
                    stats.commands_applied += 1
                    if led_here:
                        key = (command.client_id, command.seq)
                        self._fail(key, PermissionDenied(outcome.reason), reads=False)
                    continue
                result = outcome
            else:
                result = apply(position, command)
            stats.commands_applied += 1
            for hook in hooks:
                hook(position, command, result)
            if led_here and not command.blind:
                if result is SESSION_EXPIRED:
                    self._session_expired(command)
                    continue
                key = (command.client_id, command.seq)
                self._complete(key, Result(result, position), now, executed_latency)

    def _answer_read(self, op: bytes, waiters: list[Waiter]) -> None:
        """Answer a read now (every command of the turn applied), or, for one the state
        machine answers off the loop (``DefersQueries``), from what it reads now, once the
        worker made the answer."""
        machine, authz = self.state_machine, self._authz
        if authz is not None:
            later = authz.ask_later(op)
        else:
            later = machine.defer_query(op) if isinstance(machine, DefersQueries) else None
        if later is None:
            answered = machine.query(op) if authz is None else authz.ask(op)
            self._answered(waiters, answered)
        elif isinstance(later, Denied):
            self._answered(waiters, later)
        else:
            def made(work: Future[bytes]) -> None:
                answer = self._made(work, "a read")
                if authz is not None and isinstance(answer, bytes):
                    answer = authz.filtered(op, answer)
                self._answered(waiters, answer, now=False)

            self._when_done(self._snapshot_writer.submit(later), made)

    def _made(self, work: Future[_T], what: str) -> _T | IndefiniteFailure:
        """What the worker made, or the failure its waiters get (a bug: logged)."""
        try:
            return work.result()
        except Exception as exc:
            log.error("replica %d: %s failed off the loop: %r", self.me, what, exc)
            return IndefiniteFailure(f"{what} failed at replica {self.me}: {exc!r}")

    def _answered(self, waiters: list[Waiter], answered: bytes | Denied | SDPaxosError, *,
                  now: bool = True) -> None:
        """Resolve a read's waiters (``now=False``: outside a turn, so written at once)."""
        outcome: Result | SDPaxosError = (
            PermissionDenied(answered.reason) if isinstance(answered, Denied)
            else answered if isinstance(answered, SDPaxosError) else Result(answered, -1))
        for waiter in waiters:
            self._resolve(waiter, outcome)
        if not now:
            self._answer_clients()

    def _session_expired(self, command: Command) -> None:
        """``command``, led here, was not applied: its session is gone (``SessionExpired``,
        with the log time, from which its client opens the next one)."""
        self.stats.sessions_expired += 1
        log_time = self.sessions.now if self.sessions is not None else 0
        self._fail((command.client_id, command.seq), SessionExpired(
            f"session expired: request ({command.client_id}, {command.seq}) was not applied "
            f"(its session was evicted, closed, or opened too late; log time {log_time})",
            log_time), reads=False)

    def _propose_log_time(self, now: int) -> None:
        """Propose a log-time command if the session table needs the log time to move
        (``SessionTable.time_due``; replicas take turns: ``LOG_TIME_STAGGERS``)."""
        table = self.sessions
        if table is None:
            return
        clock = int(time.time())
        if clock < self._log_time_proposed + LOG_TIME_RETRY_S:
            return  # ours is on its way (or was refused: a learner)
        if not table.time_due(clock - self.me % LOG_TIME_STAGGERS):
            return
        self._log_time_proposed = clock
        self.stats.log_times_proposed += 1
        with contextlib.suppress(LocalProtocolError):
            self.core.propose(log_time_command(clock), now)

    def _answer_clients(self) -> None:
        """Write each client connection's answers of this turn in one go."""
        for connection in self._dirty:
            if not connection.writer.is_closing():
                connection.writer.write(b"".join(connection.out))
            connection.out.clear()
        self._dirty.clear()

    # ------------------------------------------------------------------ snapshots
    def _snapshot_due(self) -> bool:
        applied = self._applied_since_snapshot
        if applied == 0:
            return False  # nothing new to cover (the log may still grow: votes, promises)
        base = self._snapshot[1].slot if self._snapshot is not None else 0
        return (
            applied >= self.snapshot_every
            or self.core.exec_slot - base >= SNAPSHOT_MAX_SLOTS
            or self._logged_since_snapshot >= self.snapshot_bytes
            or time.monotonic() - self._last_snapshot_at >= self.snapshot_interval_s
        )

    def _snapshot_turn(self, now: bool) -> None:
        """A turn's end: install the snapshot written meanwhile once it is durable, then take
        one if the core wants one now (whole, on the loop: a promoted learner's core starts
        only once it is durable) or one is due (off the loop, unless one is in flight)."""
        if self._in_flight is not None and self._in_flight.done.done():
            self._finish_snapshot()
        if now:
            self._take_snapshot()
        elif self._in_flight is None and self._snapshot_due():
            if self.snapshot_off_loop:
                self._start_snapshot()
            else:
                self._take_snapshot()

    def _take_snapshot(self) -> None:
        """Snapshot the state machine at the execution frontier, compact the core to the
        *previous* snapshot and rewrite the write-ahead log to what the new one does not cover,
        all on the loop (a snapshot in flight is installed first).
        The core's memory keeps the last interval, so a peer a little behind catches up from
        it: compacting to the new one made every peer that lagged by a few slots ask for the
        whole state (a third of a loaded replica's CPU went into sending, receiving and
        installing snapshots)."""
        self._join_snapshot()
        started = _clocks()
        meta = self.core.snapshot_meta()
        data = encode_snapshot(meta, self.state_machine.snapshot())
        write_snapshot(self.snapshot_dir, data, meta.slot)
        previous = self._snapshot
        self._snapshot = (data, meta)
        self._snapshot_taken()
        self._rewrite_log([encode_record(record) for record in self._log_after(previous)])
        log.info("replica %d: snapshot at slot %d, log compacted to slot %d", self.me, meta.slot,
                 previous[1].slot if previous else 0)
        self._snapshot_held(started)

    def _start_snapshot(self) -> None:
        """``_take_snapshot`` with the file written by the worker thread: only the capture
        runs here (``consensus.runtime.snapshot_writer``)."""
        started = _clocks()
        meta = self.core.snapshot_meta()
        state = capture_state(self.state_machine)
        # what the log must hold beyond the snapshot, as of now (the core compacts here)
        records = [encode_record(record) for record in self._log_after(self._snapshot)]
        # room in the log's new segment for what it takes in while this is written: as much
        # as the whole interval took (the writing takes a fraction of one)
        room = self._logged_since_snapshot
        in_flight = InFlight(meta, self._snapshot_writer.write(meta, state, records, room))
        self._in_flight = in_flight
        self._snapshot_taken()
        self._wake_when_done(in_flight.done)  # a turn installs it
        self._snapshot_held(started)

    def _finish_snapshot(self) -> None:
        """Install the snapshot in flight once it is durable (waiting for it if need be): peers
        are sent it from now on, and the log is rewritten to what it does not cover."""
        in_flight = self._in_flight
        assert in_flight is not None
        self._in_flight = None
        data, prepared = in_flight.done.result()  # what the writing raised, if it failed
        started = _clocks()
        previous = self._snapshot
        self._snapshot = (data, in_flight.meta)
        started_rewrite = time.perf_counter()
        self.wal.install_rewrite(prepared, in_flight.logged)
        self._rewrite_took(started_rewrite)
        log.info("replica %d: snapshot at slot %d, log compacted to slot %d", self.me,
                 in_flight.meta.slot, previous[1].slot if previous else 0)
        self._snapshot_held(started)

    def _join_snapshot(self) -> None:
        """Install the snapshot in flight, if any, waiting for its file (before anything else
        replaces the snapshot or rewrites the log)."""
        if self._in_flight is not None:
            self._finish_snapshot()

    def _log_after(self, previous: tuple[bytes, SnapshotMeta] | None) -> list[Record]:
        """Compact the core to the ``previous`` snapshot; the records the log must hold with a
        durable snapshot at the execution frontier. The first snapshot compacts nothing (no
        older one for peers a little behind), but the log still shrinks to what it does not
        cover: a restart then reads none of it."""
        if previous is None:
            return self.core.durable_records()
        return self.core.compact(previous[1])

    def _snapshot_taken(self) -> None:
        """A snapshot at the execution frontier was taken (captured, if off the loop): the
        next one counts from here."""
        self.stats.snapshots_taken += 1
        self._applied_since_snapshot = 0
        self._logged_since_snapshot = 0
        self._last_snapshot_at = time.monotonic()

    def _rewrite_log(self, payloads: list[bytes]) -> None:
        """The write-ahead log after a snapshot of ours: ``payloads`` alone (timed)."""
        started = time.perf_counter()
        self.wal.rewrite(payloads)
        self._rewrite_took(started)

    def _rewrite_took(self, started: float) -> None:
        """A rewrite of the log that began at ``started`` ended now (``longest_log_rewrite_s``)."""
        took = time.perf_counter() - started
        if took > self.stats.longest_log_rewrite_s:
            self.stats.longest_log_rewrite_s = took

    def _snapshot_held(self, started: tuple[float, float]) -> None:
        """A piece of a snapshot that began at ``started`` (``_clocks``) held the loop until
        now."""
        wall, cpu = _clocks()
        stats = self.stats
        stats.longest_snapshot_hold_s = max(stats.longest_snapshot_hold_s, wall - started[0])
        stats.longest_snapshot_cpu_s = max(stats.longest_snapshot_cpu_s, cpu - started[1])

    def _take_backup(self, waiters: list[Waiter]) -> None:
        """A backup of the state machine as of now (every command of the turn applied):
        captured here, encoded and hashed off the loop; its waiters are answered then with
        msgpack ``[token, size, sha256, slot]``, the token naming it for ``_backup_chunk``."""
        meta = self.core.snapshot_meta()
        state = capture_state(self.state_machine)

        def encode() -> tuple[bytes, str]:  # in the worker
            data = encode_snapshot(meta, state())
            return data, hashlib.sha256(data).hexdigest()

        def taken(work: Future[tuple[bytes, str]]) -> None:
            made = self._made(work, "a backup")
            if isinstance(made, IndefiniteFailure):
                self._answered(waiters, made, now=False)
                return
            data, digest = made
            token = next(self._backup_tokens)
            self._backups[token] = data
            while len(self._backups) > BACKUPS_KEPT:
                del self._backups[min(self._backups)]
            log.info("replica %d: backup %d taken at slot %d (%d bytes)", self.me, token,
                     meta.slot, len(data))
            answer: bytes = msgpack.packb([token, len(data), digest, meta.slot])
            self._answered(waiters, answer, now=False)

        self._when_done(self._snapshot_writer.submit(encode), taken)

    def _backup_chunk(self, request: ClientRequest) -> ClientResponse:
        try:
            token, offset = msgpack.unpackb(request.command.op, max_array_len=2, max_map_len=0)
        except Exception:
            token = offset = None
        if type(token) is not int or type(offset) is not int or offset < 0:
            return ClientResponse(request.req_id, "error", "a backup-chunk op is msgpack "
                                  "[token, offset] (non-negative ints)")
        data = self._backups.get(token)
        if data is None:
            return ClientResponse(request.req_id, "definite", f"backup {token} is no longer "
                                  "kept here (a newer one replaced it): take a new one")
        return ClientResponse(request.req_id, "ok", data[offset : offset + BACKUP_CHUNK])

    def _send_snapshot(self, peer: int) -> None:
        if self._snapshot is None:
            return
        data, meta = self._snapshot
        sent = self._snapshot_sent.get(peer)
        now = time.monotonic()
        if sent is not None and sent[0] == meta.slot and now - sent[1] < SNAPSHOT_RESEND_S:
            return  # on its way: the peer's requests meanwhile would each repeat it
        self._snapshot_sent[peer] = (meta.slot, now)
        for offset in range(0, len(data), SNAPSHOT_CHUNK):
            chunk = SnapshotChunk(
                src=self.me,
                view=self.core.view,
                slot=meta.slot,
                offset=offset,
                total=len(data),
                data=data[offset : offset + SNAPSHOT_CHUNK],
            )
            self.transport.send(peer, encode_frame([chunk]))

    def _on_snapshot_chunk(self, chunk: SnapshotChunk) -> None:
        slot, got, buffer = self._incoming.get(chunk.src, (-1, 0, bytearray()))
        if chunk.offset == 0:
            slot, got, buffer = chunk.slot, 0, bytearray()
        if chunk.slot != slot or chunk.offset != got or chunk.total > (1 << 34):
            self._incoming.pop(chunk.src, None)  # out of order: wait for the next offer
            return
        buffer += chunk.data
        got += len(chunk.data)
        if got >= chunk.total:
            self._incoming.pop(chunk.src, None)
            self._post("snapshot", bytes(buffer))
        else:
            self._incoming[chunk.src] = (slot, got, buffer)

    def _receive_snapshot(self, data: bytes) -> None:
        """A peer's snapshot arrived whole: the worker decodes it and builds its state beside
        the state machine's (``snapshot_writer.prepared_restore``) while this replica goes on
        as before; the first turn after that installs it (``_install_snapshot``). One at a
        time: a peer sends its snapshot again while it is still asked for."""
        if self._install is not None:
            return
        machine = self.state_machine

        def prepare() -> _Prepared:
            meta, state = decode_snapshot(data)
            return _Prepared(meta, prepared_restore(machine, state))

        future = self._snapshot_writer.submit(prepare)
        self._install = (data, future)
        self._wake_when_done(future)

    async def _install_snapshot(self) -> None:
        """Install the peer's snapshot made ready off the loop, if it is still of use: the
        core installs it and the state machine takes the state built for it (both at once,
        here); then the snapshot file and the log's rewrite to the core's new records are
        written by the worker while this replica's turns wait (nothing the installed core
        logs may reach the log before the snapshot it starts from is durable; the loop
        itself goes on reading sockets meanwhile)."""
        assert self._install is not None
        (data, ready), self._install = self._install, None
        try:
            prepared = ready.result()
        except Exception as exc:  # bytes from the network: a peer never crashes us
            log.warning("replica %d: ignoring a snapshot that does not load: %s", self.me, exc)
            return
        meta = prepared.meta
        if self._in_flight is not None:
            # ours first: it is compacted to, and the log rewritten, in order
            await self._off_loop(self._in_flight.done)
            self._finish_snapshot()
        replicas = self.config.protocol.replicas
        if isinstance(self.core, MemberReplica):
            if not self.core.accepts_snapshot(meta):
                self._let_go([prepared.take()])  # (the state built goes off the loop too)
                return
        elif meta.slot <= self.core.exec_slot or len(meta.exec_counts) != replicas:
            self._let_go([prepared.take()])
            return
        started = _clocks()
        # the core first: it may refuse a snapshot that lacks something it executed (EPaxos:
        # a peer's executed set may hold other independent instances), and then the state
        # machine must keep its own state
        records = self.core.install_snapshot(meta)
        if self.core.exec_slot < meta.slot:
            log.info("replica %d: the core refused a snapshot at slot %d", self.me, meta.slot)
            self._let_go([prepared.take()])
            return
        self._let_go([prepared.take()()])  # what the state machine's new state replaced
        payloads = [encode_record(record) for record in records]
        self._snapshot_held(started)

        def store() -> None:
            write_snapshot(self.snapshot_dir, data, meta.slot)  # durable before the log shrinks
            self.wal.rewrite(payloads)

        await self._off_loop(self._snapshot_writer.submit(store))
        self._snapshot = (data, meta)
        self.executed_slot = self.core.exec_slot
        self._applied_since_snapshot = self._logged_since_snapshot = 0
        self._last_snapshot_at = time.monotonic()
        self.stats.snapshots_installed += 1
        log.info("replica %d: installed a snapshot at slot %d", self.me, meta.slot)

    def _let_go(self, garbage: list[object]) -> None:
        """Free what ``garbage`` alone refers to in the worker, a part at a time
        (``snapshot_writer.release_gradually``: freed at once, a 98k-GPU store's replaced
        state held the loop 50-100 ms). The caller keeps no reference to it."""
        self._snapshot_writer.submit(functools.partial(release_gradually, garbage))

    async def _off_loop(self, work: Future[_T]) -> _T:
        """Wait for the worker's ``work`` in the middle of a turn: this replica's turns wait
        and the loop serves everything else."""
        self._busy_until_now()
        try:
            return await asyncio.wrap_future(work)
        finally:
            self._busy_since = time.perf_counter()

    def _wake_when_done(self, work: Future[Any]) -> None:
        """A turn runs once the worker finished ``work``."""
        self._when_done(work, lambda _: self._wakeup.set())

    def _when_done(self, work: Future[_T], then: Callable[[Future[_T]], None]) -> None:
        """``then(work)`` on the loop once the worker finished ``work``."""
        loop = asyncio.get_running_loop()

        def done(_: object) -> None:  # in the worker
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (stop joins)
                loop.call_soon_threadsafe(then, work)

        work.add_done_callback(done)

    def _send(self, outgoing: list[Outgoing]) -> None:
        sent = self.stats.messages_sent
        for out in outgoing:
            kind = type(out.message)
            sent[kind] = sent.get(kind, 0) + 1
        for peer, frames in frames_by_peer(outgoing, self.transport.max_frame).items():
            for frame in frames:
                self.transport.send(peer, frame)

    def _complete(
        self, key: tuple[int, int], result: Result, now: int, latency: Histogram
    ) -> None:
        if result.value.startswith(SESSION_MARK):  # it never executed: see session_refusal
            self._fail(key, session_refusal(result.value), reads=False)
            return
        started = self._proposed_at.pop(key, None)
        if started is not None:
            latency.observe((now - started) / 1e6)
        for waiter in self._commands.pop(key, ()):
            self._resolve(waiter, result)

    def _fail(self, key: tuple[int, int], error: SDPaxosError, *, reads: bool) -> None:
        self._proposed_at.pop(key, None)
        if reads:
            self._backup_keys.discard(key)  # a failed barrier leaves no backup waiting
        table = self._reads if reads else self._commands
        for waiter in table.pop(key, ()):
            self._resolve(waiter, error)

    def _resolve(self, waiter: Waiter, outcome: Result | SDPaxosError) -> None:
        if isinstance(waiter, tuple):
            connection, req_id = waiter
            self.client_limits.request_done(connection.tracked)
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

    # ------------------------------------------------------------------ client port
    def _partition(
        self, request: ClientRequest, principal: Principal | None = None
    ) -> ClientResponse:
        """The test-only fault layer: cut this replica off from some peers (one way or
        both)."""
        if not self.fault_injection:
            return ClientResponse(request.req_id, "error", "fault injection is disabled "
                                  "(sdpaxos serve --fault-injection)")
        if principal is not None and principal.role != ADMIN:
            return ClientResponse(request.req_id, "denied", "permission denied: only an admin "
                                  "may inject faults")
        try:
            cut = decode_partition(request.command.op, max(self.transport.addresses) + 1)
        except DecodeError as exc:
            return ClientResponse(request.req_id, "error", str(exc))
        log.warning("fault injection: dropping frames from replicas %s and to replicas %s",
                    sorted(cut.drop_from), sorted(cut.drop_to))
        self.transport.drop_from = cut.drop_from - {self.me}
        self.transport.drop_to = cut.drop_to - {self.me}
        return ClientResponse(request.req_id, "ok", b"")

    def _status(self, request: ClientRequest) -> ClientResponse:
        """What this replica reports about itself (``consensus.runtime.status``)."""
        return ClientResponse(request.req_id, "ok", msgpack.packb(replica_status(self)))

    async def _serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        limits = self.client_limits
        tracked = limits.open(writer.transport.abort)
        if tracked is None:
            writer.transport.abort()  # over the cap: counted and logged by the limits
            return
        frames = FrameReader(limits.config.client_max_frame_bytes)
        connection = _ClientConnection(writer, tracked)
        task = asyncio.current_task()
        assert task is not None
        self._client_connections.add(connection)
        self._client_tasks.add(task)
        try:
            if self._client_tls is not None and not await self._authenticate(connection):
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
                        request = decode_request(payload)
                    except DecodeError as exc:
                        writer.write(frame_to_wire(ClientResponse(0, "error", str(exc)).encode()))
                        continue
                    if request.kind == "partition":
                        writer.write(frame_to_wire(self._partition(request, principal).encode()))
                        continue
                    if request.kind == "status":
                        writer.write(frame_to_wire(self._status(request).encode()))
                        continue
                    if request.kind in ("backup", "backup-chunk"):
                        if principal is not None and principal.role != ADMIN:
                            writer.write(frame_to_wire(ClientResponse(
                                request.req_id, "denied", "backups are an admin's: "
                                f"{principal.describe()} may not take one").encode()))
                            continue
                        if request.kind == "backup-chunk":
                            writer.write(frame_to_wire(self._backup_chunk(request).encode()))
                            continue
                        key = (request.command.client_id, request.command.seq)
                        self._reads[key].append((connection, request.req_id))
                        self._backup_keys.add(key)
                        limits.request_started(tracked)
                        barrier = Command(client_id=key[0], seq=key[1], op=b"", keys=())
                        self._client_requests.append(("read", barrier))
                        continue
                    refusal = self._refusal(request)
                    if refusal is not None:
                        writer.write(frame_to_wire(ClientResponse(
                            request.req_id, "error", refusal).encode()))
                        continue
                    if principal is not None:
                        if len(request.command.op) > _MAX_SEALED_OP:
                            writer.write(frame_to_wire(ClientResponse(
                                request.req_id, "error", f"op over {_MAX_SEALED_OP} bytes (a "
                                "TLS cluster's commands carry their principal)").encode()))
                            continue
                        request = ClientRequest(request.req_id, request.kind, _sealed(
                            request.command, principal, connection.sealer))
                    key = (request.command.client_id, request.command.seq)
                    table = self._commands if request.kind == "cmd" else self._reads
                    table[key].append((connection, request.req_id))
                    limits.request_started(tracked)
                    self._client_requests.append((request.kind, _unblind(request.command)))
                self._wakeup.set()
        except DecodeError as exc:
            self._log.warning("bad client bytes", "closing client connection from %s: %s",
                              writer.get_extra_info("peername"), exc)
        except (OSError, ConnectionError):
            pass
        finally:
            writer.close()
            self._client_connections.discard(connection)
            self._client_tasks.discard(task)
            limits.closed(tracked)

    def _refusal(self, request: ClientRequest) -> str | None:
        """Why a client's command is refused before it is proposed (None: it is not): an op
        reserved for the replicas' log-time commands, or a session that would open too far
        ahead (its tombstone would be kept that long)."""
        if request.kind != "cmd":
            return None
        command = request.command
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

    async def _authenticate(self, connection: _ClientConnection) -> bool:
        """TLS: the handshake and the principal of the client's certificate (False: refused,
        logged saying why)."""
        assert self._client_tls is not None
        identity = await accept_tls(
            connection.writer, self._client_tls, port="client", cluster_id=self.config.cluster_id,
            revocations=self.revocations,
        )
        if identity is None:
            return False
        if identity.principal is None:
            log.warning("refusing client connection from %s: %s is no client",
                        connection.writer.get_extra_info("peername"), identity.describe())
            return False
        connection.principal = identity.principal
        connection.sealer = sealer(identity.principal)
        connection.serial = identity.serial
        return True

    def _revoked(self, serials: frozenset[int]) -> None:
        """Close the client connections of certificates just revoked."""
        for connection in list(self._client_connections):
            if connection.serial in serials:
                log.warning("closing the connection of a client whose certificate (serial %x) "
                            "was revoked", connection.serial)
                connection.writer.transport.abort()


def _sealed(command: Command, principal: Principal, prefix: bytes = b"") -> Command:
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


def _unblind(command: Command) -> Command:
    """``command`` answered once it executed if its session may be evicted: acknowledged
    when ready, it would be told "done" before the session table could refuse it
    (``consensus.sessions``; pinned sessions keep blind writes)."""
    if command.blind and command.seq >> OPEN_BY_SHIFT:
        return command._replace(blind=False)
    return command


#: what a blind write acknowledged when ready is answered with (the same for every one)
_READY: Final = Result(b"", -1)


def _run_end(executions: Sequence[Execution], start: int) -> int:
    """Where the run of one slot's consecutive commands from ``start`` ends (at most
    ``APPLY_CHECK_EVERY`` commands: a slice's check comes between runs)."""
    slot, first = executions[start][0], executions[start][1]
    stop, limit = start + 1, min(len(executions), start + APPLY_CHECK_EVERY)
    while (stop < limit and executions[stop][0] == slot
           and executions[stop][1] == first + stop - start):
        stop += 1
    return stop


class _ApplySlices:
    """A turn's applying, in slices of about ``APPLY_SLICE_S``: a catch-up (or a restart's
    replay) hands over thousands of commands at once, so the loop reads sockets and answers
    /metrics between slices and no callback holds it for long (what arrives waits for the
    next turn anyway). The time spent applying, yields excluded, goes to
    ``NodeStats.apply_latency``."""

    __slots__ = ("_applying", "_end", "_node", "_start")

    def __init__(self, node: ReplicaNode) -> None:
        self._node = node
        self._start = time.perf_counter()
        self._end = self._start + APPLY_SLICE_S
        self._applying = 0.0

    async def pause_if_due(self) -> None:
        """Let the loop run if this slice is over."""
        if time.perf_counter() <= self._end:
            return
        node = self._node
        node._busy_until_now()
        self._applying += time.perf_counter() - self._start
        await asyncio.sleep(0)
        node._busy_since = self._start = time.perf_counter()
        self._end = self._start + APPLY_SLICE_S

    def done(self) -> None:
        self._node.stats.apply_latency.observe(
            self._applying + time.perf_counter() - self._start)


def _clocks() -> tuple[float, float]:
    """Now, by the wall clock and by this thread's CPU time (seconds)."""
    return time.perf_counter(), time.thread_time()


def _now_us() -> int:
    return time.monotonic_ns() // 1000


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

