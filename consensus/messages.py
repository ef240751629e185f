"""Every message and durable record the protocol cores exchange.

All of them are frozen, slotted, keyword-only dataclasses: plain data with no behaviour, so
the same objects flow through the simulator, the codec and the asyncio driver. The one
exception is ``Command``, a named tuple: every replica builds, compares and hashes one per
client command (see its docstring). The codec
(`consensus.codec`) gives each class a stable wire tag; adding a field to a class changes its
wire format and needs a new ``FORMAT_VERSION``.

Naming follows the paper (SoCC'18, Figure 5):

* ``C[n][i]`` — replica ``n``'s ``i``-th *command instance*; its value is a batch of client
  commands. ``CAccept``/``CAck``/``CCommit`` are the Accept, Accepted and Commit messages of
  that Paxos instance; ``CRequest`` asks the sequencer to order an instance it did not see.
* ``O[j]`` — the sequencer's ``j``-th *order instance* (global slot ``j``); its value is the id
  of the replica whose next C-instance takes slot ``j`` (or ``NO_CL``: a no-op slot).
  ``OAccept``/``OAck``/``OCommit`` carry one or more ``OEntry`` values at a time.

The baselines (``consensus.protocol.multipaxos`` and ``.mencius``) run one Paxos instance per
global slot, whose value is a batch of commands: ``PaxosAccept``/``PaxosAck``/``PaxosCommit``
(Multi-Paxos; ``PaxosCommit`` also serves Mencius), ``PaxosForward`` (a command for the
leader), ``MenciusAccept``/``MenciusAck``/``MenciusSkip`` (Mencius, with skips piggybacked).
They reuse ``Heartbeat`` (``view`` 0, ``lease_request`` ``NO_LEASE_REQUEST``), ``Catchup`` and
``CatchupMarkers``.

Identifiers are plain non-negative ``int``s: replica ids are ``0..N-1``, indices and slots count
from 0. Ballots are ints too (see ``consensus.protocol.ballot``). A few fields use -1 for
"none", each documented where it is declared (the codec accepts -1 exactly there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple

from consensus.errors import LocalProtocolError
from consensus.packed_batch import PackedBatch

__all__ = [
    "EVERY_INDEX",
    "MAX_BATCH",
    "MAX_ENTRIES",
    "MAX_FRAME_MESSAGES",
    "MAX_KEYS_PER_COMMAND",
    "MAX_KEY_BYTES",
    "MAX_OP_BYTES",
    "MAX_REQUEST_KEYS",
    "MAX_SLOTS",
    "NO_CL",
    "NO_LEASE_REQUEST",
    "SEAL",
    "TRY_CONFLICT",
    "TRY_CONFLICT_COMMITTED",
    "TRY_OK",
    "Batch",
    "CAccept",
    "CAcceptedRecord",
    "CAck",
    "CCommit",
    "CNack",
    "CPrepare",
    "CPromise",
    "CPromiseRecord",
    "CRequest",
    "CVote",
    "Catchup",
    "CatchupMarkers",
    "Command",
    "ConfigRecord",
    "EAccept",
    "EAcceptReply",
    "ECommit",
    "EInstanceRecord",
    "EPreAccept",
    "EPreAcceptReply",
    "EPrepare",
    "EPrepareReply",
    "ETryPreAccept",
    "ETryPreAcceptReply",
    "Heartbeat",
    "LearnReply",
    "LearnRequest",
    "LearnedRecord",
    "LearnedSlot",
    "LeaseGrant",
    "MemberEntry",
    "MenciusAccept",
    "MenciusAck",
    "MenciusPrepare",
    "MenciusPromise",
    "MenciusPromiseRecord",
    "MenciusSkip",
    "NewView",
    "NewViewAck",
    "NewViewRecord",
    "OAccept",
    "OAcceptedRecord",
    "OAck",
    "OCommit",
    "OEntry",
    "OVote",
    "PaxosAccept",
    "PaxosAck",
    "PaxosCommit",
    "PaxosForward",
    "PaxosPrepare",
    "PaxosPromise",
    "PaxosPromiseRecord",
    "PeerMessage",
    "PreVote",
    "PreVoteReply",
    "RReply",
    "RRequest",
    "Record",
    "ReserveRecord",
    "SkipRecord",
    "SlotAcceptedRecord",
    "SnapshotChunk",
    "Suspect",
    "VRequest",
    "ViewRecord",
    "Vote",
    "check_command",
]

#: The value of an O-instance that places no command ("no command leader"): executes a no-op.
NO_CL: Final = -1
#: The value of an O-instance that closes its epoch (membership, ``consensus.protocol.
#: membership``): it places no command, and nothing follows it in that epoch's log.
SEAL: Final = -2
#: ``CPromise.through`` of a promise that reports on every index from its ``from_index``
EVERY_INDEX: Final = (1 << 63) - 1
#: ``Heartbeat.lease_request`` of a heartbeat that asks for no lease (its sender does not
#: serve, or its protocol has no leases)
NO_LEASE_REQUEST: Final = -1


# --------------------------------------------------------------------------- limits
# What one message may carry: the decoder refuses more, the encoder refuses to produce it,
# and the cores check client input against them before proposing it.

#: largest ``Command.op`` (bytes)
MAX_OP_BYTES: Final = 1 << 20
#: largest key, in UTF-8 bytes
MAX_KEY_BYTES: Final = 1 << 10
#: most keys in one ``Command``
MAX_KEYS_PER_COMMAND: Final = 64
#: most commands in one batch
MAX_BATCH: Final = 65536
#: most keys in one ``CRequest`` or ``RRequest`` (``CRequest.keys`` is a whole batch's keys)
MAX_REQUEST_KEYS: Final = 65536
#: most nested values (``OEntry``, ``OVote``, ``CVote``) in one message or record
MAX_ENTRIES: Final = 65536
#: most ints in one array (``OAck.slots``, ``NewView.owners``, ``Vote.c_high``, ...)
MAX_SLOTS: Final = 65536
#: most messages in one frame
MAX_FRAME_MESSAGES: Final = 65536


class Command(NamedTuple):
    """One client command, opaque to the protocol.

    ``(client_id, seq)`` identifies the request: a retry carries the same pair, and the
    replicated state machine's session table makes sure it takes effect once.
    ``keys`` names the objects the command updates (the sequencer's read history table uses
    them); a command naming no keys counts as updating every key. A ``blind`` command's
    result does not matter to its client (a plain write), so it is acknowledged as soon as it
    is *ready*; any other command is answered after it executes.

    A named tuple rather than a frozen dataclass, as the hot path of every replica: its
    fields are its msgpack array (the codec builds one from a decoded array in one call and
    encodes it as it is), and its ``==`` and ``hash`` run in C. Build it with keywords like
    the messages; equal fields mean equal commands (the hash is the dataclass's was).
    """

    client_id: int
    seq: int
    op: bytes
    keys: tuple[str, ...] = ()
    blind: bool = False

    def size(self) -> int:
        """Roughly the bytes it adds to an encoded batch (ops and keys dominate), for bounding
        batches so that no single message outgrows a frame."""
        # the keys' lengths summed as the length of their concatenation: the same number,
        # without a map and a sum per command (a leader sizes each command it batches)
        return len(self.op) + len("".join(self.keys)) + 16


#: The value of an instance as a message or record carries it: the commands a core batched, or,
#: where the codec decoded a frame lazily, the bytes they came in (``PackedBatch``, equal to
#: the tuple of its commands).
Batch = tuple[Command, ...] | PackedBatch


def check_command(command: Command) -> None:
    """Refuse (``LocalProtocolError``) a client command no peer could decode: the cores check
    client input with it before proposing anything."""
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


@dataclass(frozen=True, slots=True, kw_only=True)
class OEntry:
    """One order-instance value: global slot ``slot`` goes to replica ``owner`` (or NO_CL)."""

    slot: int
    owner: int


# --------------------------------------------------------------------------- peer messages
# Every peer message carries its sender ``src`` and the sender's ``view``.


@dataclass(frozen=True, slots=True, kw_only=True)
class CAccept:
    """Accept phase of ``C[owner][index]`` at ``ballot`` with value ``batch``."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int
    batch: Batch


@dataclass(frozen=True, slots=True, kw_only=True)
class CAck:
    """``src`` accepted ``C[owner][index]`` at ``ballot``; sent to the instance's leader."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CCommit:
    """``C[owner][index]`` is chosen. ``batch`` is None when the receiver holds the value."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int
    batch: Batch | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CRequest:
    """Asks the sequencer for O-instances for ``owner`` until it has ``index + 1`` of them.

    ``keys`` feeds the sequencer's read history table. ``o_prefix`` is how many leading
    O-instances the sender has accepted without a gap, so the sequencer can re-send what it
    misses (a retransmitted CRequest is also the way lost OAccepts are repaired).
    """

    src: int
    view: int
    owner: int
    index: int
    keys: tuple[str, ...]
    o_prefix: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OAccept:
    """Accept phase of the O-instances in ``entries``, proposed at ballot ``view``."""

    src: int
    view: int
    entries: tuple[OEntry, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class OAck:
    """``src`` accepted the O-instances ``slots`` at ballot ``view``."""

    src: int
    view: int
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class OCommit:
    """The O-instances in ``entries`` are chosen (sent by their command leader)."""

    src: int
    view: int
    entries: tuple[OEntry, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Catchup:
    """A replica that cannot execute global slot ``slot`` asks a peer for what it misses.

    The peer answers with ``OCommit``s for the committed slots from ``slot`` on and
    ``CCommit``s (with values) for the C-instances they place (the baselines: ``PaxosCommit``s
    with values). Replicas ask ``CatchupMarkers`` first.
    """

    src: int
    view: int
    slot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CatchupMarkers:
    """``Catchup`` without the values: the peer answers alike, but its ``CCommit``s (or
    ``PaxosCommit``s) carry no batch. A replica that stalls only because its peers are slow
    holds the values it accepted and misses just the commits; this is what it asks first. It
    asks ``Catchup`` once a commit names an instance whose value it lacks.
    """

    src: int
    view: int
    slot: int


# --------------------------------------------------------------------------- failures (§3.3)


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """Liveness, sent to every peer each ``heartbeat_us``.

    ``executed`` is the sender's execution frontier (slots below it ran), so a peer that lost
    the last commits learns it is behind. A sequencer sets ``lease_request`` to its own clock
    reading (else ``NO_LEASE_REQUEST``); a peer that grants the lease echoes it in
    ``LeaseGrant``.
    """

    src: int
    view: int
    executed: int
    lease_request: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseGrant:
    """``src`` promises to vote for nobody else for ``lease_us`` (its clock) from receipt of
    the heartbeat that carried ``request``."""

    src: int
    view: int
    request: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PreVote:
    """Would ``src`` get your vote as sequencer of ``view``? Asked before a candidacy, so a
    replica that cannot win (everyone still hears a live sequencer) never bumps the view."""

    src: int
    view: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PreVoteReply:
    """The answer to ``PreVote`` for ``view``. Promises nothing (nothing is persisted)."""

    src: int
    view: int
    granted: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class VRequest:
    """Candidate ``src`` asks for votes in ``view`` (its O-prepare for slots >= ``from_slot``)."""

    src: int
    view: int
    from_slot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OVote:
    """An O-instance a voter accepted: ``slot`` -> ``owner`` at ballot (view) ``ballot``."""

    slot: int
    owner: int
    ballot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Vote:
    """``src`` joined ``view`` and votes for its sequencer.

    ``entries``: every O-instance it accepted from the candidate's ``from_slot`` on.
    ``c_high[r]``: the highest index of replica r's C-instances it accepted (-1: none).
    ``accepted_view``: the last view whose sequencer's proposals it accepted (0 at the start:
    view 0's empty assignment log counts as accepted by everyone); ``accepted_from``: the first
    slot of that view's NewView (a lower bound on what the voter holds from that view on).
    """

    src: int
    view: int
    accepted_view: int
    accepted_from: int
    executed: int
    entries: tuple[OVote, ...]
    c_high: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NewView:
    """The new sequencer's rebuilt assignment log: slot ``start + k`` -> ``owners[k]``.

    Accepting it replaces every not-yet-executed O-instance at or after ``start``; slots at or
    after ``start + len(owners)`` are empty in the new view until the sequencer fills them.
    """

    src: int
    view: int
    start: int
    owners: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NewViewAck:
    """``src`` accepted the ``NewView`` of ``view``."""

    src: int
    view: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CPrepare:
    """Prepare phase, at ``ballot``, of replica ``owner``'s C-instances from ``from_index`` on."""

    src: int
    view: int
    owner: int
    from_index: int
    ballot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CVote:
    """A C-instance value an acceptor accepted (in a ``CPromise``)."""

    index: int
    ballot: int
    batch: Batch


@dataclass(frozen=True, slots=True, kw_only=True)
class CPromise:
    """``src`` promises ``ballot`` for ``owner``'s instances from ``from_index`` on and reports
    what it accepted from there through ``through`` (``accepted``), and the highest index it
    accepted (``high``, -1 for none). A promise over more than a message may carry reports on
    a page (``through`` < ``high``): the recoverer asks again from ``through + 1``; a whole
    report has ``through == EVERY_INDEX``."""

    src: int
    view: int
    owner: int
    from_index: int
    ballot: int
    accepted: tuple[CVote, ...]
    high: int
    through: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CNack:
    """``C[owner][index]`` was not accepted at the sender's ballot: ``src`` promised ``ballot``."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnRequest:
    """A learner (membership: a member that does not vote yet) asks a voter for the executed
    global slots from ``slot`` on. ``src`` is a member id, not a core index; ``view`` is the
    start view of the learner's epoch (``consensus.protocol.membership``)."""

    src: int
    view: int
    slot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnedSlot:
    """One executed global slot for a learner: its commands, and whether it is the SEAL that
    ends its epoch (then ``batch`` is empty)."""

    seal: bool
    batch: Batch


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnReply:
    """Executed global slots ``start``, ``start + 1``, ... for a learner, and how far the
    sender executed (``executed``: the learner's lag)."""

    src: int
    view: int
    start: int
    executed: int
    slots: tuple[LearnedSlot, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotChunk:
    """Bytes ``[offset, offset + len(data))`` of an encoded snapshot of ``total`` bytes, for a
    peer behind the sender's compaction point (see ``consensus.storage.snapshot``)."""

    src: int
    view: int
    slot: int
    offset: int
    total: int
    data: bytes


# --------------------------------------------------------------------------- reads (§3.5)


@dataclass(frozen=True, slots=True, kw_only=True)
class RRequest:
    """Which slot must a read of ``keys`` wait for? (to the sequencer)"""

    src: int
    view: int
    read_id: int
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RReply:
    """Serve read ``read_id`` once every slot up to ``slot`` has executed (-1: at once)."""

    src: int
    view: int
    read_id: int
    slot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Suspect:
    """``src`` finds the sequencer of ``view`` too slow (straggler detection, §4)."""

    src: int
    view: int


# --------------------------------------------------------------------------- baselines (§4)
# One Paxos instance per global slot; its value is a batch of commands (``()``: a no-op).
# In the normal case every instance runs at its proposer's pre-prepared ballot
# ``ballot_of(0, proposer)``: the leader's (Multi-Paxos) or the slot owner's (Mencius).
# The baselines have no views: ``view`` is always 0 (kept like every peer message's, so any
# core can read it; an SDPaxos replica ignores these messages).


@dataclass(frozen=True, slots=True, kw_only=True)
class PaxosForward:
    """Multi-Paxos: client commands that arrived at ``src``, for the leader to propose."""

    src: int
    view: int
    commands: tuple[Command, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PaxosAccept:
    """Multi-Paxos: Accept phase of global slot ``slot`` at ``ballot`` with value ``batch``."""

    src: int
    view: int
    slot: int
    ballot: int
    batch: Batch


@dataclass(frozen=True, slots=True, kw_only=True)
class PaxosAck:
    """Multi-Paxos: ``src`` accepted ``slots`` at ``ballot`` (sent to their proposer)."""

    src: int
    view: int
    ballot: int
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PaxosCommit:
    """Multi-Paxos and Mencius: global slot ``slot`` is chosen at ``ballot``. ``batch`` is None
    when the receiver holds the value (it acknowledged it); ``()`` is a chosen no-op."""

    src: int
    view: int
    slot: int
    ballot: int
    batch: Batch | None


@dataclass(frozen=True, slots=True, kw_only=True)
class MenciusAccept:
    """Mencius: Accept phase of ``slot`` (owned by ``src``) at ``ballot`` with ``batch``.

    Carries a skip, like every Mencius message from a slot owner: ``src``'s own slots in
    ``[skip_start, skip_stop)`` are no-ops (``skip_start == skip_stop``: no skip).
    """

    src: int
    view: int
    slot: int
    ballot: int
    batch: Batch
    skip_start: int
    skip_stop: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MenciusAck:
    """Mencius: ``src`` accepted ``slots`` (all owned by the receiver) at ``ballot``, and
    skipped its own slots in ``[skip_start, skip_stop)``."""

    src: int
    view: int
    ballot: int
    slots: tuple[int, ...]
    skip_start: int
    skip_stop: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MenciusSkip:
    """Mencius: ``src``'s own slots in ``[skip_start, skip_stop)`` are no-ops (sent when no
    accept or acknowledgement goes to the receiver to carry the skip)."""

    src: int
    view: int
    skip_start: int
    skip_stop: int



# --------------------------------------------------------------------------- EPaxos
# EPaxos (Moraru, Andersen, Kaminsky, SOSP'13; ``consensus.protocol.epaxos``): every replica
# leads its own instances ``(owner, index)``; an instance's value is a batch of commands with
# its attributes, a sequence number ``seq`` and dependencies ``deps`` (``deps[r]``: the
# highest index of replica r's instances it depends on, -1 for none; one entry per replica).
# ``view`` is always 0. ``ok`` False in a reply: the sender promised a higher ``ballot``.


@dataclass(frozen=True, slots=True, kw_only=True)
class EPreAccept:
    """EPaxos phase 1: pre-accept instance ``(owner, index)`` at ``ballot`` with ``batch`` and
    the proposer's attributes ``seq`` and ``deps``."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int
    batch: tuple[Command, ...]
    seq: int
    deps: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class EPreAcceptReply:
    """EPaxos: ``src`` pre-accepted ``(owner, index)`` at ``ballot`` with attributes ``seq``
    and ``deps`` (the proposer's merged with its own conflicts; ``changed``: they differ)."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int
    ok: bool
    seq: int
    deps: tuple[int, ...]
    changed: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class EAccept:
    """EPaxos phase 2 (the slow path): accept ``(owner, index)`` at ``ballot`` with final
    attributes."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int
    batch: tuple[Command, ...]
    seq: int
    deps: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class EAcceptReply:
    """EPaxos: ``src`` accepted ``(owner, index)`` at ``ballot`` (or refused: ``ok`` False)."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int
    ok: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ECommit:
    """EPaxos: ``(owner, index)`` is committed with ``batch``, ``seq`` and ``deps``."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int
    batch: tuple[Command, ...]
    seq: int
    deps: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class EPrepare:
    """EPaxos explicit prepare: ``src`` recovers ``(owner, index)`` at ``ballot``."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EPrepareReply:
    """EPaxos: ``src``'s state of ``(owner, index)``: ``status`` (0 none, 1 pre-accepted with
    changed attributes, 2 pre-accepted with the proposer's, 3 accepted, 4 committed), the
    ballot ``vballot`` it (pre-)accepted them at, and the value. ``ok`` False: it promised
    ``ballot``, higher than the prepare's (the rest is empty then)."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int
    ok: bool
    status: int
    vballot: int
    batch: tuple[Command, ...]
    seq: int
    deps: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ETryPreAccept:
    """EPaxos recovery (the optimized fast quorum's TryPreAccept): ``src`` recovers ``(owner,
    index)`` at ``ballot`` and asks the receiver to pre-accept the owner's own attributes
    ``seq`` and ``deps`` unchanged, if nothing it knows conflicts with them."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int
    batch: tuple[Command, ...]
    seq: int
    deps: tuple[int, ...]


#: ``ETryPreAcceptReply.conflict``: pre-accepted; refused for a conflicting instance not yet
#: committed at the sender; refused for a committed one
TRY_OK: Final = 0
TRY_CONFLICT: Final = 1
TRY_CONFLICT_COMMITTED: Final = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ETryPreAcceptReply:
    """EPaxos: ``src``'s answer to a TryPreAccept: ``conflict`` is ``TRY_OK`` (it holds the
    attributes now), ``TRY_CONFLICT`` or ``TRY_CONFLICT_COMMITTED`` (an instance conflicting
    with the command is neither in its ``deps`` nor depends on it). ``ok`` False: it promised
    ``ballot``, higher than the TryPreAccept's."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int
    ok: bool
    conflict: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EInstanceRecord:
    """EPaxos: this replica's state of instance ``(owner, index)`` (the latest record of an
    instance wins): promised ``ballot``; ``status`` (as ``EPrepareReply.status``, 0: a
    promise only) and the value and attributes (pre-)accepted at ``vballot``."""

    owner: int
    index: int
    ballot: int
    vballot: int
    status: int
    batch: tuple[Command, ...]
    seq: int
    deps: tuple[int, ...]



# --------------------------------------------------------------------------- baseline failover
# Multi-Paxos leader takeover (phase 1 over the log) and Mencius revocation of a suspected
# owner's slots. ``CVote.index`` is a global slot in their ``accepted`` lists.


@dataclass(frozen=True, slots=True, kw_only=True)
class PaxosPrepare:
    """Multi-Paxos phase 1: ``src`` asks for promises at ``ballot`` and for every value
    accepted in global slots from ``from_slot`` on."""

    src: int
    view: int
    ballot: int
    from_slot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PaxosPromise:
    """Multi-Paxos: ``src`` promised ``ballot``; ``accepted`` is every value it accepted in
    slots ``from_slot..through`` (all of them from ``from_slot`` on when ``complete``). ``ok``
    False: it refuses, having promised the higher ``ballot`` (also a leader's Accept's
    refusal)."""

    src: int
    view: int
    ballot: int
    ok: bool
    from_slot: int
    through: int
    complete: bool
    accepted: tuple[CVote, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class MenciusPrepare:
    """Mencius revocation: ``src`` asks for promises at ``ballot`` for ``owner``'s slots in
    ``[start, stop)``."""

    src: int
    view: int
    owner: int
    start: int
    stop: int
    ballot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MenciusPromise:
    """Mencius: ``src`` promised ``ballot`` for ``owner``'s slots in ``[start, stop)`` and
    reports what it accepted there (``ok`` False: it promised the higher ``ballot``)."""

    src: int
    view: int
    owner: int
    start: int
    stop: int
    ballot: int
    ok: bool
    accepted: tuple[CVote, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PaxosPromiseRecord:
    """Multi-Paxos: this replica promised ``ballot`` (for every slot)."""

    ballot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MenciusPromiseRecord:
    """Mencius: this replica promised ``ballot`` for ``owner``'s slots in ``[start, stop)``."""

    owner: int
    start: int
    stop: int
    ballot: int


PeerMessage = (
    CAccept
    | CAck
    | CCommit
    | CRequest
    | OAccept
    | OAck
    | OCommit
    | Catchup
    | CatchupMarkers
    | Heartbeat
    | LeaseGrant
    | VRequest
    | Vote
    | NewView
    | NewViewAck
    | CPrepare
    | CPromise
    | CNack
    | RRequest
    | RReply
    | Suspect
    | PreVote
    | PreVoteReply
    | SnapshotChunk
    | LearnRequest
    | LearnReply
    | PaxosForward
    | PaxosAccept
    | PaxosAck
    | PaxosCommit
    | MenciusAccept
    | MenciusAck
    | MenciusSkip
    | EPreAccept
    | EPreAcceptReply
    | EAccept
    | EAcceptReply
    | ECommit
    | EPrepare
    | EPrepareReply
    | ETryPreAccept
    | ETryPreAcceptReply
    | PaxosPrepare
    | PaxosPromise
    | MenciusPrepare
    | MenciusPromise
)


# --------------------------------------------------------------------------- durable records


@dataclass(frozen=True, slots=True, kw_only=True)
class CAcceptedRecord:
    """This replica accepted ``C[owner][index]`` at ``ballot`` with ``batch``."""

    owner: int
    index: int
    ballot: int
    batch: Batch


@dataclass(frozen=True, slots=True, kw_only=True)
class OAcceptedRecord:
    """This replica accepted the O-instances ``entries`` at ballot ``view``."""

    view: int
    entries: tuple[OEntry, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewRecord:
    """This replica joined ``view``: it promises to reject O-instance proposals of lower views."""

    view: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NewViewRecord:
    """This replica accepted the rebuilt assignment log of ``view`` (see ``NewView``)."""

    view: int
    start: int
    owners: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CPromiseRecord:
    """This replica promised ``ballot`` for ``owner``'s C-instances from ``from_index`` on."""

    owner: int
    from_index: int
    ballot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReserveRecord:
    """This replica's own C-instance indexes below ``below`` may have been used: a
    ``CAccept`` for one may have left before its ``CAcceptedRecord`` was durable. A restart
    never proposes at an index below it (``CStore``: reservations)."""

    below: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberEntry:
    """One member of a ``ConfigRecord`` (``consensus.protocol.membership.Member``)."""

    id: int
    incarnation: int
    voter: bool
    info: str
    replaces: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigRecord:
    """The configuration an epoch starts with (or, in a snapshot, the one in force at it):
    the records after it belong to that epoch (``consensus.protocol.membership``)."""

    epoch: int
    base: int
    next_id: int
    voters: tuple[int, ...]
    members: tuple[MemberEntry, ...]
    closing: str
    closing_member: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutedRecord:
    """This replica executed slots ``start``, ``start + 1``, ...: slot ``start + k`` held
    ``owners[k]``'s next C-instance (or nothing, ``NO_CL``), chosen at ``ballots[k]`` (0 for
    ``NO_CL``). Executed means chosen, so a restart re-executes these slots from its own
    records (the values are in them, at that ballot or higher) instead of re-learning them
    from its peers through messages sized by the log."""

    start: int
    owners: tuple[int, ...]
    ballots: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnedRecord:
    """A learner (membership: a member that does not vote yet) applied global slots
    ``start``, ``start + 1``, ... as a voter's ``LearnReply`` carried them (chosen values): a
    restart applies them again from its records and goes on learning after them, instead of
    learning everything since its last snapshot again."""

    start: int
    slots: tuple[LearnedSlot, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotAcceptedRecord:
    """Baselines: this replica accepted global slot ``slot`` at ``ballot`` with ``batch``."""

    slot: int
    ballot: int
    batch: Batch


@dataclass(frozen=True, slots=True, kw_only=True)
class SkipRecord:
    """Mencius: this replica skipped its own slots in ``[start, stop)`` (no-ops, for good)."""

    start: int
    stop: int


Record = (
    CAcceptedRecord
    | OAcceptedRecord
    | ViewRecord
    | NewViewRecord
    | CPromiseRecord
    | ReserveRecord
    | ExecutedRecord
    | ConfigRecord
    | LearnedRecord
    | SlotAcceptedRecord
    | SkipRecord
    | EInstanceRecord
    | PaxosPromiseRecord
    | MenciusPromiseRecord
)
