"""SDPaxos replica core (SoCC'18 §3, Figures 5 and 7), sans-I/O.

Theory of operation
-------------------
Every replica ``n`` replicates its own commands in *C-instances* ``C[n][0], C[n][1], ...``: it
is pre-prepared at ballot ``(0, n)`` and goes straight to the Accept phase (``CAccept``); an
instance is chosen when a majority (``n`` included) accepted it, and ``n`` broadcasts
``CCommit``. One replica, the *sequencer* (replica ``view % N``), orders them: on seeing
``CAccept(n, i)`` or ``CRequest(n, i)`` it proposes ``n`` in the next *O-instances* (global
slots) until ``n`` owns ``i + 1`` of them. The ``k``-th O-instance naming ``n`` places
``C[n][k]`` in that slot; so duplicated and reordered requests cannot place anything twice.
``OAccept`` goes to every replica; acceptors answer the *learner* ``n`` with ``OAck`` — with
five replicas, the sequencer and every other replica instead; with three, both.

When is a command *ready* (may the leader acknowledge a blind write)? ``C[n][i]`` chosen, and:

* N = 3 or N >= 7 — at least ``i + 1`` O-instances for ``n`` are chosen (accepted by a
  majority). With three replicas the sequencer's OAccept plus ``n``'s own acceptance already
  form that majority, so the order costs half a round trip: one round trip in all.
* N = 5 — a non-sequencer ``n`` treats its O-instance as chosen as soon as it accepts the
  sequencer's OAccept, and is ready once it accepted *every* O-instance up to the one placing
  ``C[n][i]`` (no gap: the view change's hole-filling rule relies on it); the sequencer's own
  commands need every O-instance up to theirs accepted by a majority.

Slot ``j`` executes when ``O[j]`` and the C-instance it places are chosen and every slot
before ``j`` has executed. A replica learns a choice it did not lead from acceptances: the
proposer accepted the value before sending it (at the same ballot), so with three replicas
the acceptor's own acceptance completes a majority — it learns from the Accept itself — and
with five or more acceptors send their ``CAck`` to every replica, and a replica learns once
the proposer, itself and the acknowledgements make a majority (with five, likewise for
O-instances from the OAcks). Replicas then execute others' commands without waiting for
their CCommits and OCommits (a round trip to a far proposer or owner and back); with three,
the sequencer learns a slot from the first OAck. Five replicas pay for it in messages: about
46 a write instead of 24 (fewer frames: each turn's messages to a peer share one).

A replica whose execution stalls (or that heartbeats show far behind) asks a peer for the
commits it misses (``CatchupMarkers``), and for values too (``Catchup``) once a commit names
an instance whose value it lacks.

Failures (§3.3). Every replica heartbeats every other. A replica that has not heard from the
sequencer for a (randomized) election timeout becomes a *candidate* for the next view it
would lead: ``VRequest`` carries the O-prepare for every slot from the candidate's execution
frontier; a ``Vote`` joins the view and reports the voter's accepted O-instances (with their
ballots, which are views) and, per replica, the highest C-instance index it accepted. With a
majority of votes the candidate rebuilds the assignment log — highest ballot per slot; with
N = 5, Figure 7's rule re-assigns holes to the one replica ``m`` it cannot trace until ``m``
owns as many O-instances as it may have ready commands; the remaining holes get ``NO_CL`` —
and sends it as ``NewView``. With N = 5 the NewView starts at the lowest execution frontier
among the votes, re-proposing the slots the candidate executed and a voter did not: such a
slot may be accepted only by its owner and an old sequencer, and the hole-filling rule is
sound only if every view change leaves all earlier O-instances accepted by a majority (the
paper's consistency proof assumes it). Accepting a NewView replaces every unexecuted
O-instance from its start (a stale commit from the old view included: that is how ``m`` gives
up a slot it committed alone). Once a majority accepted it the sequencer commits it and
serves; replicas re-send what the new view has not ordered. A replica executes nothing
between joining a view and accepting its NewView, so it never runs a slot the new view may
reassign.

A suspected replica's unfinished C-instances are recovered by the next live replica (or by
the owner itself once it learns it was overtaken): Prepare at a higher ballot, then
re-propose the highest-ballot value found, or a no-op (empty batch) where nothing was
accepted; without a majority in time it asks again at the same ballot. A replica is suspected
after an election timeout of silence, or twice its longest recent silence if that is longer
(a CPU-starved replica is slow, not dead). The owner never reuses an index (its counter
comes back from its records) and reports commands whose instance was decided without them as
definite failures.

Reads (§3.5): the sequencer answers ``RRequest`` with the last slot assigned to an update of
the keys (a history table; the last slot overall when it has none), the replica serves the
read once it executed through it. Only a sequencer holding unexpired leases from a majority
answers; a replica that granted a lease votes for nobody else before it expires (also after
a restart: it waits one lease period before voting at all).

Straggler detection (§4): a replica that got less than half the ordering it needed, or whose
commands waited ``ORDER_LAG_FACTOR`` times longer for their order than for their C-phase, for
``straggler_windows`` windows in a row tells the others (``Suspect``, repeated every window
while it suspects) and stops renewing the sequencer's leases; with a majority agreeing they
elect another one. Without a majority, ``straggler_windows`` good windows end the suspicion.

Rules that keep it safe
-----------------------
* Anything that reports an acceptance, a promise, a vote or a lease (``CAck``, ``OAck``,
  ``Vote``, ``CPromise``, ``NewViewAck``, ``LeaseGrant``, accepts and commits derived from
  them) leaves through ``send_after_persist``: the driver makes the batch's records durable
  first. Only pure requests (``CRequest``, ``Catchup``, ``CatchupMarkers``, ``RRequest``) use
  ``send``.
* O-phase messages are taken only from the sequencer of the receiver's current view, and only
  once the receiver accepted that view's NewView. Messages from older views are dropped, except
  facts (``CCommit``) and requests for help (``Catchup``, ``CatchupMarkers``). C-phase
  messages count in any view (ballots order them), except that with N = 5 a ``CAccept`` from
  an older view is dropped: a voter accepting it could let its owner finish a C-instance
  beyond the ``c_high`` the voter reported and execute it in a slot the new view gave to
  someone else.
* A proposer counts its own acceptance, so it never proposes below a ballot it promised for
  the instance: an owner that promised a recoverer holds its next proposals (naming them in no
  message, as a restart forgets them) until its own recovery proposes them; a recoverer that
  promised a higher one meanwhile drops its recovery.
* Compaction never turns into "nothing accepted": a replica asked for a vote or a promise that
  reaches below its compaction point sends its snapshot instead of answering, and a recovery
  never re-proposes an instance that was executed meanwhile.
* Every map this core iterates to produce output is ordered (ints or sorted), so a seeded
  simulation replays exactly.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

from consensus.config import ProtocolConfig
from consensus.errors import LocalProtocolError
from consensus.messages import (
    EVERY_INDEX,
    MAX_ENTRIES,
    MAX_KEY_BYTES,
    MAX_KEYS_PER_COMMAND,
    MAX_OP_BYTES,
    MAX_REQUEST_KEYS,
    MAX_SLOTS,
    NO_CL,
    CAccept,
    CAcceptedRecord,
    CAck,
    Catchup,
    CatchupMarkers,
    CCommit,
    CNack,
    Command,
    CPrepare,
    CPromise,
    CPromiseRecord,
    CRequest,
    CVote,
    ExecutedRecord,
    Heartbeat,
    LeaseGrant,
    NewView,
    NewViewAck,
    NewViewRecord,
    OAccept,
    OAcceptedRecord,
    OAck,
    OCommit,
    OEntry,
    OVote,
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
)
from consensus.protocol.ballot import BALLOT_STRIDE, next_ballot
from consensus.protocol.batch import CATCHUP_BYTES, CommandBatch, batch_size
from consensus.protocol.ready import Execution, Failure, Outgoing, Ready
from consensus.protocol.types import Role, SnapshotMeta

__all__ = ["OwnerSlots", "Role", "SDPaxosReplica", "SnapshotMeta"]

#: Most slots (and C-instances) one Catchup answer carries.
CATCHUP_BATCH = 256
#: A view change reports and re-proposes at most about this many executed slots: a voter
#: does not vote for a candidate that executed this many slots less than itself, and with
#: five replicas a candidate leaves out the votes of voters that far behind it. Such a
#: replica catches up under a view that a nearer replica leads. (A quarter of the codec's
#: MAX_ENTRIES, so a vote's executed and accepted slots together fit one message.)
VIEW_SPAN = MAX_ENTRIES // 4
#: A promise reports on at most this many bytes of batches (its first vote goes whatever its
#: size) and this many votes; the recoverer asks for the next page (``CPromise.through``).
#: With a batch's own bound (``max_batch_bytes``) it keeps every promise well inside a frame.
PROMISE_PAGE_BYTES = 4 << 20
PROMISE_PAGE_VOTES = 4096
#: the adaptive retransmission timeout never exceeds this many times ``retransmit_us``
RTO_CEILING_FACTOR = 10
#: Straggler detection samples its own commands' waits this many times per window ...
WAIT_SAMPLES = 20
#: ... and a window is slow when they waited this many times longer for their order than
#: for their C-phase
ORDER_LAG_FACTOR = 4
#: a peer's suspicion counts for this many straggler windows after its last Suspect
SUSPECT_WINDOWS = 3
#: A peer's C-instances are recovered after ``election_timeout_us`` of silence, or after
#: SILENCE_FACTOR times the longest silence it recently kept while alive if that is longer
#: (learned gaps are capped so the timeout stays below SILENCE_CEILING_FACTOR timeouts).
#: Past saturation a CPU-starved replica's loop turns stretch towards the election timeout:
#: suspected while alive, it saw its clients' commands recovered as no-ops and answered
#: "recovered without it", and the recoveries' Prepares and promises (carrying the values
#: again) slowed everyone further. A crashed peer is still suspected after the usual timeout
#: unless it was that slow just before.
SILENCE_FACTOR = 2
SILENCE_CEILING_FACTOR = 4
#: "recently": in this window of election timeouts or the one before
SILENCE_WINDOW_FACTOR = 8
#: the ballot of an own C-instance held for our recovery (nothing accepted, see
#: ``_hold_for_recovery``)
HELD = -1
#: the C-instance index of a slot that places none (``NO_CL``) in ``log``
NO_INDEX = -1
#: ``_fill_for``: m needs no slot of the new view's (it owns enough below it)
NO_POSITION = -1

Batch = tuple[Command, ...]
_T = TypeVar("_T")


class CInstance:
    """What one replica knows of one C-instance."""

    __slots__ = (
        "acks", "ballot", "batch", "committed", "leading", "overtaken_at", "sent_at", "sent_to"
    )

    def __init__(self, ballot: int, batch: Batch | None) -> None:
        self.ballot = ballot
        self.batch = batch
        self.committed = False
        # bookkeeping of the replica proposing it at ``ballot`` (owner or recoverer)
        self.leading = False
        self.acks: set[int] = set()
        self.sent_at = 0
        #: peers sent its CAccept at ``ballot``: their commit need not carry the batch again
        self.sent_to: frozenset[int] = frozenset()
        #: when the owner learned that a recoverer took it over (-1: it did not)
        self.overtaken_at = -1


class OwnerSlots:
    """The global slots of one replica's O-instances, in order, minus a compacted prefix:
    ``self[k]`` is the slot of its ``k``-th O-instance (``k >= base``)."""

    __slots__ = ("base", "slots")

    def __init__(self, base: int = 0) -> None:
        self.base = base
        self.slots: list[int] = []

    def __len__(self) -> int:
        return self.base + len(self.slots)

    def __getitem__(self, index: int) -> int:
        if index < self.base:
            raise IndexError(f"O-instance {index} was compacted away (base {self.base})")
        return self.slots[index - self.base]

    def append(self, slot: int) -> None:
        self.slots.append(slot)

    def count_below(self, slot: int) -> int:
        return self.base + bisect.bisect_left(self.slots, slot)

    def trim_below(self, slot: int) -> None:
        k = bisect.bisect_left(self.slots, slot)
        del self.slots[:k]
        self.base += k


class Recovery:
    """A Prepare round over ``owner``'s C-instances from ``from_index`` on."""

    __slots__ = ("asked_at", "ballot", "from_index", "owner", "promises")

    def __init__(self, owner: int, from_index: int, ballot: int, now: int) -> None:
        self.owner = owner
        self.from_index = from_index
        self.ballot = ballot
        self.asked_at = now  # when the Prepare last went out
        self.promises: dict[int, CPromise] = {}


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
        self._five = self.n == 5
        self._unsafe = config.unsafe
        self._peers = tuple(rid for rid in range(self.n) if rid != me)
        pref = config.peers_by_preference(me)
        self._thrifty_targets = pref[: self.q - 1] if config.thrifty else self._peers

        # views
        self.view = 0
        self.accepted_view = 0  # view 0's (empty) assignment log is accepted by everyone
        self.accepted_from = 0  # the first slot of accepted_view's NewView (see Vote)
        self.view_ready = True  # accepted the NewView of self.view
        self.role = Role.SEQUENCER if me == 0 else Role.FOLLOWER
        self._votes: dict[int, Vote] = {}
        self._candidate_since = 0
        self._candidate_from = 0
        self._new_view: NewView | None = None  # the one we sent, while sequencer of its view
        self._new_view_acks: set[int] = set()
        self._new_view_sent_at = 0
        self._deferred_orders: list[tuple[int, int, tuple[str, ...]]] = []
        self._last_view_change_at = 0
        self._prevote_view = -1  # the view a pre-vote round is asking about, or -1
        self._prevotes: set[int] = set()
        self._prevote_at = 0
        self._higher_view_seen = 0  # a higher view some peer is stuck in (see _on_heartbeat)

        # liveness and leases
        self._started = False
        self.last_heard: dict[int, int] = dict.fromkeys(range(self.n), 0)
        # the longest silence of each peer in the current and in the previous window
        self._silence_now = [0] * self.n
        self._silence_before = [0] * self.n
        self._silence_window_at = 0
        timeout = config.election_timeout_us
        self._silence_window_us = SILENCE_WINDOW_FACTOR * timeout
        # silences learned at most (the threshold stays within SILENCE_CEILING_FACTOR timeouts)
        self._silence_ceiling = SILENCE_CEILING_FACTOR * timeout // SILENCE_FACTOR
        self._seq_alive_at = 0  # last sign that the sequencer of our view is serving
        self._peer_executed: dict[int, int] = dict.fromkeys(range(self.n), 0)
        self._next_heartbeat = 0
        self._election_timeout = config.election_timeout_us
        self._vote_block_until = 0
        self.lease_granted_to = -1
        self.lease_granted_until = 0
        self._lease_from: dict[int, int] = {}
        drift = config.max_drift_ppm / 1_000_000
        self._lease_hold_us = int(config.lease_us * (1 - 2 * drift))

        # C-instances, by (owner, index)
        self.c: dict[tuple[int, int], CInstance] = {}
        self.c_high: list[int] = [-1] * self.n  # highest index accepted, per owner
        # With five replicas or more acceptors acknowledge to every replica, and a replica
        # learns a choice it did not lead from the acknowledgements (not when thrifty: the
        # replicas a proposer left out lack the value to use them): (owner, index) ->
        # (the highest ballot acknowledged, the acceptors that acknowledged it)
        self._acks_to_all = self.q >= 3 and not config.thrifty
        self._c_acks_seen: dict[tuple[int, int], tuple[int, set[int]]] = {}
        self._c_promised: dict[int, tuple[int, int]] = {}  # owner -> (ballot, from_index)
        self._ballot_seen = 0
        self.next_index = 0
        # Our instances start pre-prepared at (0, me); once a Prepare (ours or a recoverer's)
        # promised a higher ballot over our instance space, we propose at the ballot of our
        # own last successful Prepare instead — one phase 1 for all later instances.
        self._own_ballot = me
        self._batch = CommandBatch(config)
        # Retransmission timeout, adapted to how long our C-instances take to be chosen
        # (RFC 6298's estimator; Karn: only instances sent once are sampled).
        self._rtt_probes: dict[int, int] = {}  # own index -> when its CAccept first left
        self._srtt_us = 0
        self._rttvar_us = 0
        self.retransmit_timeout_us = config.retransmit_us
        self._unready: dict[int, Batch] = {}  # own instances not yet ready -> batch proposed
        self._restart_pending: list[int] = []  # own indexes found in records at restart
        # ... with the batches the records hold: executed as they are, they are ready, even
        # if something decided them before this incarnation drove them (then _unready lacks
        # them): the new incarnation reports them like the old one would have
        self._restart_batches: dict[int, Batch] = {}
        self._recoveries: dict[int, Recovery] = {}
        #: C-instance recoveries this replica started (a Prepare each; a metric)
        self.recoveries_started = 0
        #: candidacies given up because their NewView would not fit a message (a metric)
        self.too_wide_views = 0
        # instances we re-propose (a recovery's), retransmitted like our own client batches
        self._reproposing: set[tuple[int, int]] = set()

        # O-instances: value known (accepted or learned from a commit), accepted ballot
        self.o_value: dict[int, int] = {}
        self.o_ballot: dict[int, int] = {}
        self.o_committed: set[int] = set()
        self.o_acks: dict[int, set[int]] = {}  # learner side: slot -> acceptors
        self.o_prefix = 0  # slots [0, o_prefix) all accepted here
        self.o_high = 0  # one past the highest slot we know a value for
        self._prefix_mine = 0  # O-instances for me within [0, o_prefix)
        self._my_committed_o = 0  # O-instances for me known chosen

        # sequencer state (meaningful while self.role is SEQUENCER)
        self.seq_next_slot = 0
        self.seq_slots: dict[int, OwnerSlots] = {rid: OwnerSlots() for rid in range(self.n)}
        self.seq_acked: dict[int, set[int]] = {rid: set() for rid in range(self.n)}
        self.seq_acked_prefix: dict[int, int] = dict.fromkeys(range(self.n), 0)
        self._seq_own_chosen = 0  # N=5: how many of our own O-instances are chosen
        self.history: dict[str, int] = {}  # key -> last slot assigned to an update of it
        self._history_floor = -1
        self._unknown_keys: dict[tuple[int, int], int] = {}  # ordered before its keys known

        # reads
        self._read_ids = 0
        # reads asked of the sequencer, one RRequest per turn: id -> (reads, sent at)
        self._pending_reads: dict[int, tuple[tuple[Command, ...], int]] = {}
        self._unasked_reads: list[Command] = []  # this turn's, asked in ready()
        self._waiting_reads: list[tuple[int, int, Command]] = []  # (slot, id, read)

        # straggler detection
        self._window_start = 0
        self._window_needed = 0
        self._window_got = 0
        self._wait_c = 0  # samples of own unready instances still in their C-phase
        self._wait_o = 0  # ... and of those not ordered yet
        self._next_wait_sample = 0
        self._slow_windows = 0
        self._healthy_windows = 0  # in a row, while suspecting
        self._suspecting = False
        #: replicas suspecting the sequencer (us included) -> when we last heard so
        self._suspects: dict[int, int] = {}
        self._force_election_at = -1

        # execution
        self.exec_slot = 0
        self._exec_count: dict[int, int] = dict.fromkeys(range(self.n), 0)
        # N=3/N>=7 sequencer: when its own O-instances were last checked for re-sending
        self._own_checked_at = 0
        self.log: dict[int, tuple[int, int]] = {}  # executed slot -> (owner, index)
        # slots below this are in an ExecutedRecord (or the snapshot)
        self._logged_exec = 0
        # chosen values we hold but never accepted (learned from a commit): written to our
        # records when executed, so that a restart can execute them again from the records
        self._values_to_log: set[tuple[int, int]] = set()
        self._compacted = 0  # slots below this were compacted into a snapshot
        self._base_counts: dict[int, int] = dict.fromkeys(range(self.n), 0)
        self._exec_progress_at = 0
        self._catchup_peer = 0
        self._last_catchup_at = -(1 << 62)
        self._catchup_asked = -(1 << 62)
        # a commit marker named an instance whose value we lack: ask for values, not markers
        self._catchup_lacks_values = False
        self._catchup_asked_values = False

        # the turn's output
        self._out = Ready()
        self._oaccept_out: list[OEntry] = []
        self._oack_out: dict[int, list[int]] = {}
        self._ocommit_out: list[OEntry] = []
        self._handed_out: Ready | None = None

        if snapshot is not None:
            self._set_base(snapshot)
        if recovered or snapshot is not None:
            self._recover(recovered)

    # ------------------------------------------------------------------ properties
    @property
    def sequencer(self) -> int:
        return self.view % self.n

    @property
    def is_sequencer(self) -> bool:
        return self.view % self.n == self.me

    # ------------------------------------------------------------------ inputs
    def propose(self, command: Command, now: int) -> None:
        """A client command arrived. Raises ``LocalProtocolError`` (and changes nothing) for a
        command no peer could decode: check client input before handing it over."""
        _check_command(command)
        self._enter(now)
        if self._batch.add(command):
            self._flush_batch()

    def read(self, command: Command, now: int) -> None:
        """A linearizable read (``command.op`` is a query): served through ``Ready.reads``."""
        _check_command(command)
        self._enter(now)
        self._unasked_reads.append(command)

    def read_stale(self, command: Command, now: int) -> None:
        """A read served from local state at once: fast, possibly stale, never linearizable."""
        self._enter(now)
        self._out.reads.append(command)

    def step(self, message: PeerMessage, now: int) -> None:
        self._enter(now)
        src = message.src
        if not 0 <= src < self.n or src == self.me:
            return
        silence = now - self.last_heard[src]
        if silence > self._silence_now[src] and silence <= self._silence_ceiling:
            self._silence_now[src] = silence  # longer: a crash, not a slow turn
        self.last_heard[src] = now
        if isinstance(message, Heartbeat):
            self._on_heartbeat(message)
            return
        if isinstance(message, VRequest):
            self._on_vrequest(message)
            return
        if isinstance(message, PreVote):
            self._on_prevote(message)
            return
        if isinstance(message, PreVoteReply):
            self._on_prevote_reply(message)
            return
        if isinstance(message, _C_PHASE):
            # C-instances belong to their owners, not to a sequencer's view: ballots alone
            # order their proposals. Filtering them by view would, for one, drop the promises
            # of a recovery that crossed a view change and stall it until it times out.
            self._on_c_phase(message)
            return
        if message.view < self.view:
            if isinstance(message, Catchup | CatchupMarkers):
                self._on_catchup(message)
            return
        if message.view > self.view:
            # Only the new view's sequencer (or voting) brings us into a higher view: a
            # replica stuck in a view nobody won must not drag a healthy cluster into it.
            if src != message.view % self.n:
                return
            self._join_view(message.view)
        if src == self.sequencer and isinstance(message, OAccept | OCommit | NewView):
            self._seq_alive_at = now
        match message:
            case CRequest():
                self._on_crequest(message)
            case OAccept():
                self._on_oaccept(message)
            case OAck():
                self._on_oack(message)
            case OCommit():
                self._on_ocommit(message)
            case Catchup() | CatchupMarkers():
                self._on_catchup(message)
            case LeaseGrant():
                self._on_lease_grant(message)
            case Vote():
                self._on_vote(message)
            case NewView():
                self._on_new_view(message)
            case NewViewAck():
                self._on_new_view_ack(message)
            case RRequest():
                self._on_rrequest(message)
            case RReply():
                self._on_rreply(message)
            case Suspect():
                self._on_suspect(message)

    def _on_c_phase(self, message: CAccept | CAck | CCommit | CPrepare | CPromise | CNack) -> None:
        match message:
            case CAccept():
                self._on_caccept(message)
            case CAck():
                self._on_cack(message)
            case CCommit():
                self._on_ccommit(message)
            case CPrepare():
                self._on_cprepare(message)
            case CPromise():
                self._on_cpromise(message)
            case CNack():
                self._on_cnack(message)

    def tick(self, now: int) -> None:
        self._enter(now)
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat_us
            self._send_heartbeats()
        if now - self._silence_window_at >= self._silence_window_us:
            self._silence_before = self._silence_now
            self._silence_now = [0] * self.n
            self._silence_window_at = now
        self._detect_failures()
        self._retransmit()
        self._resume_after_restart()
        self._maybe_catch_up()
        self._watch_ordering()
        self._retry_reads()

    def ready(self) -> Ready:
        if self._handed_out is not None:
            raise LocalProtocolError("ready() called again before advance()")
        self._flush_batch()
        self._flush_read_requests()
        self._flush_order_messages()
        self._try_execute()
        self._log_executed()
        self._serve_reads()
        out, self._out = self._out, Ready()
        self._handed_out = out
        return out

    def advance(self, ready: Ready) -> None:
        if ready is not self._handed_out:
            raise LocalProtocolError("advance() with a Ready this core did not hand out")
        self._handed_out = None

    # ------------------------------------------------------------------ checker views
    def committed_log(self) -> Mapping[int, tuple[Command, ...]]:
        result: dict[int, tuple[Command, ...]] = {}
        for slot, (owner, index) in self.log.items():
            batch = self.c[(owner, index)].batch if owner != NO_CL else ()
            result[slot] = batch or ()
        return result

    def executed_through(self) -> int:
        return self.exec_slot - 1

    # ------------------------------------------------------------------ plumbing
    def _enter(self, now: int) -> None:
        self.now = now
        if not self._started:
            # A fresh or restarted replica may have granted a lease it no longer remembers:
            # it votes for nobody (itself included) until any such lease has expired.
            self._started = True
            self._vote_block_until = now + self.config.lease_us
            self._exec_progress_at = now
            self._window_start = now
            self._next_heartbeat = now
            for rid in range(self.n):
                self.last_heard[rid] = now
            self._silence_window_at = now
            self._seq_alive_at = now
            self._roll_election_timeout()

    def _send(self, to: int, message: PeerMessage) -> None:
        """Queue a message that may report state persisted in this batch."""
        if "ack_before_persist" in self._unsafe:
            self._out.send.append(Outgoing(to, message))
        else:
            self._out.send_after_persist.append(Outgoing(to, message))

    def _request(self, to: int, message: PeerMessage) -> None:
        """Queue a message that promises nothing (it may leave before the batch is durable)."""
        self._out.send.append(Outgoing(to, message))

    def _broadcast(self, message: PeerMessage) -> None:
        for peer in self._peers:
            self._send(peer, message)

    def _roll_election_timeout(self) -> None:
        base = self.config.election_timeout_us
        self._election_timeout = base + int(self.rng.random() * base / 2)

    # ------------------------------------------------------------------ C-phase (leader)
    def _flush_batch(self) -> None:
        if not self._batch:
            return
        batch = self._batch.take()
        index = self.next_index
        self.next_index += 1
        ballot = self._own_ballot
        if self._promised(self.me, index) > ballot:
            self._hold_for_recovery(index, batch)
            return
        inst = CInstance(ballot, batch)
        inst.leading = True
        inst.acks.add(self.me)
        inst.sent_at = self.now
        self.c[(self.me, index)] = inst
        self.c_high[self.me] = max(self.c_high[self.me], index)
        self._unready[index] = batch
        self._window_needed += 1
        self._out.persist.append(
            CAcceptedRecord(owner=self.me, index=index, ballot=ballot, batch=batch)
        )
        accept = CAccept(
            src=self.me, view=self.view, owner=self.me, index=index, ballot=ballot, batch=batch
        )
        for peer in self._thrifty_targets:
            self._send(peer, accept)
        inst.sent_to = frozenset(self._thrifty_targets)
        self._rtt_probes[index] = self.now
        if self.is_sequencer:
            self._order(self.me, index)
        elif self.sequencer not in self._thrifty_targets:
            self._send_crequest(index)
        if self.n == 1:
            self._commit_leading(self.me, index, inst)

    def _hold_for_recovery(self, index: int, batch: Batch) -> None:
        """We promised a recoverer of our instances a higher ballot for ``index`` and on:
        accepting our own proposal at our ballot would break that promise, and with the
        sequencer's acceptance it could be chosen beside the recoverer's no-op. Nothing is
        accepted or sent; our own recovery (Prepare above the promise) proposes ``batch`` at
        ``index`` once it finds nothing chosen there."""
        inst = self.c[(self.me, index)] = CInstance(HELD, None)
        inst.overtaken_at = self.now
        self._unready[index] = batch
        self._window_needed += 1
        if self.me not in self._recoveries:
            stalled = self._undriven_own()
            self._start_recovery(self.me, max(min(stalled), self._exec_count[self.me]))

    def _undriven_own(self) -> list[int]:
        """Our proposals not yet ready that we do not drive: overtaken by a recoverer, or held
        for our own recovery."""
        return [
            index
            for index in self._unready
            if not (inst := self.c[(self.me, index)]).leading and not inst.committed
        ]

    def _is_held(self, index: int) -> bool:
        inst = self.c.get((self.me, index))
        return inst is not None and inst.ballot == HELD and index in self._unready

    def _last_named_index(self) -> int:
        """Our highest index a peer may have heard of. An index held for a recovery is named
        in no message until that recovery proposes it (durably first), so a restart, which
        forgets it, may use it again: had the sequencer ordered it meanwhile, commands
        proposed after the restart would run in a slot given out before them."""
        index = self.next_index - 1
        while index >= 0 and self._is_held(index):
            index -= 1
        return index

    def _send_crequest(self, index: int) -> None:
        inst = self.c.get((self.me, index))
        request = CRequest(
            src=self.me,
            view=self.view,
            owner=self.me,
            index=index,
            keys=_keys_of(inst.batch if inst else None),
            o_prefix=self.o_prefix,
        )
        if self.is_sequencer:
            self._order(self.me, index, request.keys)
        else:
            self._request(self.sequencer, request)

    def _on_cack(self, msg: CAck) -> None:
        key = (msg.owner, msg.index)
        inst = self.c.get(key)
        if inst is not None and inst.leading and msg.ballot % BALLOT_STRIDE == self.me:
            # (a ballot of ours: we may still lead at one a higher proposal overtook)
            if inst.ballot == msg.ballot and not inst.committed:
                inst.acks.add(msg.src)
                if len(inst.acks) >= self.q:
                    self._commit_leading(msg.owner, msg.index, inst)
            return
        if not self._acks_to_all or msg.index < self._exec_count[msg.owner]:
            return
        if inst is not None and inst.committed:
            return
        # An acknowledgement may overtake the CAccept it answers (from a far proposer, the
        # acceptor next to us answers before the proposal reaches us): keep it until then.
        seen = self._c_acks_seen.get(key)
        if seen is None or seen[0] < msg.ballot:
            self._c_acks_seen[key] = (msg.ballot, {msg.src})
        elif seen[0] == msg.ballot:
            seen[1].add(msg.src)
        else:
            return
        if inst is not None:
            self._learn_from_acks(key, inst)

    def _learn_from_acks(self, key: tuple[int, int], inst: CInstance) -> None:
        """``C[owner][index]`` is chosen once a majority accepted one ballot: what ``inst``
        holds is what we accepted, at ``inst.ballot``; so did that ballot's proposer (a
        CAccept leaves only once its sender's acceptance is durable; the proposer is packed
        in the ballot) and every acceptor that acknowledged it. With three replicas the first
        two are a majority: an acceptor learns the choice from the Accept itself, rather than
        a one-way delay later from the proposer's CCommit. With five, acknowledgements from
        the acceptors next to us complete it, instead of a round trip to a far proposer and
        its CCommit's way back, which held up executing every slot ordered after it."""
        if inst.committed or inst.batch is None:
            return
        seen = self._c_acks_seen.get(key)
        acked: set[int] = set()
        if seen is not None and (seen[0] == inst.ballot or "acks_any_ballot" in self._unsafe):
            acked = seen[1]
        if len(acked | {self.me, inst.ballot % BALLOT_STRIDE}) >= self.q:
            self._learn_c_chosen(key[0], key[1], inst)

    def _commit_leading(self, owner: int, index: int, inst: CInstance) -> None:
        inst.committed = True
        inst.leading = False
        sent_at = self._rtt_probes.pop(index, None) if owner == self.me else None
        if sent_at is not None:
            self._sample_rtt(self.now - sent_at)
        self._reproposing.discard((owner, index))
        for peer in self._peers:
            # A peer we sent the CAccept to has it before this commit (connections are FIFO);
            # repeating the batch doubled the bytes of a loaded cluster. If that CAccept was
            # lost after all, the peer lacks the value and catches up when it stalls.
            batch = None if peer in inst.acks or peer in inst.sent_to else inst.batch
            commit = CCommit(
                src=self.me,
                view=self.view,
                owner=owner,
                index=index,
                ballot=inst.ballot,
                batch=batch,
            )
            self._send(peer, commit)
        if owner == self.me:
            self._own_decided(index, inst)
        self._check_ready()

    def _own_decided(self, index: int, inst: CInstance) -> None:
        """Our instance was chosen: if not with what we proposed, its commands failed."""
        self._rtt_probes.pop(index, None)
        # ours from this incarnation, or found in our records at a restart
        table = self._unready if index in self._unready else self._restart_batches
        proposed = table.get(index)
        if proposed is None or inst.batch == proposed:
            return
        del table[index]
        chosen = set(inst.batch or ())
        for command in proposed:
            if command not in chosen:
                self._out.failed.append(
                    Failure(command, True, "its instance was recovered without it")
                )

    # ------------------------------------------------------------------ C-phase (acceptor)
    def _promised(self, owner: int, index: int) -> int:
        promise = self._c_promised.get(owner)
        if promise is not None and index >= promise[1]:
            return promise[0]
        return -1

    def _on_caccept(self, msg: CAccept) -> None:
        if self._five and msg.view < self.view:
            # With five replicas an owner commits its O-instance on the sequencer's OAccept
            # alone, and a new sequencer gives an untraced owner only as many slots as the
            # voters' c_high shows (Figure 7, lines 32-36). Accepting a proposal from an
            # older view after voting would let the owner complete a C-instance beyond what
            # our vote reported, then execute it in a slot its stale O-commit names and the
            # new view gave to someone else. Once the owner is in our view, its O-commits
            # from the old view are forgotten and it re-sends.
            return
        key = (msg.owner, msg.index)
        self._ballot_seen = max(self._ballot_seen, msg.ballot)
        inst = self.c.get(key)
        floor = max(self._promised(msg.owner, msg.index), inst.ballot if inst else -1)
        if msg.ballot < floor:
            self._send(
                msg.src,
                CNack(src=self.me, view=self.view, owner=msg.owner, index=msg.index, ballot=floor),
            )
            return
        if inst is not None and inst.committed:
            # Chosen already: acknowledging is harmless (it is the chosen value by Paxos).
            pass
        elif inst is None or msg.ballot > inst.ballot or inst.batch != msg.batch:
            if inst is None:
                inst = self.c[key] = CInstance(msg.ballot, msg.batch)
            else:
                inst.ballot, inst.batch = msg.ballot, msg.batch
                inst.sent_to = frozenset()  # whatever we sent was for another ballot
            self.c_high[msg.owner] = max(self.c_high[msg.owner], msg.index)
            self._out.persist.append(
                CAcceptedRecord(
                    owner=msg.owner, index=msg.index, ballot=msg.ballot, batch=msg.batch
                )
            )
            if msg.owner == self.me and msg.index >= self.next_index:
                self.next_index = msg.index + 1  # a recoverer used it: never reuse it
        ack = CAck(src=self.me, view=self.view, owner=msg.owner, index=msg.index, ballot=msg.ballot)
        if self._acks_to_all:
            for peer in self._peers:
                self._send(peer, ack)
        else:
            self._send(msg.src, ack)
        if self.is_sequencer:
            self._order(msg.owner, msg.index)
            self._learn_keys(msg.owner, msg.index, msg.batch)
        self._learn_from_acks(key, inst)

    def _on_ccommit(self, msg: CCommit) -> None:
        key = (msg.owner, msg.index)
        inst = self.c.get(key)
        if inst is not None and inst.committed:
            return
        if msg.batch is None:
            if inst is None or inst.ballot != msg.ballot or inst.batch is None:
                self._catchup_lacks_values = True  # we lack the chosen value: Catchup brings it
                return
        elif inst is None:
            inst = self.c[key] = CInstance(msg.ballot, msg.batch)
            self._values_to_log.add(key)
        elif inst.ballot != msg.ballot or inst.batch != msg.batch:
            inst.ballot, inst.batch = msg.ballot, msg.batch
            self._values_to_log.add(key)
        self._learn_c_chosen(msg.owner, msg.index, inst)

    def _learn_c_chosen(self, owner: int, index: int, inst: CInstance) -> None:
        """``C[owner][index]`` was chosen with the value ``inst`` holds (we did not lead it)."""
        self._c_acks_seen.pop((owner, index), None)
        inst.committed = True
        inst.leading = False
        self._reproposing.discard((owner, index))
        if owner == self.me:
            if index >= self.next_index:
                self.next_index = index + 1  # never reuse an index someone decided
            self._own_decided(index, inst)
            self._check_ready()

    def _on_cnack(self, msg: CNack) -> None:
        self._ballot_seen = max(self._ballot_seen, msg.ballot)
        inst = self.c.get((msg.owner, msg.index))
        if inst is not None and inst.leading and inst.ballot < msg.ballot:
            inst.leading = False  # overtaken: a recoverer owns the instance now
            inst.overtaken_at = self.now
            self._reproposing.discard((msg.owner, msg.index))
        recovery = self._recoveries.get(msg.owner)
        if recovery is not None and recovery.ballot < msg.ballot:
            del self._recoveries[msg.owner]  # a higher Prepare is under way elsewhere

    # ------------------------------------------------------------------ C-instance recovery
    def _start_recovery(self, owner: int, from_index: int) -> None:
        ballot = next_ballot(max(self._ballot_seen, self.me), self.me)
        self._ballot_seen = ballot
        recovery = Recovery(owner, from_index, ballot, self.now)
        self._recoveries[owner] = recovery
        self.recoveries_started += 1
        prepare = self._prepare_of(recovery)
        self._broadcast(prepare)
        self._on_cprepare(prepare)  # our own promise

    def _prepare_of(self, recovery: Recovery) -> CPrepare:
        return CPrepare(
            src=self.me,
            view=self.view,
            owner=recovery.owner,
            from_index=recovery.from_index,
            ballot=recovery.ballot,
        )

    def _ask_again(self, recovery: Recovery) -> None:
        """No majority promised in time: the Prepare again, at the same ballot, to the peers
        that did not answer. A higher ballot would void the promises on their way: past
        saturation a round trip outlasted the timeout, and owners prepared their own instances
        over and over, holding back every proposal meanwhile. (A peer that promised a higher
        ballot says so with a CNack, which ends the recovery.) It asks from our execution
        frontier: a peer that compacted past the old start answered with its snapshot, and
        the promises already in cover every later index too."""
        recovery.asked_at = self.now
        recovery.from_index = max(recovery.from_index, self._exec_count[recovery.owner])
        prepare = self._prepare_of(recovery)
        for peer in range(self.n):
            if peer != self.me and peer not in recovery.promises:
                self._send(peer, prepare)

    def _on_cprepare(self, msg: CPrepare) -> None:
        self._ballot_seen = max(self._ballot_seen, msg.ballot)
        if msg.from_index < self._base_counts[msg.owner]:
            # We accepted (and executed) instances there whose values only our snapshot holds
            # now: a promise reporting nothing would let the recoverer choose a no-op over a
            # chosen value. It needs the snapshot instead (and then recovers from beyond it).
            if msg.src != self.me:
                self._out.snapshot_requests.append(msg.src)
            return
        promised = self._c_promised.get(msg.owner)
        if promised is not None and promised[0] > msg.ballot:
            if msg.src != self.me:
                nack = CNack(
                    src=self.me,
                    view=self.view,
                    owner=msg.owner,
                    index=msg.from_index,
                    ballot=promised[0],
                )
                self._send(msg.src, nack)
            return
        from_index = msg.from_index if promised is None else min(msg.from_index, promised[1])
        self._c_promised[msg.owner] = (msg.ballot, from_index)
        self._out.persist.append(
            CPromiseRecord(owner=msg.owner, from_index=from_index, ballot=msg.ballot)
        )
        accepted, through = self._promise_page(msg.owner, msg.from_index)
        promise = CPromise(
            src=self.me,
            view=self.view,
            owner=msg.owner,
            from_index=msg.from_index,
            ballot=msg.ballot,
            accepted=accepted,
            high=self.c_high[msg.owner],
            through=through,
        )
        if msg.src == self.me:
            self._on_cpromise(promise)
        else:
            self._send(msg.src, promise)

    def _promise_page(self, owner: int, from_index: int) -> tuple[tuple[CVote, ...], int]:
        """What we accepted of ``owner``'s instances from ``from_index`` on, as far as one
        message holds (``PROMISE_PAGE_BYTES`` of batches, ``PROMISE_PAGE_VOTES`` votes), and
        the last index it reports on (``EVERY_INDEX``: all of them)."""
        votes: list[CVote] = []
        budget = PROMISE_PAGE_BYTES
        for index in range(from_index, self.c_high[owner] + 1):
            inst = self.c.get((owner, index))
            if inst is None or inst.batch is None:
                continue
            size = batch_size(inst.batch)
            if votes and (size > budget or len(votes) == PROMISE_PAGE_VOTES):
                return tuple(votes), index - 1
            budget -= size
            votes.append(CVote(index=index, ballot=inst.ballot, batch=inst.batch))
        return tuple(votes), EVERY_INDEX

    def _on_cpromise(self, msg: CPromise) -> None:
        recovery = self._recoveries.get(msg.owner)
        if recovery is None or recovery.ballot != msg.ballot:
            return
        if msg.from_index != recovery.from_index:
            return  # an answer to an earlier page's (or an earlier ask's) Prepare
        recovery.promises[msg.src] = msg
        if len(recovery.promises) < self.q:
            return
        del self._recoveries[msg.owner]
        promised = self._c_promised.get(msg.owner)
        if promised is not None and promised[0] > recovery.ballot:
            # We promised a higher recoverer meanwhile: accepting our own proposal at this
            # ballot would break that promise, and it could then be chosen beside the value
            # the other recovery picks (N=3 seed 390 at 6 clients per site: a no-op and a
            # batch were both chosen for one instance).
            return
        if msg.owner == self.me:
            self._own_ballot = max(self._own_ballot, recovery.ballot)
        # Re-propose the highest-ballot value per index; a no-op where nothing was accepted.
        best: dict[int, CVote] = {}
        high = max(p.high for p in recovery.promises.values())
        for promise in recovery.promises.values():
            for vote in promise.accepted:
                if vote.index not in best or vote.ballot > best[vote.index].ballot:
                    best[vote.index] = vote
        high = max(high, self._known_o_count(msg.owner) - 1)
        # Where no promise reports a value any value is safe: ours take our own proposals
        # (those held for this recovery too), a no-op fills the rest.
        ours = self._unready if msg.owner == self.me else {}
        high = max(high, max(ours, default=-1))
        # executed here meanwhile means chosen, and perhaps compacted away: never re-proposed
        first = max(recovery.from_index, self._exec_count[msg.owner])
        # A paged promise reports on its page only: beyond the shortest page a value some
        # acceptor of the majority accepted may be unknown here, so no no-op goes there yet.
        last = min(high, min(p.through for p in recovery.promises.values()))
        for index in range(first, last + 1):
            inst = self.c.get((msg.owner, index))
            if inst is not None and inst.committed:
                continue
            found = best.get(index)
            batch: Batch = found.batch if found is not None else ours.get(index, ())
            self._propose_recovered(msg.owner, index, recovery.ballot, batch)
        if last < high:
            # the next page, at the same ballot: the promises already cover every index from
            # the first page's start, so this only fetches what the acceptors accepted there
            recovery.from_index = max(last + 1, first)
            recovery.promises = {}
            self._recoveries[msg.owner] = recovery
            self._ask_again(recovery)
            self._on_cprepare(self._prepare_of(recovery))  # our own report on the page

    def _propose_recovered(self, owner: int, index: int, ballot: int, batch: Batch) -> None:
        inst = self.c.get((owner, index))
        if inst is None:
            inst = self.c[(owner, index)] = CInstance(ballot, batch)
        else:
            inst.ballot, inst.batch = ballot, batch
        inst.leading = True
        inst.acks = {self.me}
        inst.sent_at = self.now
        inst.sent_to = frozenset(self._peers)  # broadcast below
        self._reproposing.add((owner, index))  # ours too: a no-op is in no client's batch
        if owner == self.me and index >= self.next_index:
            # an index of ours that was referenced but never proposed: it is used now, by
            # this no-op, and never again (same ballot, two values would break Paxos)
            self.next_index = index + 1
        self.c_high[owner] = max(self.c_high[owner], index)
        self._out.persist.append(
            CAcceptedRecord(owner=owner, index=index, ballot=ballot, batch=batch)
        )
        accept = CAccept(
            src=self.me, view=self.view, owner=owner, index=index, ballot=ballot, batch=batch
        )
        self._broadcast(accept)
        if self.is_sequencer:
            self._order(owner, index)

    def _known_o_count(self, owner: int) -> int:
        """O-instances for ``owner`` we know of (executed, then beyond the frontier)."""
        count = self._exec_count[owner]
        for slot in range(self.exec_slot, self.o_high):
            if self.o_value.get(slot) == owner:
                count += 1
        return count

    # ------------------------------------------------------------------ O-phase (sequencer)
    def _on_crequest(self, msg: CRequest) -> None:
        if not self.is_sequencer:
            return
        slots = self.seq_slots[msg.owner]
        # Checked before ordering: a CRequest for an instance already ordered is a
        # retransmission (the requester lost OAccepts); a fresh one is answered by the
        # OAccept broadcast that ordering it produces.
        already = slots.base <= msg.index < len(slots)
        self._order(msg.owner, msg.index, msg.keys)
        if self.role is not Role.SEQUENCER or not already:
            return
        # Re-send everything from the requester's gap-free prefix through its instance's slot.
        self._resend_oaccepts(msg.src, msg.o_prefix, slots[msg.index] + 1)

    def _order(self, owner: int, index: int, keys: tuple[str, ...] | None = None) -> None:
        """Propose ``owner`` in new O-instances until it owns ``index + 1`` of them. ``keys``:
        what a ``CRequest`` names for ``C[owner][index]``; None when we hold its value (the
        history table then takes the keys from the batch itself)."""
        if self.role is not Role.SEQUENCER:
            if self.is_sequencer:
                if keys is None:
                    inst = self.c.get((owner, index))
                    keys = _keys_of(inst.batch if inst is not None else None)
                self._deferred_orders.append((owner, index, keys))
            return
        slots = self.seq_slots[owner]
        while len(slots) <= index:
            slot = self.seq_next_slot
            self.seq_next_slot += 1
            k = len(slots)
            slots.append(slot)
            entry = OEntry(slot=slot, owner=owner)
            self._oaccept_out.append(entry)
            self._accept_o(entry, self.view)
            inst = self.c.get((owner, k))
            if inst is not None and inst.batch is not None:
                self._note_update(slot, inst.batch)
            elif k == index and keys:
                for key in keys:
                    self.history[key] = slot
            else:
                self._unknown_keys[(owner, k)] = slot  # ordered before we saw it

    def _note_update(self, slot: int, batch: Batch) -> None:
        """History table: ``slot`` updates the keys of ``batch`` (a command naming no keys
        counts as updating every key). On the sequencer's path for every command: it walks the
        batch once, where building ``_keys_of`` (a sorted union) twice per CAccept took a fifth
        of a loaded sequencer's CPU."""
        history = self.history
        for command in batch:
            if not command.keys:
                self._history_floor = max(self._history_floor, slot)
                return  # the keys noted so far were right too, and the floor covers the rest
            for key in command.keys:
                if history.get(key, -1) < slot:
                    history[key] = slot

    def _learn_keys(self, owner: int, index: int, batch: Batch) -> None:
        slot = self._unknown_keys.pop((owner, index), None)
        if slot is not None:
            self._note_update(slot, batch)

    def _resend_oaccepts(self, to: int, start: int, stop: int) -> None:
        stop = min(stop, self.seq_next_slot, start + CATCHUP_BATCH)
        entries = tuple(
            OEntry(slot=s, owner=self.o_value[s]) for s in range(start, stop) if s in self.o_value
        )
        if entries:
            self._send(to, OAccept(src=self.me, view=self.view, entries=entries))

    def _flush_order_messages(self) -> None:
        """Send this turn's OAccepts, OAcks and OCommits: one message of each per peer."""
        self._flush_oaccepts()
        self._flush_acks()

    def _flush_oaccepts(self) -> None:
        if self._oaccept_out:
            for entries in _pages(self._oaccept_out, MAX_ENTRIES):
                self._out.persist.append(OAcceptedRecord(view=self.view, entries=entries))
                self._broadcast(OAccept(src=self.me, view=self.view, entries=entries))
            self._oaccept_out.clear()
            self._after_seq_acks()

    def _flush_acks(self) -> None:
        for dest in sorted(self._oack_out):
            for slots in _pages(self._oack_out[dest], MAX_SLOTS):
                self._send(dest, OAck(src=self.me, view=self.view, slots=slots))
        self._oack_out.clear()
        for entries in _pages(self._ocommit_out, MAX_ENTRIES):
            self._broadcast(OCommit(src=self.me, view=self.view, entries=entries))
        self._ocommit_out.clear()

    # ------------------------------------------------------------------ O-phase (acceptor)
    def _on_oaccept(self, msg: OAccept) -> None:
        if msg.src != self.sequencer or not self.view_ready:
            return
        fresh: list[OEntry] = []
        for entry in msg.entries:
            if self.o_ballot.get(entry.slot, -1) < msg.view or entry.slot not in self.o_value:
                if entry.slot < self.exec_slot:
                    continue  # executed: nothing to accept (the value is chosen)
                fresh.append(entry)
                self._accept_o(entry, msg.view)
            elif self.o_value[entry.slot] != entry.owner:
                continue  # two values for one slot in one view: impossible without a bug
            elif entry.owner == self.me and entry.slot not in self.o_committed:
                self._learn_own(entry.slot)  # e.g. we restarted and forgot the commit
            # a duplicate is acknowledged again below: its first OAck may have been lost
            self._queue_oack(entry)
        if fresh:
            self._out.persist.append(OAcceptedRecord(view=msg.view, entries=tuple(fresh)))

    def _accept_o(self, entry: OEntry, ballot: int) -> None:
        """Record an O-instance accepted here (by the sequencer itself, or from an OAccept)."""
        slot, owner = entry.slot, entry.owner
        self.o_value[slot] = owner
        self.o_ballot[slot] = ballot
        if ballot > self.accepted_view:  # (only after its NewView: this bound is a safe one)
            self.accepted_view, self.accepted_from = ballot, slot
        if slot >= self.o_high:
            self.o_high = slot + 1
        if owner == self.me:
            self._window_got += 1
            self._learn_own(slot)
        else:
            # the sequencer and we accepted it: with three replicas it is chosen, and its
            # learner's OCommit would take a one-way delay longer to tell us; with five, the
            # acknowledgements that came before the OAccept may complete a majority
            self._learn_chosen(slot)
        self._advance_prefix()
        if self._five and not self.is_sequencer:
            self._check_ready()

    def _advance_prefix(self) -> None:
        """The gap-free prefix of O-instances we accepted (N=5's ready rule): executed slots,
        then those accepted in this view. An entry from an older view may be stale, so it
        stops the prefix until it executes."""
        if self.o_prefix < self.exec_slot:
            self.o_prefix = self.exec_slot
            self._prefix_mine = self._exec_count[self.me]
        while self.o_ballot.get(self.o_prefix, -1) == self.view:
            if self.o_value[self.o_prefix] == self.me:
                self._prefix_mine += 1
            self.o_prefix += 1

    def _queue_oack(self, entry: OEntry) -> None:
        """Acknowledge an accepted O-instance to whoever learns from it. The learner (the
        command leader) counts acknowledgements itself, and with three replicas the sequencer
        too: ours tells it the slot is chosen a round trip to the learner sooner than the
        learner's OCommit would. With five, the learner commits on the sequencer's OAccept
        alone and the sequencer needs every acknowledgement (its ready rule looks at the
        majority-accepted prefix); the others learn others' slots from a majority of them, a
        round trip sooner than through the owner's OCommit. Every later slot a replica
        executes waits for each of them. (A learner's own OCommit goes out now anyway.)"""
        owner = entry.owner
        if owner == NO_CL:
            return
        if self._five:
            to_all = self._acks_to_all and owner != self.me
            targets = self._peers if to_all else (self.sequencer,)
        elif self.q == 2 and owner not in (self.sequencer, self.me):
            targets = (owner, self.sequencer)
        else:
            targets = (owner,)
        for dest in targets:
            if dest != self.me:
                self._oack_out.setdefault(dest, []).append(entry.slot)

    def _learn_own(self, slot: int) -> None:
        """We (the learner) accepted our own O-instance ``slot``: is it committed yet?"""
        if self._five and not self.is_sequencer:
            self._commit_o(slot)  # Figure 5, line 29
        elif not self._five:
            self._learn_chosen(slot)

    def _learn_chosen(self, slot: int) -> None:
        """O[slot] is chosen once a majority accepted it at this view's ballot: the
        sequencer (it proposed it), us, and the acknowledgements we collected."""
        if self.o_ballot.get(slot) != self.view or slot in self.o_committed:
            return
        acks = self.o_acks.get(slot, set()) | {self.me, self.sequencer}
        if len(acks) >= self.q:
            self._commit_o(slot)

    def _on_oack(self, msg: OAck) -> None:
        if not self.view_ready:
            return
        if self._five and self.role is Role.SEQUENCER:
            for slot in msg.slots:
                self._seq_record_ack(msg.src, slot)
            self._after_seq_acks()
        # Any replica may learn a slot from acknowledgements: the learner in the normal case,
        # anyone stuck on a slot whose learner forgot it (they come with a Catchup answer).
        for slot in msg.slots:
            if slot in self.o_committed or slot < self.exec_slot:
                continue
            self.o_acks.setdefault(slot, set()).add(msg.src)  # may precede our OAccept
            self._learn_chosen(slot)

    def _seq_record_ack(self, src: int, slot: int) -> None:
        prefix = self.seq_acked_prefix[src]
        if slot < prefix:
            return
        acked = self.seq_acked[src]
        acked.add(slot)
        while prefix in acked:
            acked.discard(prefix)
            prefix += 1
        self.seq_acked_prefix[src] = prefix

    def _majority_prefix(self) -> int:
        prefixes = sorted(
            (self.seq_next_slot if rid == self.me else self.seq_acked_prefix[rid])
            for rid in range(self.n)
        )
        return prefixes[self.n - self.q]

    def _after_seq_acks(self) -> None:
        """N=5 sequencer: its own O-instances inside the majority-accepted prefix are chosen."""
        if not (self._five and self.role is Role.SEQUENCER):
            return
        mine = self.seq_slots[self.me]
        chosen = mine.count_below(self._majority_prefix())
        for i in range(max(self._seq_own_chosen, mine.base), chosen):
            self._commit_o(mine[i])
        self._seq_own_chosen = max(self._seq_own_chosen, chosen)
        self._check_ready()

    def _commit_o(self, slot: int) -> None:
        # executed slots leave o_committed: never count one of them again
        if slot in self.o_committed or slot < self.exec_slot:
            return
        self.o_committed.add(slot)
        self.o_acks.pop(slot, None)
        owner = self.o_value[slot]
        if owner == self.me:
            self._my_committed_o += 1
            self._ocommit_out.append(OEntry(slot=slot, owner=owner))
            self._check_ready()

    def _on_ocommit(self, msg: OCommit) -> None:
        if not self.view_ready:
            return
        for entry in msg.entries:
            if entry.slot < self.exec_slot or entry.slot in self.o_committed:
                continue
            known = self.o_value.get(entry.slot)
            if known is None:
                # learned, not accepted: usable to execute, never reported in a vote
                self.o_value[entry.slot] = entry.owner
                if entry.slot >= self.o_high:
                    self.o_high = entry.slot + 1
            elif known != entry.owner:
                if self.o_ballot.get(entry.slot, -1) >= self.view:
                    continue  # one proposer per view: a conflict here would be a bug
                # we hold a value accepted in an older view that a later view replaced; the
                # chosen one wins (learned, not accepted: it is not ours to report in a vote)
                self.o_value[entry.slot] = entry.owner
                self.o_ballot.pop(entry.slot, None)
            self.o_committed.add(entry.slot)
            if entry.owner == self.me:
                self._my_committed_o += 1
        self._check_ready()

    # ------------------------------------------------------------------ readiness
    def _ordered_own(self) -> int:
        """How many of my C-instances the ready rule considers durably ordered."""
        if not self._five:
            return self._my_committed_o
        if self.is_sequencer:
            if self.role is not Role.SEQUENCER:
                return self._exec_count[self.me]
            if "go_ready_rule" in self._unsafe:
                return len(self.seq_slots[self.me])
            return self.seq_slots[self.me].count_below(self._majority_prefix())
        return self._prefix_mine

    def _check_ready(self) -> None:
        if not self._unready:
            return
        ordered = self._ordered_own()
        for index in sorted(self._unready):
            if index >= ordered:
                break
            inst = self.c[(self.me, index)]
            if inst.committed:
                batch = self._unready.pop(index)
                if inst.batch == batch:
                    self._out.ready.extend(batch)

    # ------------------------------------------------------------------ execution
    def _try_execute(self) -> None:
        if not self.view_ready:
            return
        while True:
            slot = self.exec_slot
            if slot not in self.o_committed:
                return
            owner = self.o_value[slot]
            if owner == NO_CL:
                self.log[slot] = (NO_CL, NO_INDEX)
            else:
                index = self._exec_count[owner]
                inst = self.c.get((owner, index))
                if inst is None or not inst.committed or inst.batch is None:
                    return
                led_here = owner == self.me
                # executed implies chosen and ordered for good: whatever the ready rule still
                # waits for (a lost OAck, say), the command is ready now
                proposed = self._unready.pop(index, None) if led_here else None
                if led_here and self._restart_batches:
                    found = self._restart_batches.pop(index, None)
                    proposed = proposed if proposed is not None else found
                if proposed is not None and proposed == inst.batch:
                    self._out.ready.extend(inst.batch)
                if self._unknown_keys:
                    self._learn_keys(owner, index, inst.batch)
                for offset, command in enumerate(inst.batch):
                    self._out.apply.append(Execution(slot, offset, command, led_here))
                self._exec_count[owner] = index + 1
                self.log[slot] = (owner, index)
            # the slot is done: forget what only the unexecuted part of the log needs
            self.o_committed.discard(slot)
            self.o_acks.pop(slot, None)
            self.exec_slot = slot + 1
            self._exec_progress_at = self.now
            if self.o_prefix < self.exec_slot:
                self._advance_prefix()

    def _log_executed(self) -> None:
        """Record the slots executed since the last record (``ExecutedRecord``), after the
        chosen values among them that our records lack: a restart executes them again from
        its own records (``_replay_executed``) instead of re-learning the log from peers."""
        start = max(self._logged_exec, self._compacted)
        if start >= self.exec_slot:
            return
        owners: list[int] = []
        ballots: list[int] = []
        for slot in range(start, self.exec_slot):
            owner, index = self.log[slot]
            owners.append(owner)
            if owner == NO_CL:
                ballots.append(0)
                continue
            inst = self.c[(owner, index)]
            ballots.append(inst.ballot)
            if (owner, index) in self._values_to_log:
                self._values_to_log.discard((owner, index))
                assert inst.batch is not None
                self._out.log.append(
                    CAcceptedRecord(owner=owner, index=index, ballot=inst.ballot, batch=inst.batch)
                )
        for offset in range(0, len(owners), MAX_SLOTS):
            self._out.log.append(
                ExecutedRecord(
                    start=start + offset,
                    owners=tuple(owners[offset : offset + MAX_SLOTS]),
                    ballots=tuple(ballots[offset : offset + MAX_SLOTS]),
                )
            )
        self._logged_exec = self.exec_slot

    def _replay_executed(self, executed: Mapping[int, tuple[int, int]]) -> None:
        """After a restart: execute again, from our own records, the slots an
        ``ExecutedRecord`` says we executed (slot -> (owner, ballot) of its C-instance).
        Executed means chosen: a value we hold for that instance at its chosen ballot or a
        higher one is the chosen value (Paxos). Stops at the first slot whose value the
        records lack (a crash between the two writes): peers bring the rest, as before."""
        if "replay_accepted" in self._unsafe:
            # broken on purpose: every accepted O-instance taken as chosen, at any ballot
            executed = {
                **{s: (o, 0) for s, o in self.o_value.items() if s >= self.exec_slot},
                **executed,
            }
        while self.exec_slot in executed:
            slot = self.exec_slot
            owner, ballot = executed[slot]
            if owner == NO_CL:
                self.log[slot] = (NO_CL, NO_INDEX)
            else:
                index = self._exec_count[owner]
                inst = self.c.get((owner, index))
                if inst is None or inst.batch is None or inst.ballot < ballot:
                    break
                inst.committed = True
                led_here = owner == self.me
                for offset, command in enumerate(inst.batch):
                    self._out.apply.append(Execution(slot, offset, command, led_here))
                self._exec_count[owner] = index + 1
                self.log[slot] = (owner, index)
            self.exec_slot = slot + 1
        self._logged_exec = self.exec_slot
        self.next_index = max(self.next_index, self._exec_count[self.me])

    # ------------------------------------------------------------------ views
    def _join_view(self, view: int) -> None:
        """Enter a higher view: promise to reject lower O-proposals; stop executing until
        its NewView arrives."""
        # O-phase messages queued this turn belong to the view they were made in: stamped
        # with the new one, a deposed sequencer's proposals would become the new view's
        # (in its records too, so a restart would bring back a second value for a slot).
        self._flush_order_messages()
        self.view = view
        self._out.persist.append(ViewRecord(view=view))
        self.view_ready = False
        # A commit learned in an older view may be one the new view replaces (with N=5 a
        # command leader commits on the sequencer's OAccept alone). Forget them all: in the
        # new view they come back from its NewView or, as executed facts, from Catchup.
        self.o_committed.clear()
        self.o_acks.clear()
        self._my_committed_o = self._exec_count[self.me]
        # Likewise the N=5 ready rule's prefix counts only acceptances in the current view:
        # ours from an older view (as a deposed sequencer's own proposals, say) prove nothing.
        self.o_prefix = self.exec_slot
        self._prefix_mine = self._exec_count[self.me]
        self.role = Role.FOLLOWER
        self._votes.clear()
        self._new_view = None
        self._new_view_acks.clear()
        self._deferred_orders.clear()
        self._lease_from.clear()
        self._suspects.clear()
        self._suspecting = False
        self._slow_windows = 0
        self._force_election_at = -1
        self._last_view_change_at = self.now
        self._seq_alive_at = self.now
        self._higher_view_seen = 0
        self._prevote_view = -1
        self._roll_election_timeout()

    def _may_vote_for(self, candidate: int) -> bool:
        if self.now < self._vote_block_until:
            return False
        bound = self.lease_granted_to not in (-1, candidate)
        return not (bound and self.now < self.lease_granted_until)

    def _start_candidacy(self) -> None:
        view = max(self._target_view(), self._prevote_view)
        self._prevote_view = -1
        self._join_view(view)
        self.role = Role.CANDIDATE
        self._candidate_since = self.now
        self._candidate_from = self.exec_slot
        self._votes[self.me] = self._make_vote(self.exec_slot)
        self._broadcast(VRequest(src=self.me, view=view, from_slot=self.exec_slot))
        if len(self._votes) >= self.q:
            self._rebuild()

    def _make_vote(self, from_slot: int) -> Vote:
        # Executed slots are chosen: report them at our current view (no ballot can beat a
        # chosen value with another one). Then what we accepted, at its ballot; values we
        # only learned from a commit are not ours to report.
        executed = tuple(
            OVote(slot=s, owner=self.log[s][0], ballot=self.view)
            for s in range(from_slot, self.exec_slot)
        )
        accepted = tuple(
            OVote(slot=s, owner=self.o_value[s], ballot=self.o_ballot[s])
            for s in range(max(from_slot, self.exec_slot), self.o_high)
            if self.o_ballot.get(s, -1) >= 0
        )
        entries = executed + accepted
        return Vote(
            src=self.me,
            view=self.view,
            accepted_view=self.accepted_view,
            accepted_from=self.accepted_from,
            executed=self.exec_slot,
            entries=entries,
            c_high=tuple(self.c_high),
        )

    def _on_vrequest(self, msg: VRequest) -> None:
        if msg.view < self.view or msg.src != msg.view % self.n:
            return
        if not self._may_vote_for(msg.src):
            return
        if msg.from_slot < self._compacted:
            # The slots it asks about are chosen, but we hold them only in our snapshot: a vote
            # without them could let the candidate fill them with holes. It installs the
            # snapshot and asks again from its new execution frontier.
            self._out.snapshot_requests.append(msg.src)
            return
        if msg.from_slot + VIEW_SPAN < self.exec_slot:
            # A candidate that far behind would get a vote (and send a NewView) sized by the
            # log it missed. A nearer replica leads the view; this one catches up under it.
            return
        if msg.view > self.view:
            self._join_view(msg.view)
        elif self.role is not Role.FOLLOWER or self.view_ready:
            return  # this view is already under way past its election
        vote = self._make_vote(msg.from_slot)
        if len(vote.entries) > MAX_ENTRIES:
            # (ordered far beyond what we executed: cannot happen while execution keeps up)
            # a vote that would not fit a message is no vote; another replica leads
            return
        self._send(msg.src, vote)

    def _on_vote(self, msg: Vote) -> None:
        if self.role is not Role.CANDIDATE or len(msg.c_high) != self.n:
            return
        self._votes[msg.src] = msg
        if len(self._votes) >= self.q:
            self._rebuild()

    def _rebuild(self) -> None:
        """Figure 7: rebuild the assignment log from a majority of votes."""
        start = self._candidate_from
        executed = self._executed_prefix() if self._five else []
        if executed is None:  # lagging voters were sent our snapshot instead
            if len(self._votes) >= self.q:
                self._rebuild()
            return
        best: dict[int, OVote] = {}
        for vote in self._votes.values():
            for entry in vote.entries:
                if entry.slot >= start and (
                    entry.slot not in best or entry.ballot > best[entry.slot].ballot
                ):
                    best[entry.slot] = entry
        # A value accepted in a view older than the newest one a voter accepted (V) cannot
        # have been chosen if, at or after the start of V's NewView, that voter has nothing
        # in its slot: chosen before V's election, V's NewView would have carried it to the
        # voter; after it, a majority had promised V. Such a leftover of a deposed sequencer
        # must not come back: it would give its owner a slot, before commands already ready,
        # for an index the owner never proposed — and the owner's next command would land there.
        newest = max(vote.accepted_view for vote in self._votes.values())
        witnesses = [
            (vote.accepted_from, {entry.slot for entry in vote.entries})
            for vote in self._votes.values()
            if vote.accepted_view == newest
        ]
        for slot in [s for s, e in best.items() if e.ballot < newest]:
            if any(slot >= since and slot not in seen for since, seen in witnesses):
                del best[slot]
        end = max(best, default=start - 1) + 1
        owners: list[int | None] = [None] * (end - start)
        for slot, entry in best.items():
            owners[slot - start] = entry.owner
        # the slots we executed that some voter has not: chosen, so proposed as they are
        owners[:0] = executed
        start -= len(executed)
        if self._five and "no_hole_filling" not in self._unsafe:
            old_sequencer = max(v.accepted_view for v in self._votes.values()) % self.n
            untraced = [
                rid for rid in range(self.n) if rid not in self._votes and rid != old_sequencer
            ]
            if old_sequencer not in self._votes and len(untraced) == 1:
                m = untraced[0]
                needed = max(v.c_high[m] for v in self._votes.values()) + 1
                before = self._exec_count[m] - executed.count(m)  # m's slots below start
                self._fill_for(m, needed, before, owners)
        if len(owners) > MAX_SLOTS:
            # More than one NewView carries (votes far apart, or a vast hole filling): no
            # view from here. The election times out and another candidacy starts from
            # further on (its executed frontier, or another replica's).
            self._votes.clear()
            self.too_wide_views += 1
            return
        filled = tuple(NO_CL if owner is None else owner for owner in owners)
        new_view = NewView(src=self.me, view=self.view, start=start, owners=filled)
        self.role = Role.ESTABLISHING
        self._votes.clear()
        self._new_view = new_view
        self._new_view_acks = {self.me}
        self._new_view_sent_at = self.now
        self._accept_new_view(new_view)
        self._broadcast(new_view)
        if len(self._new_view_acks) >= self.q:
            self._become_sequencer()

    def _executed_prefix(self) -> list[int] | None:
        """With five replicas, the owners of the slots we executed and some voter did not.

        A five-replica O-instance is committed on the sequencer's OAccept alone, so a slot
        executed in an older view may be accepted by its owner and that view's sequencer only,
        and a voter that learned it from a commit forgets it on a restart. The proof of
        consistency assumes each view change leaves every O-instance before it accepted by a
        majority: so the new view re-proposes, from the lowest execution frontier among the
        voters, the values we executed (chosen, hence safe to propose). If that frontier is
        below our compaction point we no longer know them: the voters behind it get our
        snapshot instead, and their votes do not count.
        """
        for src in [s for s, v in self._votes.items()
                    if v.executed + VIEW_SPAN < self._candidate_from]:
            # that voter would make the NewView re-propose a log's worth of slots: it catches
            # up under the new view instead, and the candidate waits for nearer votes
            del self._votes[src]
        if len(self._votes) < self.q:
            return None
        lowest = min(vote.executed for vote in self._votes.values())
        if lowest >= self._candidate_from:
            return []
        if lowest < self._compacted:
            for src in [s for s, v in self._votes.items() if v.executed < self._compacted]:
                del self._votes[src]
                self._out.snapshot_requests.append(src)
            return None
        return [self.log[slot][0] for slot in range(lowest, self._candidate_from)]

    @staticmethod
    def _fill_for(m: int, needed: int, before: int, owners: list[int | None]) -> None:
        """Propose ``m`` in the first holes until it owns ``needed`` O-instances (``before``
        of them below the new view's start) with no hole before the last of them (Figure 7,
        lines 32-36), and no more than that.

        Figure 7 stops at "at least": a hole filled in front of ``m``'s slots from the votes
        leaves ``m`` more O-instances than it has C-instances that may be ready, and the
        surplus places ``m``'s *next* proposal in a slot before commands ordered (and ready)
        after this view change: a read proposed after a write was acknowledged ran before it
        (N=5 seed 362 with every fault). Nothing of ``m``'s beyond the ``needed``-th can be
        chosen (``needed`` bounds them: a chosen C-instance was accepted by a voter), so
        those slots propose no one."""
        # One pass (filling the first hole and counting again was quadratic: a candidate
        # spent seconds on a vote naming thousands of m's instances): until m owns
        # ``needed``, every hole gets m; the needed-th then has no hole before it.
        count = before
        last_needed = NO_POSITION
        for position, owner in enumerate(owners):
            if count >= needed:
                break
            if owner is None:
                owners[position] = owner = m
            if owner == m:
                count += 1
                if count == needed:
                    last_needed = position
        while count < needed:
            owners.append(m)
            count += 1
            last_needed = len(owners) - 1
        for position in range(last_needed + 1, len(owners)):
            if owners[position] == m:
                owners[position] = None

    def _accept_new_view(self, msg: NewView) -> None:
        start, owners = msg.start, msg.owners
        self._out.persist.append(NewViewRecord(view=msg.view, start=start, owners=owners))
        self._install_new_view(msg.view, start, owners)
        self.view_ready = True
        self._resend_own_after_view_change()

    def _install_new_view(self, view: int, start: int, owners: tuple[int, ...]) -> None:
        end = start + len(owners)
        for slot in range(max(start, self.exec_slot), end):
            self.o_value[slot] = owners[slot - start]
            self.o_ballot[slot] = view
            self.o_committed.discard(slot)
        for slot in range(max(end, self.exec_slot), self.o_high):
            if self.o_ballot.get(slot, -1) < view:
                self.o_value.pop(slot, None)
                self.o_ballot.pop(slot, None)
                self.o_committed.discard(slot)
        if view > self.accepted_view:
            self.accepted_view, self.accepted_from = view, start
        elif view == self.accepted_view:
            self.accepted_from = max(self.accepted_from, start)  # a replay: never lower it
        self._recount_o_state()

    def _recount_o_state(self) -> None:
        """Recompute what is derived from the O-instances known (after a log was replaced)."""
        self.o_acks.clear()
        self.o_high = max(self.o_value, default=-1) + 1
        self.o_prefix = self.exec_slot
        self._prefix_mine = self._exec_count[self.me]
        self._advance_prefix()
        self._my_committed_o = self._exec_count[self.me] + sum(
            1 for s in self.o_committed if s >= self.exec_slot and self.o_value.get(s) == self.me
        )

    def _resend_accept(self, owner: int, index: int, inst: CInstance) -> None:
        """Send ``C[owner][index]``'s Accept again to the peers that did not acknowledge it."""
        accept = CAccept(
            src=self.me,
            view=self.view,
            owner=owner,
            index=index,
            ballot=inst.ballot,
            batch=inst.batch or (),
        )
        targets = [peer for peer in self._peers if peer not in inst.acks]
        for peer in targets:
            self._send(peer, accept)
        inst.sent_to |= frozenset(targets)

    def _resend_own_after_view_change(self) -> None:
        """Re-send what the new view has not ordered or chosen yet."""
        for index in sorted(self._unready):
            inst = self.c[(self.me, index)]
            inst.sent_at = self.now
            if not inst.committed and inst.leading:
                self._resend_accept(self.me, index, inst)
        named = self._last_named_index()
        if self._known_o_count(self.me) <= named:
            self._send_crequest(named)
        for read_id, (reads, _) in sorted(self._pending_reads.items()):
            self._pending_reads[read_id] = (reads, self.now)
            self._send_rrequest(read_id, reads)

    def _on_new_view(self, msg: NewView) -> None:
        if msg.src != self.sequencer or self.role is not Role.FOLLOWER:
            return
        if not self.view_ready:
            self._accept_new_view(msg)
        self._send(msg.src, NewViewAck(src=self.me, view=self.view))

    def _on_new_view_ack(self, msg: NewViewAck) -> None:
        if self._new_view is None or msg.view != self._new_view.view:
            return
        self._new_view_acks.add(msg.src)
        if self.role is Role.ESTABLISHING and len(self._new_view_acks) >= self.q:
            self._become_sequencer()
        elif self.role is Role.SEQUENCER:
            self._send_new_view_commit(msg.src)  # a late acceptor needs the commits too

    def _become_sequencer(self) -> None:
        assert self._new_view is not None
        new_view = self._new_view
        start, end = new_view.start, new_view.start + len(new_view.owners)
        self.role = Role.SEQUENCER
        self._last_view_change_at = self.now
        # our assignment log: the compacted prefix (counts only), the executed slots we still
        # hold, then the rebuilt range
        self.seq_slots = {rid: OwnerSlots(self._base_counts[rid]) for rid in range(self.n)}
        for slot in sorted(self.log):
            owner = self.log[slot][0]
            if owner != NO_CL:
                self.seq_slots[owner].append(slot)
        for slot in range(self.exec_slot, end):
            owner = self.o_value.get(slot, NO_CL)
            if owner != NO_CL:
                self.seq_slots[owner].append(slot)
        self.seq_next_slot = max(end, self.exec_slot)
        self.seq_acked = {rid: set() for rid in range(self.n)}
        self.seq_acked_prefix = {
            rid: (end if rid in self._new_view_acks else start) for rid in range(self.n)
        }
        self._seq_own_chosen = self.seq_slots[self.me].count_below(end)
        self.history.clear()
        self._unknown_keys.clear()
        self._history_floor = self.seq_next_slot - 1
        for slot in range(max(start, self.exec_slot), end):
            self.o_committed.add(slot)
        self._recount_o_state()
        for peer in sorted(self._new_view_acks - {self.me}):
            self._send_new_view_commit(peer)
        self._check_ready()
        deferred, self._deferred_orders = self._deferred_orders, []
        for owner, index, keys in deferred:
            self._order(owner, index, keys)
        named = self._last_named_index()
        if self._known_o_count(self.me) <= named:
            self._order(self.me, named, ())

    def _send_new_view_commit(self, peer: int) -> None:
        assert self._new_view is not None
        start = self._new_view.start
        entries = tuple(
            OEntry(slot=start + k, owner=owner) for k, owner in enumerate(self._new_view.owners)
        )
        if entries:
            self._send(peer, OCommit(src=self.me, view=self.view, entries=entries))

    # ------------------------------------------------------------------ liveness
    def _send_heartbeats(self) -> None:
        serving = self.role is Role.SEQUENCER
        for peer in self._peers:
            heartbeat = Heartbeat(
                src=self.me,
                view=self.view,
                executed=self.exec_slot,
                lease_request=self.now if serving else -1,
            )
            self._send(peer, heartbeat)

    def _on_heartbeat(self, msg: Heartbeat) -> None:
        self._peer_executed[msg.src] = max(self._peer_executed[msg.src], msg.executed)
        if (
            self._new_view is not None
            and self.role is Role.SEQUENCER
            and msg.src not in self._new_view_acks
            and msg.view <= self.view
        ):
            self._send(msg.src, self._new_view)  # it missed our view change
        if msg.view < self.view:
            return
        if msg.view > self.view:
            if msg.src != msg.view % self.n:
                # A peer sits in a view nobody won. If we serve, move everyone above it.
                if self.role is Role.SEQUENCER:
                    self._higher_view_seen = max(self._higher_view_seen, msg.view)
                return
            self._join_view(msg.view)
        if msg.src == self.sequencer and msg.lease_request >= 0:
            self._seq_alive_at = self.now
        if (
            msg.lease_request >= 0
            and msg.src == self.sequencer
            and self.role is Role.FOLLOWER
            and not self._suspecting
        ):
            self.lease_granted_to = msg.src
            self.lease_granted_until = self.now + self.config.lease_us
            self._send(msg.src, LeaseGrant(src=self.me, view=self.view, request=msg.lease_request))

    def _on_lease_grant(self, msg: LeaseGrant) -> None:
        if self.role is Role.SEQUENCER:
            until = msg.request + self._lease_hold_us
            self._lease_from[msg.src] = max(self._lease_from.get(msg.src, 0), until)

    def _lease_valid(self) -> bool:
        if self.role is not Role.SEQUENCER:
            return False
        if "no_lease_check" in self._unsafe:
            return True
        holders = 1 + sum(1 for until in self._lease_from.values() if until > self.now)
        return holders >= self.q

    def _detect_failures(self) -> None:
        now = self.now
        if self.role is Role.CANDIDATE:
            if now - self._candidate_since > self._election_timeout:
                self._pre_vote()  # no majority in time: try a higher view
            return
        if self.role is Role.ESTABLISHING:
            if now - self._candidate_since > 2 * self._election_timeout:
                self._pre_vote()
            elif self._new_view is not None and now - self._new_view_sent_at >= (
                self.config.retransmit_us
            ):
                self._new_view_sent_at = now
                for peer in self._peers:
                    if peer not in self._new_view_acks:
                        self._send(peer, self._new_view)
            return
        # The sequencer of our view shows no sign of serving (a restarted replica that was the
        # sequencer counts itself as silent too), the straggler detector asks for a change,
        # or we serve but some peer is stuck in a higher view nobody won.
        silent = (
            self.role is not Role.SEQUENCER and now - self._seq_alive_at > self._election_timeout
        )
        forced = 0 <= self._force_election_at <= now
        lifted = self.role is Role.SEQUENCER and self._higher_view_seen > self.view
        if (silent or forced or lifted) and self._may_vote_for(self.me):
            self._pre_vote()
        self._recover_suspects()

    def _target_view(self) -> int:
        view = max(self.view, self._higher_view_seen) + 1
        while view % self.n != self.me:
            view += 1
        return view

    def _pre_vote(self) -> None:
        """Ask whether a majority would vote for us before bumping any view (Raft's pre-vote),
        so a replica that cannot win never disturbs a working sequencer."""
        if self._prevote_view >= 0 and self.now - self._prevote_at < self._election_timeout:
            return
        self._prevote_view = self._target_view()
        self._prevote_at = self.now
        self._prevotes = {self.me}
        self._roll_election_timeout()
        for peer in self._peers:
            self._request(peer, PreVote(src=self.me, view=self._prevote_view))
        if len(self._prevotes) >= self.q:
            self._start_candidacy()

    def _on_prevote(self, msg: PreVote) -> None:
        serving_here = self.role is Role.SEQUENCER and msg.src != self.me
        sequencer_gone = (
            self.now - self._seq_alive_at > self.config.election_timeout_us
            or msg.src == self.sequencer  # the sequencer itself asks to move up
            or self._suspecting
        )
        granted = (
            msg.view > self.view
            and not serving_here
            and sequencer_gone
            and self._may_vote_for(msg.src)
        )
        self._request(msg.src, PreVoteReply(src=self.me, view=msg.view, granted=granted))

    def _on_prevote_reply(self, msg: PreVoteReply) -> None:
        if msg.view != self._prevote_view or not msg.granted:
            return
        self._prevotes.add(msg.src)
        if len(self._prevotes) >= self.q:
            self._start_candidacy()

    def _suspected(self, replica: int) -> bool:
        """Silent for longer than the election timeout and than it was recently while alive
        (see SILENCE_FACTOR)."""
        silence = self.now - self.last_heard[replica]
        if silence <= self.config.election_timeout_us:
            return False
        recent = max(self._silence_now[replica], self._silence_before[replica])
        return silence > SILENCE_FACTOR * recent

    def _recover_suspects(self) -> None:
        """Take over the unfinished C-instances of suspected replicas (the next live replica
        after each one does it) — and our own, if a recoverer overtook us and went quiet."""
        for owner in range(self.n):
            if owner in self._recoveries:
                recovery = self._recoveries[owner]
                if self.now - recovery.asked_at > self.config.election_timeout_us:
                    self._ask_again(recovery)
                continue
            if owner == self.me:
                stalled = self._undriven_own()
                # A recoverer's Prepare covers every later index of ours, so what we proposed
                # after it was refused and nobody drives it; while execution goes on (the
                # others' commands) only its age shows it. A replica slow enough to be
                # suspected kept its clients waiting for good this way.
                overdue = any(
                    0 <= self.c[(self.me, i)].overtaken_at < self.now - self._election_timeout
                    for i in stalled
                )
                # Execution may also wait on an instance of ours nobody drives any more: a
                # no-op a recovery of ours proposed before we restarted, say.
                blocking = self._blocking_instance()
                if blocking is not None and blocking[0] == self.me:
                    inst = self.c.get(blocking)
                    if inst is None or not inst.leading:
                        stalled.append(blocking[1])
                halted = self.now - self._exec_progress_at > self._election_timeout
                if stalled and (halted or overdue):
                    self._start_recovery(self.me, min(stalled))
                continue
            if not self._suspected(owner) or self._recoverer_of(owner) != self.me:
                continue
            from_index = self._exec_count[owner]
            unfinished = self.c_high[owner] >= from_index or self._known_o_count(owner) > from_index
            if unfinished and not self._all_committed(owner, from_index):
                self._start_recovery(owner, from_index)

    def _blocking_instance(self) -> tuple[int, int] | None:
        """The C-instance execution waits for, if its slot is decided but it is not."""
        slot = self.exec_slot
        if slot not in self.o_committed:
            return None
        owner = self.o_value[slot]
        if owner == NO_CL:
            return None
        key = (owner, self._exec_count[owner])
        inst = self.c.get(key)
        if inst is not None and inst.committed:
            return None
        return key

    def _recoverer_of(self, owner: int) -> int:
        for step in range(1, self.n):
            candidate = (owner + step) % self.n
            if candidate == self.me or not self._suspected(candidate):
                return candidate
        return self.me

    def _all_committed(self, owner: int, from_index: int) -> bool:
        high = max(self.c_high[owner], self._known_o_count(owner) - 1)
        for index in range(from_index, high + 1):
            inst = self.c.get((owner, index))
            if inst is None or not inst.committed:
                return False
        return True

    # ------------------------------------------------------------------ timers
    def _sample_rtt(self, sample_us: int) -> None:
        """A C-instance of ours, sent once, was chosen ``sample_us`` after it left. Under load
        that includes the peers' queues: retransmitting sooner only duplicates what is queued
        (in a saturated cluster, up to half the bytes sent were such copies)."""
        if self._srtt_us == 0:
            self._srtt_us, self._rttvar_us = sample_us, sample_us // 2
        else:
            self._rttvar_us += (abs(self._srtt_us - sample_us) - self._rttvar_us) // 4
            self._srtt_us += (sample_us - self._srtt_us) // 8
        floor = self.config.retransmit_us
        estimate = self._srtt_us + 4 * self._rttvar_us
        self.retransmit_timeout_us = min(max(floor, estimate), RTO_CEILING_FACTOR * floor)

    def _retransmit(self) -> None:
        deadline = self.now - self.retransmit_timeout_us
        late: list[int] = []
        for index in sorted(self._unready):
            inst = self.c[(self.me, index)]
            if inst.sent_at > deadline or inst.ballot == HELD:  # held: named nowhere yet
                continue
            inst.sent_at = self.now
            self._rtt_probes.pop(index, None)  # Karn: an answer could be to either copy
            late.append(index)
            if not inst.committed and inst.leading:
                self._resend_accept(self.me, index, inst)
        for owner, index in sorted(self._reproposing):
            inst = self.c[(owner, index)]
            if inst.sent_at <= deadline:
                inst.sent_at = self.now
                self._resend_accept(owner, index, inst)
        if not self.view_ready:
            return
        if not self.is_sequencer:
            if late:
                self._send_crequest(late[-1])  # one request covers every lower index
            return
        if self.role is Role.SEQUENCER:
            self._retransmit_own_slots(late, deadline)

    def _retransmit_own_slots(self, late: list[int], deadline: int) -> None:
        """Serving: our own O-instances lack acknowledgements: re-send them to whoever has not
        acked."""
        mine = self.seq_slots[self.me]
        for peer in self._peers:
            for index in late:
                if not mine.base <= index < len(mine):
                    continue
                slot = mine[index]
                if self._five:
                    if self.seq_acked_prefix[peer] <= slot:
                        self._resend_oaccepts(peer, self.seq_acked_prefix[peer], slot + 1)
                elif slot not in self.o_committed and peer not in self.o_acks.get(slot, ()):
                    self._resend_oaccepts(peer, slot, slot + 1)
        if not self._five and self._own_checked_at <= deadline:
            # With N=3 or N>=7 an own C-instance can be ready (by the count rule) while its own
            # O-instance is not chosen, so it is not late: re-send every own unchosen,
            # unexecuted slot at least one retransmission period old, each to the peers that
            # did not acknowledge it (checked once per period).
            self._own_checked_at = self.now
            for index in range(max(mine.base, self._exec_count[self.me]), len(mine)):
                slot = mine[index]
                if index in self._unready or slot < self.exec_slot or slot in self.o_committed:
                    continue  # late ones were handled above
                own = self.c.get((self.me, index))
                if own is None or own.sent_at > deadline:
                    continue
                for peer in self._peers:
                    if peer not in self.o_acks.get(slot, ()):
                        self._resend_oaccepts(peer, slot, slot + 1)
        named = self._last_named_index()
        if len(mine) <= named:
            self._order(self.me, named, ())

    def _resume_after_restart(self) -> None:
        """After a restart, drive our own instances found in the records once caught up."""
        if not self._restart_pending or not self.view_ready:
            return
        if max(self._peer_executed.values()) > self.exec_slot:
            return  # still catching up: most of them are probably decided
        for index in self._restart_pending:
            inst = self.c[(self.me, index)]
            if index >= self._exec_count[self.me] and not inst.committed and inst.batch:
                inst.leading = inst.ballot == self.me
                inst.acks = {self.me}
                inst.sent_at = -(1 << 62)  # retransmit at once
                self._unready[index] = inst.batch
                self._restart_batches.pop(index, None)  # reported from _unready now
        self._restart_pending = []

    def _maybe_catch_up(self) -> None:
        if not self.view_ready:
            return
        ahead = max(self._peer_executed.values())
        idle = self.now - self._exec_progress_at >= self.config.catchup_us
        # A peer a few slots ahead is the normal state of a loaded cluster: asking it then
        # fetched full batches we were about to receive anyway, again and again (at 1 KB
        # commands, more bytes than the replication itself). Ask when far behind (a restart,
        # a healed partition; pipelined below) or when execution stopped.
        behind = ahead > self.exec_slot and (ahead - self.exec_slot > CATCHUP_BATCH or idle)
        stuck = (bool(self._unready) or self.o_high > self.exec_slot) and idle
        if not (behind or stuck):
            self._catchup_lacks_values = False
            return
        # Markers first: stalled behind slow peers (an overloaded cluster: turns longer than
        # catchup_us), a replica holds the values and misses only commits, and answers with
        # values re-sent it megabytes, which slowed everyone further (at 1 KB commands, 0.15
        # CPU and deep client queues: more catch-up bytes than replication, views changing).
        # A marker naming a value we lack switches to values at once.
        answered = self.exec_slot >= self._catchup_asked + CATCHUP_BATCH // 2 or (
            self._catchup_lacks_values and not self._catchup_asked_values
        )
        if not answered and self.now - self._last_catchup_at < self.config.catchup_us:
            return
        self._last_catchup_at = self.now
        self._catchup_asked = self.exec_slot
        self._catchup_asked_values = self._catchup_lacks_values
        if behind:
            peer = max(self._peers, key=lambda rid: (self._peer_executed[rid], -rid))
        else:
            peer = self._peers[self._catchup_peer % len(self._peers)] if self._peers else self.me
            self._catchup_peer += 1
        if peer != self.me:
            ask = Catchup if self._catchup_asked_values else CatchupMarkers
            self._request(peer, ask(src=self.me, view=self.view, slot=self.exec_slot))

    def _on_catchup(self, msg: Catchup | CatchupMarkers) -> None:
        """Tell a lagging peer every commit we know from ``msg.slot`` on (bounded; values only
        if it asked ``Catchup``)."""
        if msg.slot < self._compacted:
            # what it misses is only in our snapshot now: the driver sends it
            self._out.snapshot_requests.append(msg.src)
            return
        start = msg.slot
        stop = start + CATCHUP_BATCH
        entries = tuple(
            OEntry(slot=s, owner=self.log[s][0] if s in self.log else self.o_value[s])
            for s in range(start, stop)
            if s in self.log or s in self.o_committed
        )
        if entries:
            self._send(msg.src, OCommit(src=self.me, view=self.view, entries=entries))
        # What we accepted in this view but never saw committed: with these acknowledgements
        # the asker can learn what a majority accepted even if every learner forgot it.
        accepted = tuple(
            s
            for s in range(max(start, self.exec_slot), min(stop, self.o_high))
            if s not in self.o_committed and self.o_ballot.get(s) == self.view
        )
        if accepted and self.view_ready:
            self._send(msg.src, OAck(src=self.me, view=self.view, slots=accepted))
        # C-instances placed in slots we executed, then chosen ones we have not executed yet
        wanted: list[tuple[int, int]] = [
            self.log[s] for s in range(start, min(stop, self.exec_slot)) if s in self.log
        ]
        for owner in range(self.n):
            index = self._exec_count[owner]
            while len(wanted) < 2 * CATCHUP_BATCH:
                inst = self.c.get((owner, index))
                if inst is None or not inst.committed:
                    break
                wanted.append((owner, index))
                index += 1
        values = isinstance(msg, Catchup)
        budget = CATCHUP_BYTES
        for owner, index in wanted:
            if owner == NO_CL:
                continue
            if budget <= 0:
                break
            inst = self.c[(owner, index)]
            if values:
                budget -= batch_size(inst.batch or ())
            commit_c = CCommit(
                src=self.me,
                view=self.view,
                owner=owner,
                index=index,
                ballot=inst.ballot,
                batch=inst.batch if values else None,
            )
            self._send(msg.src, commit_c)
        if self._peer_executed[msg.src] < msg.slot:
            self._peer_executed[msg.src] = msg.slot

    # ------------------------------------------------------------------ reads
    def _flush_read_requests(self) -> None:
        """Ask the sequencer once for all of this turn's reads: its answer for the union of
        their keys (the latest slot any of them needs) serves every one of them, so a read
        costs the sequencer a share of one message instead of two messages."""
        if not self._unasked_reads:
            return
        reads = tuple(self._unasked_reads)
        self._unasked_reads.clear()
        if self.role is Role.SEQUENCER and self._lease_valid():
            # the sequencer answers its own reads the same way, once per turn: one lease check
            # and one history lookup for the turn instead of one per read
            slot = self._read_slot(_union_keys(reads))
            self._waiting_reads.extend((slot, -1, read) for read in reads)
            return
        self._read_ids += 1
        self._pending_reads[self._read_ids] = (reads, self.now)
        self._send_rrequest(self._read_ids, reads)

    def _send_rrequest(self, read_id: int, reads: tuple[Command, ...]) -> None:
        if self.is_sequencer:
            return  # we answer ourselves once serving with a lease (see _retry_reads)
        request = RRequest(src=self.me, view=self.view, read_id=read_id, keys=_union_keys(reads))
        self._request(self.sequencer, request)

    def _read_slot(self, keys: Iterable[str]) -> int:
        keys = tuple(keys)
        if not keys:
            return self.seq_next_slot - 1
        slot = max((self.history.get(key, -1) for key in keys), default=-1)
        if self._unknown_keys:
            slot = max(slot, max(self._unknown_keys.values()))
        return max(slot, self._history_floor)

    def _on_rrequest(self, msg: RRequest) -> None:
        if self.role is Role.SEQUENCER and self._lease_valid():
            slot = self._read_slot(msg.keys)
            self._request(
                msg.src, RReply(src=self.me, view=self.view, read_id=msg.read_id, slot=slot)
            )

    def _on_rreply(self, msg: RReply) -> None:
        if msg.src != self.sequencer:
            return
        pending = self._pending_reads.pop(msg.read_id, None)
        if pending is not None:
            self._waiting_reads.extend((msg.slot, msg.read_id, read) for read in pending[0])

    def _retry_reads(self) -> None:
        deadline = self.now - self.config.retransmit_us
        for read_id, (reads, sent_at) in sorted(self._pending_reads.items()):
            if self.role is Role.SEQUENCER and self._lease_valid():
                del self._pending_reads[read_id]
                slot = self._read_slot(_union_keys(reads))
                self._waiting_reads.extend((slot, read_id, read) for read in reads)
            elif sent_at <= deadline:
                self._pending_reads[read_id] = (reads, self.now)
                self._send_rrequest(read_id, reads)

    def _serve_reads(self) -> None:
        if not self._waiting_reads:
            return
        still: list[tuple[int, int, Command]] = []
        for slot, read_id, command in self._waiting_reads:
            if slot < self.exec_slot:
                self._out.reads.append(command)
            else:
                still.append((slot, read_id, command))
        self._waiting_reads = still

    # ------------------------------------------------------------------ straggler detection
    def _watch_ordering(self) -> None:
        windows = self.config.straggler_windows
        if windows == 0:
            return
        if self.now >= self._next_wait_sample:
            self._next_wait_sample = self.now + self.config.straggler_window_us // WAIT_SAMPLES
            self._sample_waits()
        if self.now - self._window_start < self.config.straggler_window_us:
            return
        needed, got = self._window_needed, self._window_got
        wait_c, wait_o = self._wait_c, self._wait_o
        self._window_start = self.now
        self._window_needed = self._window_got = self._wait_c = self._wait_o = 0
        if self.is_sequencer or self.role is not Role.FOLLOWER or not self.view_ready:
            self._slow_windows = 0
            return
        # Starved: the sequencer ordered less than half of what we asked for. Lagging: our
        # commands waited far longer for their order than for their C-phase (by Little's law
        # the ratio of the sampled queue lengths is the ratio of the mean waits): with
        # closed-loop clients demand shrinks to a slow sequencer's pace, so only the second
        # shows it. On the paper's WANs ordering takes at most ~1.2x the C-phase.
        starved = needed >= 2 and 2 * got < needed
        lagging = wait_o >= WAIT_SAMPLES and wait_o > ORDER_LAG_FACTOR * max(wait_c, 1)
        slow = starved or lagging
        self._slow_windows = self._slow_windows + 1 if slow else 0
        self._healthy_windows = 0 if slow else self._healthy_windows + 1
        cooled = self.now - self._last_view_change_at >= self.config.straggler_cooldown_us
        if self._suspecting:
            if self._force_election_at >= 0:
                return  # a majority agreed: the election is under way
            if self._healthy_windows >= windows:
                # No majority joined, and ordering is fine again: grant leases again. (Kept
                # up, a suspicion whose Suspects were lost stopped every lease renewal and
                # so every read, with no election to follow.)
                self._suspecting = False
                del self._suspects[self.me]
                return
        elif self._slow_windows < windows or not cooled:
            return
        # Suspect, or say so again: a lost Suspect must not leave us suspecting alone
        self._suspecting = True
        self._suspects[self.me] = self.now
        self._broadcast(Suspect(src=self.me, view=self.view))
        self._maybe_replace_straggler()

    def _sample_waits(self) -> None:
        if not self._unready or self.is_sequencer:
            return
        ordered = self._ordered_own()
        for index in self._unready:
            if index >= ordered:
                self._wait_o += 1
            inst = self.c.get((self.me, index))
            if inst is None or not inst.committed:
                self._wait_c += 1

    def _on_suspect(self, msg: Suspect) -> None:
        if msg.view == self.view and msg.src != self.sequencer:
            self._suspects[msg.src] = self.now
            self._maybe_replace_straggler()

    def _maybe_replace_straggler(self) -> None:
        # A suspicion is repeated every window while it lasts: one not heard for a few has
        # been withdrawn.
        since = self.now - SUSPECT_WINDOWS * self.config.straggler_window_us
        agreeing = sum(1 for heard in self._suspects.values() if heard >= since)
        if self._suspecting and agreeing >= self.q and self._force_election_at < 0:
            # Stop renewing the lease (done: we are suspecting); once it lapses, run.
            delay = int(self.rng.random() * self.config.election_timeout_us / 2)
            self._force_election_at = max(self.lease_granted_until, self.now) + delay

    # ------------------------------------------------------------------ snapshots
    def snapshot_meta(self) -> SnapshotMeta:
        """Where a snapshot of the state machine, taken now (after applying the last
        ``Ready``), stands in the log."""
        return SnapshotMeta(self.exec_slot, tuple(self._exec_count[rid] for rid in range(self.n)))

    def compact(self, meta: SnapshotMeta) -> list[Record]:
        """The state machine's snapshot at ``meta`` is durable: forget every slot below it.
        Returns the records a rewritten write-ahead log must hold: with a durable snapshot at
        the execution frontier (the caller just took one; ``meta`` may be an older one, so
        that peers a little behind still catch up from memory), they rebuild this replica
        exactly as its full log would."""
        if meta.slot > self.exec_slot:
            raise LocalProtocolError("compact() beyond the execution frontier")
        self._drop_below(meta)
        return self.durable_records()

    def install_snapshot(self, meta: SnapshotMeta) -> list[Record]:
        """A peer's snapshot was applied to our state machine: continue from ``meta``.
        Returns the records for a rewritten write-ahead log, like ``compact``."""
        if meta.slot <= self.exec_slot:
            return self.durable_records()
        self._set_base(meta)
        self._recount_o_state()
        self._exec_progress_at = self.now
        return self.durable_records()

    def _set_base(self, meta: SnapshotMeta) -> None:
        self.exec_slot = max(self.exec_slot, meta.slot)
        for rid in range(self.n):
            self._exec_count[rid] = max(self._exec_count[rid], meta.exec_counts[rid])
        self._drop_below(meta)
        self.next_index = max(self.next_index, self._exec_count[self.me])
        self.o_prefix = max(self.o_prefix, meta.slot)
        self.o_high = max(self.o_high, meta.slot)

    def _drop_below(self, meta: SnapshotMeta) -> None:
        for slot in [s for s in self.log if s < meta.slot]:
            owner, index = self.log.pop(slot)
            if owner != NO_CL:
                self.c.pop((owner, index), None)
        for key in [k for k in self.c if k[1] < meta.exec_counts[k[0]]]:
            del self.c[key]
        self._values_to_log = {k for k in self._values_to_log if k[1] >= meta.exec_counts[k[0]]}
        self._reproposing = {k for k in self._reproposing if k[1] >= meta.exec_counts[k[0]]}
        self._c_acks_seen = {
            k: seen for k, seen in self._c_acks_seen.items() if k[1] >= meta.exec_counts[k[0]]
        }
        covered = meta.exec_counts[self.me]
        self._restart_pending = [i for i in self._restart_pending if i >= covered]
        self._restart_batches = {i: b for i, b in self._restart_batches.items() if i >= covered}
        self._rtt_probes = {i: t for i, t in self._rtt_probes.items() if i >= covered}
        # Our proposals a peer's snapshot already executed (we fell behind before we saw them
        # decided): their outcome is in the snapshot, not here. The client learns it by
        # retrying: the session table answers a retry with the first result.
        for index in sorted(i for i in self._unready if i < covered):
            for command in self._unready.pop(index):
                self._out.failed.append(
                    Failure(command, False, "decided while this replica caught up from a "
                            "snapshot: retry it")
                )
        for table in (self.o_value, self.o_ballot, self.o_acks):
            for slot in [s for s in table if s < meta.slot]:
                del table[slot]
        self.o_committed = {s for s in self.o_committed if s >= meta.slot}
        for rid, slots in self.seq_slots.items():
            slots.trim_below(meta.slot)
            slots.base = max(slots.base, meta.exec_counts[rid])
        self._compacted = max(self._compacted, meta.slot)
        self._base_counts = dict(enumerate(meta.exec_counts))

    def durable_records(self) -> list[Record]:
        """Everything this replica promised and accepted beyond its execution frontier: a
        restart begins at a snapshot of it and skips what it executed (``_recover``), so
        rewriting executed instances that are kept in memory for peers would only cost."""
        records: list[Record] = [
            ViewRecord(view=self.view),
            # "accepted this view's log, nothing of it beyond here": restores accepted_view
            NewViewRecord(view=self.accepted_view, start=self.exec_slot, owners=()),
        ]
        by_ballot: dict[int, list[OEntry]] = {}
        for slot in sorted(self.o_ballot):
            if slot >= self.exec_slot and self.o_ballot[slot] >= 0:
                entry = OEntry(slot=slot, owner=self.o_value[slot])
                by_ballot.setdefault(self.o_ballot[slot], []).append(entry)
        for ballot in sorted(by_ballot):
            records.append(OAcceptedRecord(view=ballot, entries=tuple(by_ballot[ballot])))
        executed = self._exec_count
        for (owner, index), inst in sorted(self.c.items()):
            if inst.batch is not None and index >= executed[owner]:
                records.append(
                    CAcceptedRecord(owner=owner, index=index, ballot=inst.ballot, batch=inst.batch)
                )
        for owner, (ballot, from_index) in sorted(self._c_promised.items()):
            records.append(CPromiseRecord(owner=owner, from_index=from_index, ballot=ballot))
        return records

    # ------------------------------------------------------------------ recovery
    def _recover(self, records: Sequence[Record]) -> None:
        """Rebuild what this replica promised and accepted from its durable records, then
        execute again what they say it executed."""
        own: set[int] = set()
        executed: dict[int, tuple[int, int]] = {}
        for record in records:
            match record:
                case CAcceptedRecord():
                    if record.index < self._exec_count[record.owner]:
                        continue  # executed: in the snapshot
                    key = (record.owner, record.index)
                    inst = self.c.get(key)
                    if inst is None or record.ballot >= inst.ballot:
                        self.c[key] = CInstance(record.ballot, record.batch)
                    self.c_high[record.owner] = max(self.c_high[record.owner], record.index)
                    self._ballot_seen = max(self._ballot_seen, record.ballot)
                    if record.owner == self.me:
                        self.next_index = max(self.next_index, record.index + 1)
                        own.add(record.index)
                        if record.ballot % BALLOT_STRIDE == self.me:
                            self._own_ballot = max(self._own_ballot, record.ballot)
                case OAcceptedRecord():
                    for entry in record.entries:
                        if entry.slot < self.exec_slot:
                            continue
                        if self.o_ballot.get(entry.slot, -1) <= record.view:
                            self.o_value[entry.slot] = entry.owner
                            self.o_ballot[entry.slot] = record.view
                    self.accepted_view = max(self.accepted_view, record.view)
                case NewViewRecord():
                    self._install_new_view(record.view, record.start, record.owners)
                case ViewRecord():
                    self.view = max(self.view, record.view)
                case CPromiseRecord():
                    self._c_promised[record.owner] = (record.ballot, record.from_index)
                    self._ballot_seen = max(self._ballot_seen, record.ballot)
                case ExecutedRecord():
                    for k, owner in enumerate(record.owners):
                        executed[record.start + k] = (owner, record.ballots[k])
        self._replay_executed(executed)
        self.role = Role.FOLLOWER
        self.view_ready = self.accepted_view >= self.view
        self._recount_o_state()
        self._restart_pending = sorted(own)
        self._restart_batches = {
            index: batch
            for index in self._restart_pending
            if index >= self._exec_count[self.me]
            and (batch := self.c[(self.me, index)].batch) is not None
        }


