"""One replica as an asyncio service: ``ReplicaNode``, the facade that builds its parts and
starts and stops them.

The parts, each the only owner of its state:

* the turn loop (``consensus.runtime.turns``): the thin driver around the sans-I/O core —
  every turn hands the core what arrived, ticks it, and carries out its ``Ready`` (send,
  append and fsync, answer, apply, ``advance``);
* the inbox (``consensus.runtime.node_events``): the typed events queued for the next turn;
* the peer intake (``consensus.runtime.peer_intake``): peer frames decoded, admitted and
  posted, snapshot chunks put together, when each peer was last heard from;
* the snapshot pipeline (``consensus.runtime.snapshot_pipeline``): snapshots taken, written
  off the loop by the node's worker thread, sent to peers behind, a peer's installed, and
  backups; the worker also answers queries the state machine defers;
* the client port (``consensus.runtime.client_port``): who waits for which answer, and the
  client connections.

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
import logging
import random
import time
from collections.abc import Coroutine
from typing import Any

import msgpack

from consensus.auth import ADMIN, AuthorizingMachine, Principal
from consensus.codec import decode_record
from consensus.errors import DecodeError, IndefiniteFailure
from consensus.messages import Command
from consensus.protocol.base import DrivenCore
from consensus.protocol.membership import Change, MemberReplica, encode_change
from consensus.protocol.registry import load_core
from consensus.protocol.sdpaxos import SDPaxosReplica
from consensus.runtime.client_port import ClientPort, Result, sealed, unblind
from consensus.runtime.client_protocol import ClientRequest, ClientResponse, decode_partition
from consensus.runtime.cluster_config import ClusterConfig
from consensus.runtime.conn_limits import ClientPortLimits
from consensus.runtime.members import info_of_spec
from consensus.runtime.node_events import Inbox, Propose, Read, StaleRead
from consensus.runtime.node_stats import BusyClock, NodeStats
from consensus.runtime.peer_intake import PeerIntake
from consensus.runtime.snapshot_pipeline import SnapshotPipeline
from consensus.runtime.status import membership_status, replica_status
from consensus.runtime.tls import Revocations
from consensus.runtime.transport import PeerTransport
from consensus.runtime.turns import ApplyHook, TurnLoop, sdpaxos_of
from consensus.sessions import SessionTable
from consensus.statemachine import StateMachine
from consensus.storage.identity import KnownMembers, MemberIdentity, open_identity
from consensus.storage.snapshot import latest_snapshot
from consensus.storage.wal import WriteAheadLog

#: default: a snapshot once this many commands were applied since the last one
SNAPSHOT_EVERY = 100_000
#: default: a snapshot once this many bytes went into the write-ahead log since the last one
SNAPSHOT_LOG_BYTES = 256 << 20
#: default: a snapshot at least this often while commands are applied (seconds)
SNAPSHOT_INTERVAL_S = 600.0

__all__ = [
    "SNAPSHOT_EVERY",
    "SNAPSHOT_INTERVAL_S",
    "SNAPSHOT_LOG_BYTES",
    "NodeStats",
    "ReplicaNode",
    "Result",
]

log = logging.getLogger("sdpaxos.node")


class ReplicaNode:
    """One replica: builds its parts (see the module), starts and stops them, and offers the
    in-process API (``submit``, ``read``, ``change_members``)."""

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
        table = getattr(state_machine, "sessions", None)
        #: the state machine's session table (``consensus.sessions``), if it keeps one: this
        #: replica proposes the log-time commands it needs
        self.sessions = table if isinstance(table, SessionTable) else None
        self.fsync = fsync
        self.stats = NodeStats()
        busy = BusyClock(self.stats)
        self.inbox = Inbox()
        #: a clean stop takes a snapshot if anything was applied since the last one
        self.snapshot_on_stop = snapshot_on_stop
        self.snapshot_dir = config.replica_dir(me) / "snapshots"
        directory = config.replica_dir(me)
        identity = open_identity(directory, config.cluster_id, me, bootstrap=bootstrap)
        self.known_members = KnownMembers(directory)
        self.wal = WriteAheadLog(directory / "wal")
        records = [decode_record(payload, lazy_batches=True) for payload in self.wal.recovered]
        meta = latest = None
        found = latest_snapshot(self.snapshot_dir)
        if found is not None:
            data, meta, state = found
            latest = (data, meta)
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
        #: TLS: the revoked serials (``reload`` on SIGHUP)
        self.revocations = tls.revocations() if tls is not None else Revocations(frozenset())
        self.intake = PeerIntake(config, self.core, self.inbox, self.stats, busy)
        self.snapshots = SnapshotPipeline(
            me, self.snapshot_dir, wal=self.wal, core=self.core, machine=state_machine,
            replicas=protocol.replicas, inbox=self.inbox, stats=self.stats, busy=busy,
            latest=latest, every=snapshot_every, log_bytes=snapshot_bytes,
            interval_s=snapshot_interval_s, off_loop=snapshot_off_loop,
        )
        self.clients = ClientPort(
            config, me, self.inbox, sessions=self.sessions,
            tls=tls.server(me) if tls is not None else None, revocations=self.revocations,
            partition=self._partition, status=self._status,
            backup_chunk=self.snapshots.backup_chunk,
        )
        self.transport = PeerTransport(
            cluster_id=config.cluster_id,
            me=me,
            addresses={r.id: r.address for r in config.replicas},
            one_way_us=config.delays_from(me),
            stamped=any(any(row) for row in config.one_way_us),
            on_frame=self.intake.on_frame,
            max_connections=config.limits.peer_cap(len(config.replicas)),
            tls_server=tls.server(me) if tls is not None else None,
            tls_dialer=tls.dialer(me) if tls is not None else None,
            revocations=self.revocations,
            identity=(identity.incarnation, identity.token),
            admit=self.known_members.admit,
            on_refused=self.intake.on_refused,
            max_handshakes=config.limits.peer_max_handshakes,
            handshake_timeout_s=config.limits.peer_handshake_timeout_s,
        )
        self.turns = TurnLoop(
            config, me, self.core, machine=state_machine,
            authz=AuthorizingMachine(state_machine) if tls is not None else None,
            sessions=self.sessions, wal=self.wal, fsync=fsync, tick_us=self.tick_us,
            identity=identity, inbox=self.inbox, intake=self.intake, transport=self.transport,
            clients=self.clients, snapshots=self.snapshots, stats=self.stats, busy=busy,
        )
        self._loop_task: asyncio.Task[None] | None = None
        #: what runs as long as the replica serves (``run_beside``: the lag probe, the gRPC
        #: health refresher): ``stop`` cancels them
        self._beside: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.stats.gc_pauses.install()
        await self.turns.replay()
        self.run_beside(self.turns.probe_lag(), f"lag-{self.me}")
        await self.transport.start()
        await self.clients.start()
        self._loop_task = asyncio.create_task(self.turns.run(), name=f"replica-{self.me}")

    async def __aenter__(self) -> ReplicaNode:
        """``async with ReplicaNode(...) as node``: started here, stopped on the way out."""
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        self.stats.gc_pauses.remove()
        self.turns.stop()
        self.clients.stop_accepting()
        if self._loop_task is not None:
            await asyncio.gather(self._loop_task, return_exceptions=True)
        beside = list(self._beside)
        for task in beside:
            task.cancel()
        await asyncio.gather(*beside, return_exceptions=True)
        await self.transport.close()
        self.snapshots.close(snapshot=self.snapshot_on_stop)
        self.wal.close()
        self.clients.fail_all(IndefiniteFailure("replica shutting down"))
        await self.clients.close()

    def run_beside(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``work`` as long as the replica serves: ``stop`` cancels it and waits for it
        (a task left pending would outlive the replica's loop)."""
        task = asyncio.create_task(work, name=name)
        self._beside.add(task)
        task.add_done_callback(self._beside.discard)
        return task

    async def wait_failed(self) -> None:
        """Returns (raising its error) only if the replica's loop died: the caller must stop
        the process rather than keep a replica that accepts connections and does nothing."""
        assert self._loop_task is not None
        await asyncio.shield(self._loop_task)

    @property
    def serving(self) -> bool:
        """The log is replayed and the loop runs, not stopping (``consensus.runtime.health``)."""
        task = self._loop_task
        return task is not None and not task.done() and not self.turns.stopping

    @property
    def stopping(self) -> bool:
        """``stop`` was called: the loop ends at its next turn."""
        return self.turns.stopping

    @property
    def loop_died(self) -> bool:
        """The loop ended while nobody stopped the replica (it raised, or a peer refused it)."""
        task = self._loop_task
        return task is not None and task.done() and not self.turns.stopping

    # ------------------------------------------------------------------ embedded API
    async def submit(self, command: Command, *, principal: Principal | None = None) -> Result:
        """Propose ``command``; its result once executed (blind: once ready). ``principal``:
        on whose behalf (TLS: checked as the command applies, ``PermissionDenied``)."""
        if principal is not None:
            command = sealed(command, principal)
        future = self.clients.expect(command, read=False)
        self.inbox.post(Propose(unblind(command)))
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
            command = sealed(command, principal)
        future = self.clients.expect(command, read=True)
        self.inbox.post(StaleRead(command) if stale else Read(command))
        return (await future).value

    # ------------------------------------------------------------------ the parts' state
    @property
    def executed_slot(self) -> int:
        """One past the last slot applied to the state machine (``TurnLoop.executed_slot``)."""
        return self.turns.executed_slot

    @property
    def on_apply(self) -> list[ApplyHook]:
        """Called after each run of one slot's commands applies (watchers):
        ``hook(position, commands, results)`` (``consensus.runtime.turns.ApplyHook``)."""
        return self.turns.on_apply

    @property
    def peer_heard_at(self) -> dict[int, float]:
        """Peer -> time.monotonic() of its last frame (``consensus.runtime.health``)."""
        return self.intake.heard_at

    @property
    def identity(self) -> MemberIdentity:
        """This replica's data-directory identity (``consensus.storage.identity``)."""
        return self.turns.identity

    @property
    def client_limits(self) -> ClientPortLimits:
        """The client port's connection caps, idle/slow timeouts and buffer budget."""
        return self.clients.limits

    @property
    def sdpaxos(self) -> SDPaxosReplica | None:
        """The SDPaxos core of the current epoch (None for a baseline core, or while this
        member learns)."""
        return sdpaxos_of(self.core)

    # a snapshot is taken once any of these is reached since the last one: commands applied,
    # bytes appended to the write-ahead log, seconds (with something applied); periodic ones
    # are written off the loop unless ``snapshot_off_loop`` is False (``SnapshotPipeline``)
    @property
    def snapshot_every(self) -> int:
        return self.snapshots.every

    @snapshot_every.setter
    def snapshot_every(self, every: int) -> None:
        self.snapshots.every = every

    @property
    def snapshot_bytes(self) -> int:
        return self.snapshots.log_bytes

    @snapshot_bytes.setter
    def snapshot_bytes(self, log_bytes: int) -> None:
        self.snapshots.log_bytes = log_bytes

    @property
    def snapshot_interval_s(self) -> float:
        return self.snapshots.interval_s

    @snapshot_interval_s.setter
    def snapshot_interval_s(self, interval_s: float) -> None:
        self.snapshots.interval_s = interval_s

    @property
    def snapshot_off_loop(self) -> bool:
        return self.snapshots.off_loop

    @snapshot_off_loop.setter
    def snapshot_off_loop(self, off_loop: bool) -> None:
        self.snapshots.off_loop = off_loop

    # ------------------------------------------------------------------ answered at once
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
