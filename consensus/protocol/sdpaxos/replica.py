"""TODO facade"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from consensus.config import ProtocolConfig
from consensus.errors import LocalProtocolError
from consensus.messages import (
    NO_CL,
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
    Vote,
    VRequest,
)
from consensus.protocol.ready import Outgoing, Ready
from consensus.protocol.sdpaxos.c_phase import CPhase
from consensus.protocol.sdpaxos.catchup import CatchUp
from consensus.protocol.sdpaxos.election import (
    Election,
)
from consensus.protocol.sdpaxos.execution import Executor
from consensus.protocol.sdpaxos.instances import NO_INDEX, Batch, CInstance, check_command
from consensus.protocol.sdpaxos.o_acceptor import OAcceptor
from consensus.protocol.sdpaxos.readiness import rule_for
from consensus.protocol.sdpaxos.reads import Reads
from consensus.protocol.sdpaxos.recovery import CRecovery
from consensus.protocol.sdpaxos.restart import Restart
from consensus.protocol.sdpaxos.sequencer import Sequencer
from consensus.protocol.sdpaxos.snapshots import Snapshots
from consensus.protocol.sdpaxos.straggler import StragglerDetector
from consensus.protocol.sdpaxos.view_change import ViewChange
from consensus.protocol.types import Role, SnapshotMeta

__all__ = ["SDPaxosReplica"]


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
    ) -> None:
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
        self.view = 0
        self.accepted_view = 0  # view 0's (empty) assignment log is accepted by everyone
        self.accepted_from = 0  # the first slot of accepted_view's NewView (see Vote)
        self.view_ready = True  # accepted the NewView of self.view
        self.role = Role.SEQUENCER if me == 0 else Role.FOLLOWER
        # liveness and leases
        self.started = False
        self.seq_alive_at = 0  # last sign that the sequencer of our view is serving
        self.peer_executed: dict[int, int] = dict.fromkeys(range(self.n), 0)
        # C-instances, by (owner, index)
        self.c: dict[tuple[int, int], CInstance] = {}
        self.c_high: list[int] = [NO_INDEX] * self.n  # highest index accepted, per owner
        self.c_promised: dict[int, tuple[int, int]] = {}  # owner -> (ballot, from_index)
        self.ballot_seen = 0
        self.next_index = 0
        # Our instances start pre-prepared at (0, me); once a Prepare (ours or a recoverer's)
        # promised a higher ballot over our instance space, we propose at the ballot of our
        # own last successful Prepare instead — one phase 1 for all later instances.
        self.own_ballot = me
        self.unready: dict[int, Batch] = {}  # own instances not yet ready -> batch proposed
        self.restart_pending: list[int] = []  # own indexes found in records at restart
        # ... with the batches the records hold: executed as they are, they are ready, even
        # if something decided them before this incarnation drove them (then _unready lacks
        # them): the new incarnation reports them like the old one would have
        self.restart_batches: dict[int, Batch] = {}
        # instances we re-propose (a recovery's), retransmitted like our own client batches
        self.reproposing: set[tuple[int, int]] = set()
        # O-instances: value known (accepted or learned from a commit), accepted ballot
        self.o_value: dict[int, int] = {}
        self.o_ballot: dict[int, int] = {}
        self.o_committed: set[int] = set()
        self.o_acks: dict[int, set[int]] = {}  # learner side: slot -> acceptors
        self.o_prefix = 0  # slots [0, o_prefix) all accepted here
        self.o_high = 0  # one past the highest slot we know a value for
        self.prefix_mine = 0  # O-instances for me within [0, o_prefix)
        self.my_committed_o = 0  # O-instances for me known chosen
        # execution
        self.exec_slot = 0
        self.exec_count: dict[int, int] = dict.fromkeys(range(self.n), 0)
        self.log: dict[int, tuple[int, int]] = {}  # executed slot -> (owner, index)
        # slots below this are in an ExecutedRecord (or the snapshot)
        self.logged_exec = 0
        # chosen values we hold but never accepted (learned from a commit): written to our
        # records when executed, so that a restart can execute them again from the records
        self.values_to_log: set[tuple[int, int]] = set()
        self.compacted = 0  # slots below this were compacted into a snapshot
        self.base_counts: dict[int, int] = dict.fromkeys(range(self.n), 0)
        self.exec_progress_at = 0
        # the turn's output
        self.out = Ready()
        self.handed_out: Ready | None = None
        # the parts
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

        if snapshot is not None:
            self.snapshots.set_base(snapshot)
        if recovered or snapshot is not None:
            self.restart.recover(recovered)


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

    # ------------------------------------------------------------------ status and metrics
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

    def lease_valid(self) -> bool:
        """Serving with read leases from a majority (linearizable reads answered here)."""
        return self.election.lease_valid()

    @property
    def sequencer(self) -> int:
        return self.view % self.n

    @property
    def is_sequencer(self) -> bool:
        return self.view % self.n == self.me

    def propose(self, command: Command, now: int) -> None:
        """A client command arrived. Raises ``LocalProtocolError`` (and changes nothing) for a
        command no peer could decode: check client input before handing it over."""
        check_command(command)
        self._enter(now)
        if self.c_phase.batch.add(command):
            self.c_phase.flush_batch()

    def read(self, command: Command, now: int) -> None:
        """A linearizable read (``command.op`` is a query): served through ``Ready.reads``."""
        check_command(command)
        self._enter(now)
        self.reads.unasked_reads.append(command)

    def read_stale(self, command: Command, now: int) -> None:
        """A read served from local state at once: fast, possibly stale, never linearizable."""
        self._enter(now)
        self.out.reads.append(command)

    def step(self, message: PeerMessage, now: int) -> None:
        self._enter(now)
        src = message.src
        if not 0 <= src < self.n or src == self.me:
            return
        self.election.silence.heard(src, now)
        if isinstance(message, Heartbeat):
            self.election.on_heartbeat(message)
            return
        if isinstance(message, VRequest):
            self.views.on_vrequest(message)
            return
        if isinstance(message, PreVote):
            self.election.on_prevote(message)
            return
        if isinstance(message, PreVoteReply):
            self.election.on_prevote_reply(message)
            return
        if isinstance(message, _C_PHASE):
            # C-instances belong to their owners, not to a sequencer's view: ballots alone
            # order their proposals. Filtering them by view would, for one, drop the promises
            # of a recovery that crossed a view change and stall it until it times out.
            self._on_c_phase(message)
            return
        if message.view < self.view:
            if isinstance(message, Catchup | CatchupMarkers):
                self.catchup.on_catchup(message)
            return
        if message.view > self.view:
            # Only the new view's sequencer (or voting) brings us into a higher view: a
            # replica stuck in a view nobody won must not drag a healthy cluster into it.
            if src != message.view % self.n:
                return
            self.views.join_view(message.view)
        if src == self.sequencer and isinstance(message, OAccept | OCommit | NewView):
            self.seq_alive_at = now
        match message:
            case CRequest():
                self.ordering.on_crequest(message)
            case OAccept():
                self.o_acceptor.on_oaccept(message)
            case OAck():
                self.o_acceptor.on_oack(message)
            case OCommit():
                self.o_acceptor.on_ocommit(message)
            case Catchup() | CatchupMarkers():
                self.catchup.on_catchup(message)
            case LeaseGrant():
                self.election.on_lease_grant(message)
            case Vote():
                self.views.on_vote(message)
            case NewView():
                self.views.on_new_view(message)
            case NewViewAck():
                self.views.on_new_view_ack(message)
            case RRequest():
                self.reads.on_rrequest(message)
            case RReply():
                self.reads.on_rreply(message)
            case Suspect():
                self.straggler.on_suspect(message)

    def _on_c_phase(self, message: CAccept | CAck | CCommit | CPrepare | CPromise | CNack) -> None:
        match message:
            case CAccept():
                self.c_phase.on_caccept(message)
            case CAck():
                self.c_phase.on_cack(message)
            case CCommit():
                self.c_phase.on_ccommit(message)
            case CPrepare():
                self.recovery.on_cprepare(message)
            case CPromise():
                self.recovery.on_cpromise(message)
            case CNack():
                self.c_phase.on_cnack(message)

    def tick(self, now: int) -> None:
        self._enter(now)
        self.election.tick(now)
        self.election.detect_failures()
        self.c_phase.retransmit()
        self.restart.resume_after_restart()
        self.catchup.maybe_catch_up()
        self.straggler.watch_ordering()
        self.reads.retry_reads()

    def ready(self) -> Ready:
        if self.handed_out is not None:
            raise LocalProtocolError("ready() called again before advance()")
        self.c_phase.flush_batch()
        self.reads.flush_read_requests()
        self.flush_order_messages()
        self.executor.try_execute()
        self.executor.log_executed()
        self.reads.serve_reads()
        out, self.out = self.out, Ready()
        self.handed_out = out
        return out

    def advance(self, ready: Ready) -> None:
        if ready is not self.handed_out:
            raise LocalProtocolError("advance() with a Ready this core did not hand out")
        self.handed_out = None

    def committed_log(self) -> Mapping[int, tuple[Command, ...]]:
        result: dict[int, tuple[Command, ...]] = {}
        for slot, (owner, index) in self.log.items():
            batch = self.c[(owner, index)].batch if owner != NO_CL else ()
            result[slot] = batch or ()
        return result

    def executed_through(self) -> int:
        return self.exec_slot - 1

    def _enter(self, now: int) -> None:
        self.now = now
        if not self.started:
            # the clocks of this incarnation start at its first input
            self.started = True
            self.exec_progress_at = now
            self.straggler.window_start = now
            self.election.start(now)

    def send(self, to: int, message: PeerMessage) -> None:
        """Queue a message that may report state persisted in this batch."""
        if "ack_before_persist" in self.unsafe:
            self.out.send.append(Outgoing(to, message))
        else:
            self.out.send_after_persist.append(Outgoing(to, message))

    def request(self, to: int, message: PeerMessage) -> None:
        """Queue a message that promises nothing (it may leave before the batch is durable)."""
        self.out.send.append(Outgoing(to, message))

    def broadcast(self, message: PeerMessage) -> None:
        for peer in self.peers:
            self.send(peer, message)

    def flush_order_messages(self) -> None:
        """Send this turn's OAccepts, OAcks and OCommits: one message of each per peer."""
        self.ordering.flush_oaccepts()
        self.o_acceptor.flush_acks()


_C_PHASE = (CAccept, CAck, CCommit, CPrepare, CPromise, CNack)