_C_PHASE = (CAccept, CAck, CCommit, CPrepare, CPromise, CNack)


def _pages(items: Sequence[_T], size: int) -> Iterator[tuple[_T, ...]]:
    """``items`` in order, as tuples of at most ``size`` (one message's worth each)."""
    for start in range(0, len(items), size):
        yield tuple(items[start : start + size])


def _keys_of(batch: Batch | None) -> tuple[str, ...]:
    """The keys a batch updates; () when unknown, too many to send, or when one of its commands
    names none (it may update any key): the sequencer then treats the batch's slot as touching
    every key."""
    if not batch:
        return ()
    if len(batch) == 1:
        return batch[0].keys
    keys: set[str] = set()
    for command in batch:
        if not command.keys:
            return ()
        keys.update(command.keys)
    return tuple(sorted(keys)) if len(keys) <= MAX_REQUEST_KEYS else ()


def _union_keys(reads: Sequence[Command]) -> tuple[str, ...]:
    """The keys whose latest update serves every one of ``reads``: the union of their keys, or
    none ("the last slot overall") if any of them names no key."""
    if any(not read.keys for read in reads):
        return ()
    return tuple(sorted({key for read in reads for key in read.keys}))


def _check_command(command: Command) -> None:
    if len(command.op) > MAX_OP_BYTES:
        raise LocalProtocolError(f"command op of {len(command.op)} bytes over {MAX_OP_BYTES}")
    if len(command.keys) > MAX_KEYS_PER_COMMAND:
        raise LocalProtocolError(
            f"command names {len(command.keys)} keys, more than {MAX_KEYS_PER_COMMAND}"
        )
    for key in command.keys:
        if len(key) * 4 > MAX_KEY_BYTES and len(key.encode()) > MAX_KEY_BYTES:
            raise LocalProtocolError(f"command key of over {MAX_KEY_BYTES} bytes")
    if command.client_id < 0 or command.seq < 0:
        raise LocalProtocolError("command client_id and seq must be non-negative")
