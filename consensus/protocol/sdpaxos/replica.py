"""The SDPaxos replica: the facade that composes the parts (see the package overview).

``SDPaxosReplica`` holds the state every part shares — the view and role, the C-instance
store (``c_store``: values, promises, our indexes; c_store.py), our own proposals
(``proposals``: everything told to their clients is told there; proposals.py),
the O-log (``o_log``: assignments, what is chosen, the execution frontier; o_log.py) — and
the turn's output (``out``). Each part owns the rest of its state and reaches the others
through this object.

Inputs and what they run:

* ``propose`` batches a client command (``CPhase.flush_batch`` proposes the batch at the
  latest in ``ready``); ``read`` queues a linearizable read (reads.py); ``read_stale`` serves
  one from local state.
* ``step`` routes a peer's message (rules below).
* ``tick`` runs the timers in a fixed order: heartbeats and silence windows, failure
  detection, retransmission, resuming after a restart, catch-up, straggler windows, read
  retries.
* ``ready`` flushes the turn (the open batch, commits, read requests, order messages),
  executes what became executable, records it, serves reads, and hands the ``Ready`` out;
  ``advance`` takes it back, its records durable. ``ready`` twice without ``advance``, and
  any input between them, is local misuse (``LocalProtocolError``): a replica counts its
  own acceptances at once, which is sound because every message that could complete a
  majority with one is stepped after the turn that made it is durable.

Routing rules (``step``), in order:

1. A message from outside the cluster or from ourselves is dropped.
2. Heartbeats, pre-votes, vote requests and the C-phase (``_any_view``) count in any view:
   C-instances belong to their owners, not to a sequencer's view, and ballots alone order
   their proposals (filtering them by view dropped the promises of a recovery that crossed
   a view change and stalled it until it timed out). Heartbeats and vote requests carry
   their own view rules (election.py, view_change.py).
3. Everything else (``_in_view``) belongs to a view: from an older view only requests for
   help (``Catchup``, ``CatchupMarkers``) are answered; a higher view is joined only when
   the message comes from that view's sequencer (a replica stuck in a view nobody won must
   not drag a healthy cluster into it).
4. An OAccept, OCommit or NewView from our sequencer is a sign that it serves (election.py).

Lifecycle events, each announced once, here, to the parts that keep state about it (each
part resets its own; none writes another's):

=====================  =========================================  =========================
event                  announced by                               who resets what
=====================  =========================================  =========================
a higher view          ``join_view`` (a message of the view's     the O-log forgets its
                       sequencer, a vote request, a candidacy)    commits and prefix; the
                                                                  view change, sequencer,
                                                                  straggler detector and
                                                                  election their per-view
                                                                  state
its NewView accepted   ``accept_view``                            the C-phase and reads send
                                                                  again what it has not
                                                                  ordered or answered
compaction below a     ``drop_below`` (``compact``, and every     the O-log, C-instance
point                  snapshot installed)                        store, C-phase, own
                                                                  proposals and sequencer
                                                                  forget what lies below
a snapshot installed   ``snapshot_installed`` (a peer's, or the   the O-log's frontier jumps;
                       one a restart begins at)                   then as compaction; the
                                                                  executor's progress clock
a restart              ``restarted`` (after ``Restart.recover``   a follower; the O-log
                       replayed the records)                      recounts; own proposals
                                                                  found in the records; the
                                                                  sequencer knows a crash
                                                                  restarts it as a follower
=====================  =========================================  =========================

Roles change only through ``become``, by this table (any other change is a bug:
``LocalProtocolError``):

=============  ================  ===========================================================
to             from              when
=============  ================  ===========================================================
FOLLOWER       any role          it joins a higher view (``join_view``), or restarts
CANDIDATE      FOLLOWER          a majority granted its pre-vote and it joined the view it
                                 would lead (``ViewChange.start_candidacy``)
ESTABLISHING   CANDIDATE         a majority voted: it sent its NewView (``ViewChange``)
SEQUENCER      ESTABLISHING      a majority accepted its NewView (``ViewChange``); a replica
                                 also starts as the sequencer of its start view
=============  ================  ===========================================================
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from consensus.config import ProtocolConfig
from consensus.errors import LocalProtocolError
from consensus.messages import (
    CAccept,
    CAck,
    Catchup,
    CatchupMarkers,
    CCommit,
    CNack,
    Command,
    CPrepare,
    CPromise,
    CRequest,
    Heartbeat,
    LeaseGrant,
    NewView,
    NewViewAck,
    OAccept,
    OAck,
    OCommit,
    PeerMessage,
    PreVote,
    PreVoteReply,
    Record,
    RReply,
    RRequest,
    Suspect,
    ViewRecord,
    Vote,
    VRequest,
    check_command,
)
from consensus.protocol import checks
from consensus.protocol.ready import Outgoing, Ready
from consensus.protocol.sdpaxos.c_phase import CPhase
from consensus.protocol.sdpaxos.c_store import CStore
from consensus.protocol.sdpaxos.catchup import CatchUp
from consensus.protocol.sdpaxos.election import Election
from consensus.protocol.sdpaxos.execution import Executor
from consensus.protocol.sdpaxos.instances import PLACES_NOTHING, Batch
from consensus.protocol.sdpaxos.o_acceptor import OAcceptor
from consensus.protocol.sdpaxos.o_log import OLog
from consensus.protocol.sdpaxos.proposals import OwnProposals
from consensus.protocol.sdpaxos.readiness import rule_for
from consensus.protocol.sdpaxos.reads import Reads
from consensus.protocol.sdpaxos.recovery import CRecovery
from consensus.protocol.sdpaxos.restart import Restart
from consensus.protocol.sdpaxos.sequencer import Sequencer
from consensus.protocol.sdpaxos.snapshots import Snapshots
from consensus.protocol.sdpaxos.straggler import StragglerDetector
from consensus.protocol.sdpaxos.view_change import ViewChange
from consensus.protocol.status import CoreStatus
from consensus.protocol.types import Role, SnapshotMeta

__all__ = ["SDPaxosReplica"]

#: ``become``: the roles a replica may take each role from (the table above)
_BECOMES_FROM: dict[Role, frozenset[Role]] = {
    Role.FOLLOWER: frozenset({Role.FOLLOWER, Role.CANDIDATE, Role.ESTABLISHING, Role.SEQUENCER}),
    Role.CANDIDATE: frozenset({Role.FOLLOWER}),
    Role.ESTABLISHING: frozenset({Role.CANDIDATE}),
    Role.SEQUENCER: frozenset({Role.ESTABLISHING}),
}


class SDPaxosReplica:
    """One SDPaxos replica: feed it inputs, drain ``ready()``, call ``advance``."""

    def __init__(
        self,
        config: ProtocolConfig,
        me: int,
        *,
        recovered: Sequence[Record] = (),
        rng: random.Random,
        snapshot: SnapshotMeta | None = None,
        start_view: int = 0,
    ) -> None:
        """``start_view``: the view this replica's log starts in, its (empty) assignment log
        accepted by everyone (a membership epoch's first view, a multiple of N: replica 0
        leads it)."""
        if not 0 <= me < config.replicas:
            raise LocalProtocolError(f"replica id {me} outside 0..{config.replicas - 1}")
        self.config = config
        self.me = me
        self.n = config.replicas
        self.q = config.quorum
        self.rng = rng
        self.now = 0
        self.unsafe = config.unsafe
        self.peers = tuple(rid for rid in range(self.n) if rid != me)
        # views
        self.view = start_view
        self.view_ready = True  # accepted the NewView of self.view
        self.role = Role.SEQUENCER if start_view % self.n == me else Role.FOLLOWER
        self.started = False  # this incarnation had an input (its clocks started)
        self._checking = checks.enabled()
        # C-instances, by (owner, index), their promises and our own indexes
        self.c_store = CStore(self.n, me, checking=self._checking)
        # the global slots' assignments, what is chosen, and the execution frontier (the
        # start view's empty assignment log is accepted by everyone)
        self.o_log = OLog(self.n, me, start_view=start_view, checking=self._checking)
        # membership: this replica executed a change that ends the epoch (close_epoch)
        self.closing = False
        # the turn's output
        self.out = Ready()
        self.handed_out: Ready | None = None
        # the parts (see the package overview)
        self.proposals = OwnProposals(self)
        self.c_phase = CPhase(self)
        self.recovery = CRecovery(self)
        self.ordering = Sequencer(self)
        self.o_acceptor = OAcceptor(self)
        self.readiness = rule_for(self)
        self.executor = Executor(self)
        self.views = ViewChange(self)
        self.election = Election(self)
        self.reads = Reads(self)
        self.straggler = StragglerDetector(self)
        self.catchup = CatchUp(self)
        self.snapshots = Snapshots(self)
        self.restart = Restart(self)
        # message routing (see ``step``)
        self._any_view: dict[type, Callable[[Any], None]] = {
            Heartbeat: self.election.on_heartbeat,
            VRequest: self.views.on_vrequest,
            PreVote: self.election.on_prevote,
            PreVoteReply: self.election.on_prevote_reply,
            CAccept: self.c_phase.on_caccept,
            CAck: self.c_phase.on_cack,
            CCommit: self.c_phase.on_ccommit,
            CNack: self.c_phase.on_cnack,
            CPrepare: self.recovery.on_cprepare,
            CPromise: self.recovery.on_cpromise,
        }
        self._in_view: dict[type, Callable[[Any], None]] = {
            CRequest: self.ordering.on_crequest,
            OAccept: self.o_acceptor.on_oaccept,
            OAck: self.o_acceptor.on_oack,
            OCommit: self.o_acceptor.on_ocommit,
            Catchup: self.catchup.on_catchup,
            CatchupMarkers: self.catchup.on_catchup,
            LeaseGrant: self.election.on_lease_grant,
            Vote: self.views.on_vote,
            NewView: self.views.on_new_view,
            NewViewAck: self.views.on_new_view_ack,
            RRequest: self.reads.on_rrequest,
            RReply: self.reads.on_rreply,
            Suspect: self.straggler.on_suspect,
        }

        if snapshot is not None:
            self.snapshot_installed(snapshot)
        if recovered or snapshot is not None:
            self.restart.recover(recovered)

    # ------------------------------------------------------------------ who leads
    @property
    def sequencer(self) -> int:
        return self.view % self.n

    @property
    def is_sequencer(self) -> bool:
        return self.view % self.n == self.me

    # ------------------------------------------------------------------ where the log stands
    @property
    def exec_slot(self) -> int:
        """Every global slot below this executed here (``OLog.exec_slot``)."""
        return self.o_log.exec_slot

    @property
    def sealed_at(self) -> int:
        """The slot of the executed SEAL that ended this log (membership), or ``NO_SLOT``."""
        return self.o_log.sealed_at

    @sealed_at.setter
    def sealed_at(self, slot: int) -> None:
        # the membership layer's broken variant ``epoch_at_change`` ends the log early
        self.o_log.end_at(slot)

    @property
    def compacted(self) -> int:
        """Slots below this were compacted into a snapshot."""
        return self.o_log.compacted

    # ------------------------------------------------------------------ inputs
    def propose(self, command: Command, now: int) -> None:
        """A client command arrived. Raises ``LocalProtocolError`` (and changes nothing) for a
        command no peer could decode: check client input before handing it over."""
        check_command(command)
        self._enter(now)
        self.c_phase.propose(command)

    def read(self, command: Command, now: int) -> None:
        """A linearizable read (``command.op`` is a query): served through ``Ready.reads``."""
        check_command(command)
        self._enter(now)
        self.reads.ask(command)

    def read_stale(self, command: Command, now: int) -> None:
        """A read served from local state at once: fast, possibly stale, never linearizable."""
        self._enter(now)
        self.out.reads.append(command)

    def step(self, message: PeerMessage, now: int) -> None:
        """A peer's message arrived (see the routing rules above)."""
        self._enter(now)
        src = message.src
        if not 0 <= src < self.n or src == self.me:
            return
        self.election.silence.heard(src, now)
        handler = self._any_view.get(type(message))
        if handler is not None:
            handler(message)
            return
        if message.view < self.view:
            if isinstance(message, Catchup | CatchupMarkers):
                self.catchup.on_catchup(message)
            return
        if message.view > self.view:
            if src != message.view % self.n:
                return
            self.join_view(message.view)
        if src == self.sequencer and isinstance(message, OAccept | OCommit | NewView):
            self.election.sequencer_alive(now)
        handler = self._in_view.get(type(message))
        if handler is not None:
            handler(message)

    def tick(self, now: int) -> None:
        """Time passed: run the timers."""
        self._enter(now)
        self.election.tick(now)
        self.election.detect_failures()
        self.c_phase.retransmit()
        self.proposals.resume_after_restart()
        self.catchup.maybe_catch_up()
        self.straggler.watch_ordering()
        self.reads.retry_reads()

    # ------------------------------------------------------------------ output
    def ready(self) -> Ready:
        """This turn's output: persist ``persist``, then send, then apply (see ``Ready``)."""
        if self.handed_out is not None:
            raise LocalProtocolError("ready() called again before advance()")
        self.c_phase.flush_batch()
        self.c_phase.flush_commits()
        self.c_phase.reserve_ahead()
        self.reads.flush_read_requests()
        self.ordering.flush_oaccepts()
        self.o_acceptor.flush_acks()
        self.executor.try_execute()
        self.executor.log_executed()
        self.reads.serve_reads()
        out, self.out = self.out, Ready()
        self.handed_out = out
        self.c_store.handed_out()
        return out

    def advance(self, ready: Ready) -> None:
        """The driver carried out ``ready`` (the one ``ready()`` handed out last): its
        records are durable."""
        if ready is not self.handed_out:
            raise LocalProtocolError("advance() with a Ready this core did not hand out")
        self.handed_out = None
        self.c_store.synced()
        if ready.persist:
            self.ordering.records_durable()

    def send(self, to: int, message: PeerMessage) -> None:
        """Queue a message that may report state persisted in this turn."""
        if "ack_before_persist" in self.unsafe:
            self.out.send.append(Outgoing(to, message))
        else:
            self.out.send_after_persist.append(Outgoing(to, message))

    def request(self, to: int, message: PeerMessage) -> None:
        """Queue a message that promises nothing (it may leave before the turn is durable)."""
        self.out.send.append(Outgoing(to, message))

    def broadcast(self, message: PeerMessage) -> None:
        for peer in self.peers:
            self.send(peer, message)

    def flush_order_messages(self) -> None:
        """Send the O-phase messages queued so far (before a view change restamps them)."""
        self.ordering.flush_oaccepts()
        self.o_acceptor.flush_acks()

    # ------------------------------------------------------------------ lifecycle (see above)
    def join_view(self, view: int) -> None:
        """Enter a higher view: promise to reject lower O-proposals (``ViewRecord``), stop
        executing until its NewView is accepted, and have every part reset its per-view
        state."""
        # O-phase messages queued this turn belong to the view they were made in: stamped
        # with the new one, a deposed sequencer's proposals would become the new view's
        # (in its records too, so a restart would bring back a second value for a slot).
        self.flush_order_messages()
        self.view = view
        self.out.persist.append(ViewRecord(view=view))
        self.view_ready = False
        self.become(Role.FOLLOWER)
        self.o_log.forget_view()
        self.views.on_view_joined()
        self.ordering.on_view_joined()
        self.straggler.on_view_joined()
        self.election.on_view_joined()
        self._verify()

    def accept_view(self) -> None:
        """We accepted the NewView of our view (``OLog.install_new_view``): execute again,
        and send again what the new view has not ordered or answered yet."""
        self.view_ready = True
        self.c_phase.on_view_accepted()
        self.reads.on_view_accepted()

    def drop_below(self, meta: SnapshotMeta) -> None:
        """A durable snapshot holds every slot below ``meta`` (at or below our frontier):
        every part forgets them."""
        self._drop_below(meta)
        self._verify()

    def snapshot_installed(self, meta: SnapshotMeta) -> None:
        """Our state machine continues from the snapshot at ``meta`` (ahead of us): a peer's,
        or the one a restart begins at (its records follow)."""
        self.o_log.install_base(meta)
        self._drop_below(meta)
        self.c_store.used(self.o_log.exec_count[self.me])  # executed: never reused
        self.o_log.recount(self.view)
        self.executor.on_snapshot_installed()
        self._verify()

    def _drop_below(self, meta: SnapshotMeta) -> None:
        dropped = self.o_log.compact(meta)
        self.c_store.compact(dropped, meta.exec_counts)
        self.c_phase.on_compacted(meta.exec_counts)
        self.proposals.covered_by_snapshot(meta.exec_counts[self.me])
        self.ordering.on_compacted(meta)

    def restarted(self, own: set[int]) -> None:
        """``Restart.recover`` replayed our records (``own``: our indexes they hold) and
        executed again what they say ran: start as a follower."""
        self.become(Role.FOLLOWER)
        self.view_ready = self.o_log.accepted_view >= self.view
        self.o_log.recount(self.view)
        self.proposals.found_at_restart(own)
        self.ordering.records_durable()
        self._verify()

    def restore_view(self, view: int) -> None:
        """A restart replays a ``ViewRecord``: we promised ``view``."""
        self.view = max(self.view, view)

    def become(self, role: Role) -> None:
        """Take ``role`` (see the table above)."""
        if self.role not in _BECOMES_FROM[role]:
            raise LocalProtocolError(f"invalid role transition [{self.role.value} -> "
                                     f"{role.value}]")
        self.role = role

    def _verify(self) -> None:
        """With checks on, verify the log owners' invariants in full (after a bulk change)."""
        if self._checking:
            self.c_store.check()
            self.o_log.check_all(self.view)

    # ------------------------------------------------------------------ membership
    def carry_over(self) -> tuple[list[Command], list[Command]]:
        """The epoch ended (``sealed_at``): the commands led here that it never ordered, and
        the reads not answered yet, for the next epoch to take (they are not acknowledged)."""
        commands = self.proposals.carry_over()
        reads = list(self.reads.unasked_reads)
        for _, (pending, _) in sorted(self.reads.pending_reads.items()):
            reads.extend(pending)
        return commands, reads

    def executed_slot(self, slot: int) -> tuple[int, Batch] | None:
        """The owner (or ``NO_CL``/``SEAL``) and commands of executed ``slot``, or None if
        it is compacted away or not executed (what a learner is sent)."""
        placed = self.o_log.executed.get(slot)
        if placed is None:
            return None
        owner, index = placed
        batch = self.c_store.instances[(owner, index)].batch if owner not in PLACES_NOTHING else ()
        return owner, batch or ()

    def close_epoch(self) -> None:
        """This replica executed a membership change: the epoch must end. As the serving
        sequencer (now, or when it serves) it proposes the SEAL after which nothing is
        ordered (see sequencer.py); once the SEAL executes, ``sealed_at`` is its slot."""
        self.closing = True
        self.ordering.seal()

    # ------------------------------------------------------------------ snapshots
    def snapshot_meta(self) -> SnapshotMeta:
        """Where a snapshot of the state machine, taken now (after applying the last
        ``Ready``), stands in the log."""
        return self.snapshots.meta()

    def compact(self, meta: SnapshotMeta) -> list[Record]:
        """The state machine's snapshot at ``meta`` is durable: forget every slot below it
        (see ``Snapshots.compact``)."""
        return self.snapshots.compact(meta)

    def install_snapshot(self, meta: SnapshotMeta) -> list[Record]:
        """A peer's snapshot was applied to our state machine: continue from ``meta``."""
        return self.snapshots.install(meta)

    def durable_records(self) -> list[Record]:
        """What a rewritten write-ahead log must hold (see ``Snapshots.durable_records``)."""
        return self.snapshots.durable_records()

    # ------------------------------------------------------------------ status and checks
    def committed_log(self) -> Mapping[int, Batch]:
        """Executed slots still in memory -> their commands (for the simulator's checker)."""
        result: dict[int, Batch] = {}
        instances = self.c_store.instances
        for slot, (owner, index) in self.o_log.executed.items():
            batch = instances[(owner, index)].batch if owner not in PLACES_NOTHING else ()
            result[slot] = batch or ()
        return result

    def executed_through(self) -> int:
        return self.o_log.exec_slot - 1

    def status(self) -> CoreStatus:
        """Role, view, execution frontier, the peers' reported frontiers and the leases
        (replicas are this core's indexes, slots its own: see ``MemberReplica.status``)."""
        peer_executed = self.catchup.peer_executed
        return CoreStatus(
            role=self.role, view=self.view, executed=self.o_log.exec_slot,
            voters=tuple(range(self.n)), view_accepted=self.view_ready, leader=self.sequencer,
            peer_executed={peer: peer_executed[peer] for peer in self.peers},
            lease_held=self.lease_valid(),
            lease_granted_to=self.lease_granted(),
        )

    @property
    def recoveries_started(self) -> int:
        """C-instance recoveries this replica started (a Prepare each)."""
        return self.recovery.recoveries_started

    @property
    def too_wide_views(self) -> int:
        """Candidacies given up because their NewView would not fit a message."""
        return self.views.too_wide_views

    @property
    def retransmit_timeout_us(self) -> int:
        """The adaptive retransmission timeout (see ``RtoEstimator``)."""
        return self.c_phase.rto.timeout_us

    def lease_granted(self) -> int | None:
        """The replica this one granted its read lease to, while that lease runs (it votes
        for no other sequencer meanwhile); None otherwise."""
        leases = self.election.leases
        return leases.granted_to if leases.granted_until > self.now else None

    def lease_valid(self) -> bool:
        """Serving with read leases from a majority (linearizable reads answered here)."""
        return self.election.lease_valid()

    def _enter(self, now: int) -> None:
        if self.handed_out is not None:
            # Our own acceptances count at once (c_phase.py, o_acceptor.py) because nothing
            # that could complete a majority with them is stepped before they are durable.
            raise LocalProtocolError("an input between ready() and advance()")
        self.now = now
        if not self.started:
            # the clocks of this incarnation start at its first input
            self.started = True
            self.executor.start(now)
            self.straggler.start(now)
            self.election.start(now)
