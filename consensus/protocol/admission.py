"""Admission of peer messages: every replica id, instance index, global slot, view and ballot
in a decoded peer message is checked against the configuration and the receiver's state
before any core sees it. Pure (no I/O): the driver calls it on each decoded frame and drops
the whole frame on the first message it rejects.

Why: the codec (``consensus.codec``) checks types and int64 ranges only. A well-formed message
naming replica N (one past the last) raised ``IndexError``/``KeyError`` inside the SDPaxos
handlers, and a well-formed huge index or slot made handlers loop or allocate up to it (the
sequencer orders O-instances for an owner until it owns ``index + 1``; a slot raises
``o_high``, which every scan of the unexecuted log walks up to). Here every such field is
named in one table (``ADMISSION_TABLE``, h11-style: one entry per message class, a rule per
field beside it). A new message class without an entry, or a new field without a rule, fails
the tests (tests/protocol/test_admission.py); until it has one, a message of that class is
rejected (kind ``protocol``).

The rules (``Bounds`` holds the receiver's state they read, taken once per frame):

* **Replica ids** (``src``, ``owner``): ``0 <= id < N``. ``src`` is also not the receiver, and
  when the driver knows which peer the connection authenticated, it is that peer. An
  O-instance's owner (``OEntry.owner``, ``OVote.owner``, ``NewView.owners``) may be ``NO_CL``
  or ``SEAL``.
* **Views**: ``0 <= view <= receiver's view + VIEW_WINDOW``. The baselines have no views:
  their messages (and everything a baseline receiver gets) carry view 0. An O-instance's
  accepted ballot (``OVote.ballot``) and ``Vote.accepted_view`` are views at most the vote's
  own (``-1`` allowed for ``accepted_view``: the codec's "none").
* **C-ballots** pack ``(round, proposer)`` (``consensus.protocol.ballot``): the proposer
  ``ballot % BALLOT_STRIDE`` is a replica id; a ``CPrepare``'s ballot is its sender's and of
  round 1 at least (recoveries use ``next_ballot``). The baselines run round 0 only: their
  ballots are ``ballot_of(0, proposer)``, and an Accept's proposer is its sender.
* **Global slots**: ``0 <= slot <= exec_slot + SLOT_WINDOW``. **C-instance indexes** of
  replica ``r``: ``0 <= index <= exec_counts[r] + window`` with a window per field (see
  the constants). ``-1`` only where the codec allows it ("none").
* **Frontiers** (``Heartbeat.executed``, ``Vote.executed``, ``Vote.accepted_from``,
  ``VRequest.from_slot``, ``SnapshotChunk.slot``), clock readings and read ids:
  ``0 <= x <= MAX_COUNTER`` and no window: a replica far behind must still learn how far
  (that is how it asks for catch-up), and no handler loops up to one of them.
* **Lengths**: ``Vote.c_high`` has exactly N entries; ``SnapshotChunk`` bytes lie inside
  ``[0, total]`` and ``total <= MAX_SNAPSHOT_BYTES``; a paged ``CPromise`` runs ``through``
  an index at least its ``from_index`` (or ``EVERY_INDEX``).
* **Protocol**: given the receiver's protocol, a message class that protocol never sends
  (a misconfigured peer) is rejected.

Every bound is at most ``MAX_COUNTER`` (2**62), so a core adding a window, a stride or one to
an admitted value still encodes it in int64.

Windows never drop a correct peer's message in practice (catch-up traffic is always inside
them: a catch-up answer starts at the asker's own frontier) and bound what one message can
make a handler do:

* ``SLOT_WINDOW`` = Mencius's ``MAX_AHEAD`` (2**20 slots): a correct peer is never further
  ahead of the receiver's execution than the commands in flight, and a replica that far behind
  is past its peers' compaction point (they keep at most two snapshot intervals, 2 x 100,000
  commands by default, and a slot holds one command at least): it installs a snapshot first.
  It bounds the log scans a forged slot can lengthen (~50 ms each).
* ``INDEX_WINDOW`` (2**20 instances of one owner): the same argument per owner.
* ``ORDER_WINDOW`` = ``MAX_ENTRIES``: an index that makes the sequencer order (``CAccept``,
  ``CRequest``) or a recovery re-propose (``CPromise``) for every missing instance up to it.
  A sequencer orders all of an owner's missing O-instances in one ``OAccept``, and no peer
  decodes an OAccept of more than ``MAX_ENTRIES`` entries: beyond it the protocol cannot
  proceed anyway.
* ``OWN_WINDOW`` (half of ``ORDER_WINDOW``): an index naming the receiver's own instances can
  move its next index (it never reuses one somebody used); kept within half the ordering
  window so its next proposals stay orderable.
* ``VOTE_WINDOW`` = ``MAX_SLOTS``: a candidate's NewView lists one owner per slot from its
  execution frontier through the highest slot (and hole-filled index) the votes name, and no
  peer decodes a NewView of more than ``MAX_SLOTS`` owners.
* ``VIEW_WINDOW`` (2**32): a candidacy raises the view by at most N, and elections are an
  election timeout apart: a replica would have to miss years of them to be that far behind.

What admission does not bound: the work a message inside the windows legitimately causes.
The sharpest case known is ``sdpaxos.view_change.fill_for`` (N=5 view change): a vote with
``c_high[m]`` k above the candidate's count has it fill k holes. It fills them in one pass,
linear in k (``test_hole_filling_is_linear``: 200,000 of them; under a millisecond at
k = 8,192); it was quadratic, 1.3 s at k = 4,096. Narrowing ``VOTE_WINDOW`` instead would
drop correct votes after a long sequencer outage and stall the view change for good.

Cost: every peer message passes here. ``Entry.passes`` is generated per class from the table
(like the codec's decoders) and tests the rules inline without building a sentence; only a
message it refuses is walked again for the reason. About 1 µs a message on this project's
2-core test machine, a quarter of decoding it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol

from consensus.messages import (
    EVERY_INDEX,
    MAX_ENTRIES,
    MAX_SLOTS,
    NO_CL,
    SEAL,
    TRY_CONFLICT_COMMITTED,
    TRY_OK,
    CAccept,
    CAck,
    Catchup,
    CatchupMarkers,
    CCommit,
    CNack,
    CPrepare,
    CPromise,
    CRequest,
    EAccept,
    EAcceptReply,
    ECommit,
    EPreAccept,
    EPreAcceptReply,
    EPrepare,
    EPrepareReply,
    ETryPreAccept,
    ETryPreAcceptReply,
    Heartbeat,
    LearnReply,
    LearnRequest,
    LeaseGrant,
    MenciusAccept,
    MenciusAck,
    MenciusPrepare,
    MenciusPromise,
    MenciusSkip,
    NewView,
    NewViewAck,
    OAccept,
    OAck,
    OCommit,
    PaxosAccept,
    PaxosAck,
    PaxosCommit,
    PaxosForward,
    PaxosPrepare,
    PaxosPromise,
    PeerMessage,
    PreVote,
    PreVoteReply,
    RReply,
    RRequest,
    SnapshotChunk,
    Suspect,
    Vote,
    VRequest,
)
from consensus.protocol.ballot import BALLOT_STRIDE

if TYPE_CHECKING:
    from consensus.protocol.types import SnapshotMeta

__all__ = [
    "ADMISSION_TABLE",
    "INDEX_WINDOW",
    "MAX_COUNTER",
    "MAX_SNAPSHOT_BYTES",
    "ORDER_WINDOW",
    "OWN_WINDOW",
    "REJECTION_KINDS",
    "SLOT_WINDOW",
    "VIEW_WINDOW",
    "VOTE_WINDOW",
    "Bounds",
    "Receiver",
    "Rejection",
    "check_frame",
    "check_message",
    "check_peer_message",
]

#: every admitted int is at most this: a core may add windows, strides and ones to it and
#: still fit int64 (2**63 - 1) on the wire
MAX_COUNTER: Final = 1 << 62
#: how far above the receiver's view a message's view may be (see the module docstring)
VIEW_WINDOW: Final = 1 << 32
#: how far above the receiver's execution frontier a global slot may be; the same as
#: ``consensus.protocol.mencius.MAX_AHEAD`` (Mencius's own plausibility bound)
SLOT_WINDOW: Final = 1 << 20
#: how far above the receiver's executed count of an owner a C-instance index may be
INDEX_WINDOW: Final = 1 << 20
#: ... for an index the sequencer orders up to, or a recovery re-proposes up to
ORDER_WINDOW: Final = MAX_ENTRIES
#: ... for an index of the receiver's own instances (it may move its next index)
OWN_WINDOW: Final = ORDER_WINDOW // 2
#: ... for a slot or index a vote asks the candidate's NewView to cover
VOTE_WINDOW: Final = MAX_SLOTS
#: the largest snapshot a peer may announce (the node refuses larger ones too)
MAX_SNAPSHOT_BYTES: Final = 1 << 34

#: what ``Rejection.kind`` may be (the metric's label values), in a stable order
REJECTION_KINDS: Final = (
    "sender", "replica", "view", "slot", "index", "ballot", "length", "counter", "protocol",
)

#: the protocols (``consensus.protocol.registry.PROTOCOLS``) and which send what
_SDPAXOS: Final = frozenset({"sdpaxos"})
_MULTIPAXOS: Final = frozenset({"multipaxos"})
_MENCIUS: Final = frozenset({"mencius"})
_EPAXOS: Final = frozenset({"epaxos"})
_EVERY: Final = _SDPAXOS | _MULTIPAXOS | _MENCIUS | _EPAXOS
#: protocols without views: every message they exchange carries view 0 (Multi-Paxos's
#: heartbeats carry the sender's ballot as their view: it has leaders)
_VIEWLESS: Final = _MENCIUS | _EPAXOS


class Receiver(Protocol):
    """What admission reads of the receiving core (every ``DrivenCore`` has it)."""

    @property
    def me(self) -> int: ...

    @property
    def view(self) -> int: ...

    @property
    def exec_slot(self) -> int: ...

    def snapshot_meta(self) -> SnapshotMeta: ...


class Bounds:
    """The receiver's state the rules compare with, taken once per frame (read-only). It
    only grows (views, frontiers and executed counts never go back), so what is admitted
    against it stays admissible until the core steps it. A plain slotted class built by one
    ``__init__``: a dataclass's keyword construction and ``__post_init__`` cost four times
    as much, per frame every peer sends."""

    __slots__ = ("_counts", "exec_slot", "me", "protocol", "receiver", "replicas",
                 "slot_max", "view_max")

    replicas: int
    me: int
    #: the receiver's protocol (``None``: unknown, every class is accepted)
    protocol: str | None
    view_max: int
    exec_slot: int
    #: where the per-replica executed counts come from (read only if a message has an index)
    receiver: Receiver
    #: the highest global slot admitted (``exec_slot + SLOT_WINDOW``)
    slot_max: int
    _counts: tuple[int, ...] | None

    def __init__(self, receiver: Receiver, replicas: int, protocol: str | None = None) -> None:
        self.replicas = replicas
        self.me = receiver.me
        self.protocol = protocol
        view_max = receiver.view + (0 if protocol in _VIEWLESS else VIEW_WINDOW)
        self.view_max = view_max if view_max < MAX_COUNTER else MAX_COUNTER
        self.exec_slot = exec_slot = receiver.exec_slot
        slot_max = exec_slot + SLOT_WINDOW
        self.slot_max = slot_max if slot_max < MAX_COUNTER else MAX_COUNTER
        self.receiver = receiver
        self._counts = None

    @classmethod
    def of(cls, receiver: Receiver, replicas: int, protocol: str | None = None) -> Bounds:
        return cls(receiver, replicas, protocol)

    @property
    def exec_counts(self) -> tuple[int, ...]:
        """Per replica, how many of its C-instances the receiver executed (taken once)."""
        if self._counts is None:
            counts = tuple(self.receiver.snapshot_meta().exec_counts)
            if len(counts) != self.replicas:
                counts = (0,) * self.replicas  # (a core that keeps no counts: from 0)
            self._counts = counts
        return self._counts


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a message was refused: ``kind`` (one of ``REJECTION_KINDS``) and a sentence."""

    kind: str
    reason: str

    def __str__(self) -> str:
        return self.reason


#: A rule checks one field's value of a message: ``(value, message, bounds)`` -> None, or
#: ``(kind, what is wrong)``.
Verdict = tuple[str, str] | None
Rule = Callable[[Any, Any, Bounds], Verdict]


# --------------------------------------------------------------------------- scalar rules


def _int_in(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


# Each rule tests the common case inline (it runs for every field of every message) and
# builds its sentence only when it refuses.


def _replica_id(value: Any, b: Bounds) -> Verdict:
    if type(value) is int and 0 <= value < b.replicas:
        return None
    return "replica", f"replica id {value!r} outside 0..{b.replicas - 1}"


def _owner_or_none(value: Any, b: Bounds) -> Verdict:
    if value in (NO_CL, SEAL) and type(value) is int:
        return None
    return _replica_id(value, b)


def sender(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``src``: a replica id other than the receiver's."""
    if type(value) is int and 0 <= value < b.replicas and value != b.me:
        return None
    verdict = _replica_id(value, b)
    if verdict is not None:
        return "sender", verdict[1]
    if value == b.me:
        return "sender", f"src {value} is the receiver itself"
    return None


def replica(value: Any, msg: Any, b: Bounds) -> Verdict:
    """A replica id."""
    if type(value) is int and 0 <= value < b.replicas:
        return None
    return _replica_id(value, b)


def view(value: Any, msg: Any, b: Bounds) -> Verdict:
    """A view: at most ``VIEW_WINDOW`` above the receiver's (0 for the baselines)."""
    if type(value) is int and 0 <= value <= b.view_max:
        return None
    return "view", f"view {value!r} outside 0..{b.view_max}"


def baseline_view(value: Any, msg: Any, b: Bounds) -> Verdict:
    """The baselines have no views: always 0."""
    return None if value == 0 and type(value) is int else ("view", f"view {value!r} is not 0")


def _slot_at_most(value: Any, high: int, none_ok: bool) -> Verdict:
    if _int_in(value, -1 if none_ok else 0, high):
        return None
    return "slot", f"slot {value!r} outside {-1 if none_ok else 0}..{high}"


def slot(value: Any, msg: Any, b: Bounds) -> Verdict:
    """A global slot: at most ``SLOT_WINDOW`` above the receiver's execution frontier."""
    if type(value) is int and 0 <= value <= b.slot_max:
        return None
    return _slot_at_most(value, b.slot_max, False)


def slot_or_none(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``slot``, or -1 (none)."""
    return _slot_at_most(value, b.slot_max, True)


def counter(value: Any, msg: Any, b: Bounds) -> Verdict:
    """A frontier, clock reading, read id or byte count: no window (see module docstring)."""
    if type(value) is int and 0 <= value <= MAX_COUNTER:
        return None
    return "counter", f"{value!r} outside 0..{MAX_COUNTER}"


def counter_or_none(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``counter``, or -1 (none)."""
    return None if value == -1 and type(value) is int else counter(value, msg, b)


def ballot(value: Any, msg: Any, b: Bounds) -> Verdict:
    """A C-instance ballot: its proposer (``ballot % BALLOT_STRIDE``) is a replica."""
    if type(value) is int and 0 <= value <= MAX_COUNTER and value % BALLOT_STRIDE < b.replicas:
        return None
    if not _int_in(value, 0, MAX_COUNTER):
        return "ballot", f"ballot {value!r} outside 0..{MAX_COUNTER}"
    if value % BALLOT_STRIDE >= b.replicas:
        return "ballot", f"ballot {value} names proposer {value % BALLOT_STRIDE}, not a replica"
    return None


def prepare_ballot(value: Any, msg: Any, b: Bounds) -> Verdict:
    """A recovery's ballot: its sender's, of round 1 at least (``next_ballot``)."""
    verdict = ballot(value, msg, b)
    if verdict is not None:
        return verdict
    if value % BALLOT_STRIDE != msg.src or value < BALLOT_STRIDE:
        return "ballot", f"prepare ballot {value} is not a recovery ballot of replica {msg.src}"
    return None


def baseline_ballot(value: Any, msg: Any, b: Bounds) -> Verdict:
    """The baselines' ballots are ``ballot_of(0, proposer)``: a replica id."""
    if _int_in(value, 0, b.replicas - 1):
        return None
    return "ballot", f"ballot {value!r} is not a round-0 ballot of a replica"


def own_baseline_ballot(value: Any, msg: Any, b: Bounds) -> Verdict:
    """A baseline Accept's ballot: its sender's own round-0 ballot."""
    if value == msg.src and type(value) is int:
        return None
    return "ballot", f"ballot {value!r} is not replica {msg.src}'s"


def own_ballot(value: Any, msg: Any, b: Bounds) -> Verdict:
    """A ballot of the message's sender (any round): a leader's or revoker's Accept."""
    verdict = ballot(value, msg, b)
    if verdict is not None:
        return verdict
    if value % BALLOT_STRIDE != msg.src:
        return "ballot", f"ballot {value} is not replica {msg.src}'s"
    return None


def free(value: Any, msg: Any, b: Bounds) -> Verdict:
    """Opaque payload (commands, keys, bytes, flags): nothing here names a replica, an
    instance, a slot, a view or a ballot."""
    return None


@dataclass(frozen=True, slots=True)
class Index:
    """A C-instance index of the replica named by the message's ``owner`` field (or
    ``owner_of(msg)``), at most ``window`` - 1 above the receiver's executed count of it
    (``OWN_WINDOW`` for the receiver's own instances); -1 too if ``none_ok``."""

    window: int
    none_ok: bool = False

    def __call__(self, value: Any, msg: Any, b: Bounds) -> Verdict:
        return _index(value, msg.owner, self.window, self.none_ok, b)


def _index(value: Any, owner: int, window: int, none_ok: bool, b: Bounds) -> Verdict:
    if not 0 <= owner < b.replicas:
        return "replica", f"owner {owner} outside 0..{b.replicas - 1}"  # (checked first anyway)
    if owner == b.me:
        window = min(window, OWN_WINDOW)
    high = min(b.exec_counts[owner] + window - 1, MAX_COUNTER)
    if type(value) is int and (-1 if none_ok else 0) <= value <= high:
        return None
    return "index", f"index {value!r} of replica {owner} outside {-1 if none_ok else 0}..{high}"


# --------------------------------------------------------------------------- nested values


def slots(value: Any, msg: Any, b: Bounds) -> Verdict:
    """A tuple of global slots (``slot`` each)."""
    if not value:
        return None
    high = b.slot_max
    low, top = min(value), max(value)
    return _slot_at_most(low, high, False) or _slot_at_most(top, high, False)


def entries(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``OEntry`` values: a ``slot`` and an owner (a replica id or NO_CL)."""
    high, replicas = b.slot_max, b.replicas
    for entry in value:
        slot_, owner = entry.slot, entry.owner
        if not (type(slot_) is int and 0 <= slot_ <= high):
            return _slot_at_most(slot_, high, False)
        if not (type(owner) is int and NO_CL <= owner < replicas):
            return _owner_or_none(owner, b)
    return None


def owners(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``NewView.owners``: each a replica id or NO_CL, the last slot inside the window."""
    for owner in set(value):
        verdict = _owner_or_none(owner, b)
        if verdict is not None:
            return verdict
    return slot(msg.start + len(value) - 1, msg, b) if value else None


def ovotes(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``OVote`` values: a slot the candidate's NewView can cover (``VOTE_WINDOW``), an owner
    (a replica id or NO_CL) and a ballot that is a view at most the vote's."""
    high = min(b.exec_slot + VOTE_WINDOW - 1, MAX_COUNTER)
    for vote in value:
        verdict = _slot_at_most(vote.slot, high, False) or _owner_or_none(vote.owner, b)
        if verdict is not None:
            return verdict
        if not _int_in(vote.ballot, 0, msg.view):
            return "view", f"accepted ballot {vote.ballot!r} outside 0..{msg.view}"
    return None


def cvotes(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``CVote`` values of ``msg.owner``'s instances: an index a recovery may re-propose up
    to (``ORDER_WINDOW``) and a C-ballot."""
    for vote in value:
        verdict = _index(vote.index, msg.owner, ORDER_WINDOW, False, b) or ballot(
            vote.ballot, msg, b
        )
        if verdict is not None:
            return verdict
    return None


def c_high(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``Vote.c_high``: exactly N entries, entry r an index of replica r or -1, within what
    the candidate's NewView can fill for r (``VOTE_WINDOW``)."""
    if len(value) != b.replicas:
        return "length", f"c_high has {len(value)} entries, not {b.replicas}"
    for owner, high in enumerate(value):
        verdict = _index(high, owner, VOTE_WINDOW, True, b)
        if verdict is not None:
            return verdict
    return None


def promise_through(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``CPromise.through``: ``EVERY_INDEX`` (a whole report), or the last index of a page,
    at least its ``from_index`` and an index a recovery may re-propose up to."""
    if value == EVERY_INDEX and type(value) is int:
        return None
    if type(value) is int and value < msg.from_index:
        return "index", f"page through {value} before its start {msg.from_index}"
    return _index(value, msg.owner, ORDER_WINDOW, False, b)


def slot_votes(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``CVote`` values naming global slots (``PaxosPromise``, ``MenciusPromise``): a slot
    inside the window and a ballot."""
    high = b.slot_max
    for vote in value:
        verdict = _slot_at_most(vote.index, high, False) or ballot(vote.ballot, msg, b)
        if verdict is not None:
            return verdict
    return None


#: the most slots one Mencius revocation names (``consensus.protocol.mencius.REVOKE_SPAN``)
REVOKE_SLOTS: Final = 1 << 16


def _revoked_range(msg: Any, b: Bounds) -> Verdict:
    """A revocation's ``[start, stop)``: in order, at most ``REVOKE_SLOTS`` slots."""
    if msg.start > msg.stop:
        return "slot", f"range {msg.start}..{msg.stop} is reversed"
    if msg.stop - msg.start > REVOKE_SLOTS:
        return "length", f"range of {msg.stop - msg.start} slots over {REVOKE_SLOTS}"
    return None


def accepted_view(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``Vote.accepted_view``: a view at most the vote's own, or -1 (none)."""
    if _int_in(value, -1, msg.view):
        return None
    return "view", f"accepted view {value!r} outside -1..{msg.view}"


# --------------------------------------------------------------------------- cross-field


def _snapshot_chunk(msg: SnapshotChunk, b: Bounds) -> Verdict:
    if msg.total > MAX_SNAPSHOT_BYTES:
        return "length", f"snapshot of {msg.total} bytes over {MAX_SNAPSHOT_BYTES}"
    if msg.offset + len(msg.data) > msg.total:
        return "length", (
            f"snapshot bytes {msg.offset}..{msg.offset + len(msg.data)} past its total "
            f"{msg.total}"
        )
    return None


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True, slots=True)
class Entry:
    """One message class: the protocols that send it, a rule per field (every field, in
    declaration order; ``free`` for payloads), and checks across fields."""

    protocols: frozenset[str]
    rules: tuple[tuple[str, Rule], ...]
    across: tuple[Callable[[Any, Bounds], Verdict], ...] = ()
    #: ``passes(msg, bounds)``: True if every rule admits ``msg`` (generated from ``rules``)
    passes: Callable[[Any, Bounds], bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "passes", _generate_passes(self))


#: The common case of the simplest rules as inline expressions of ``v`` (the value), ``m``
#: (the message) and ``b`` (the bounds), for the generated ``Entry.passes``: the same tests as
#: the rules' own first lines (tests/protocol/test_admission.py checks that they agree).
_INLINE: Final[Mapping[Rule, str]] = MappingProxyType(
    {
        sender: "type(v) is int and 0 <= v < b.replicas and v != b.me",
        replica: "type(v) is int and 0 <= v < b.replicas",
        view: "type(v) is int and 0 <= v <= b.view_max",
        baseline_view: "v == 0 and type(v) is int",
        slot: "type(v) is int and 0 <= v <= b.slot_max",
        counter: "type(v) is int and 0 <= v <= MAX_COUNTER",
        ballot: "type(v) is int and 0 <= v <= MAX_COUNTER and v % BALLOT_STRIDE < b.replicas",
        free: "True",
    }
)


def _generate_passes(entry: Entry) -> Callable[[Any, Bounds], bool]:
    """One function per class that runs every rule without building any sentence: about a
    microsecond a message less than walking the table (every peer message passes here). A
    message it refuses is walked again by ``check_message`` for the reason."""
    lines = ["def passes(m, b):"]
    names: dict[str, Any] = {"MAX_COUNTER": MAX_COUNTER, "BALLOT_STRIDE": BALLOT_STRIDE}
    for i, (name, rule) in enumerate(entry.rules):
        inline = _INLINE.get(rule)
        if inline == "True":
            continue
        if inline is None:
            names[f"rule{i}"] = rule
            inline = f"rule{i}(v, m, b) is None"
        lines += [f"    v = m.{name}", f"    if not ({inline}):", "        return False"]
    for i, across in enumerate(entry.across):
        names[f"across{i}"] = across
        lines += [f"    if across{i}(m, b) is not None:", "        return False"]
    lines.append("    return True")
    exec("\n".join(lines), names)  # the source is built above from constant strings only
    passes: Callable[[Any, Bounds], bool] = names["passes"]
    return passes


# --------------------------------------------------------------------------- EPaxos

#: the highest ``EPrepareReply.status`` (committed; see ``consensus.messages``)
EPAXOS_MAX_STATUS: Final = 4


def epaxos_deps(value: Any, msg: Any, b: Bounds) -> Verdict:
    """EPaxos dependencies: exactly N entries, entry r an index of replica r or -1 (within
    ``INDEX_WINDOW`` of what the receiver executed of r)."""
    if len(value) != b.replicas:
        return "length", f"deps has {len(value)} entries, not {b.replicas}"
    for owner, high in enumerate(value):
        verdict = _index(high, owner, INDEX_WINDOW, True, b)
        if verdict is not None:
            return verdict
    return None


def epaxos_status(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``EPrepareReply.status``: 0..EPAXOS_MAX_STATUS."""
    if _int_in(value, 0, EPAXOS_MAX_STATUS):
        return None
    return "counter", f"status {value!r} outside 0..{EPAXOS_MAX_STATUS}"


def epaxos_conflict(value: Any, msg: Any, b: Bounds) -> Verdict:
    """``ETryPreAcceptReply.conflict``: one of ``TRY_OK``, ``TRY_CONFLICT``,
    ``TRY_CONFLICT_COMMITTED``."""
    if _int_in(value, TRY_OK, TRY_CONFLICT_COMMITTED):
        return None
    return "counter", f"conflict {value!r} outside {TRY_OK}..{TRY_CONFLICT_COMMITTED}"


#: an EPaxos message's instance: its owner, an index near what the receiver executed of it,
#: and a ballot of some replica
_E_INSTANCE: Final[tuple[tuple[str, Rule], ...]] = (
    ("src", sender), ("view", baseline_view), ("owner", replica),
    ("index", Index(INDEX_WINDOW)), ("ballot", ballot),
)


_SRC_VIEW: Final[tuple[tuple[str, Rule], ...]] = (("src", sender), ("view", view))
_BASELINE: Final[tuple[tuple[str, Rule], ...]] = (("src", sender), ("view", baseline_view))

ADMISSION_TABLE: Final[Mapping[type, Entry]] = MappingProxyType(
    {
        # ---------------------------------------------------------------- SDPaxos C-phase
        CAccept: Entry(_SDPAXOS, (*_SRC_VIEW, ("owner", replica), ("index", Index(ORDER_WINDOW)),
                                  ("ballot", ballot), ("batch", free))),
        CAck: Entry(_SDPAXOS, (*_SRC_VIEW, ("owner", replica), ("index", Index(INDEX_WINDOW)),
                               ("ballot", ballot))),
        CCommit: Entry(_SDPAXOS, (*_SRC_VIEW, ("owner", replica), ("index", Index(INDEX_WINDOW)),
                                  ("ballot", ballot), ("batch", free))),
        CRequest: Entry(_SDPAXOS, (*_SRC_VIEW, ("owner", replica),
                                   ("index", Index(ORDER_WINDOW)), ("keys", free),
                                   ("o_prefix", slot))),
        CPrepare: Entry(_SDPAXOS, (*_SRC_VIEW, ("owner", replica),
                                   ("from_index", Index(INDEX_WINDOW)),
                                   ("ballot", prepare_ballot))),
        CPromise: Entry(_SDPAXOS, (*_SRC_VIEW, ("owner", replica),
                                   ("from_index", Index(INDEX_WINDOW)), ("ballot", ballot),
                                   ("accepted", cvotes),
                                   ("high", Index(ORDER_WINDOW, none_ok=True)),
                                   # (a recovery stops at min(high, through): the bound
                                   # matters less than for high, but a correct page's end
                                   # is an index like it, at or after its from_index)
                                   ("through", promise_through))),
        CNack: Entry(_SDPAXOS, (*_SRC_VIEW, ("owner", replica), ("index", Index(INDEX_WINDOW)),
                                ("ballot", ballot))),
        # ---------------------------------------------------------------- SDPaxos O-phase
        OAccept: Entry(_SDPAXOS, (*_SRC_VIEW, ("entries", entries))),
        OAck: Entry(_SDPAXOS, (*_SRC_VIEW, ("slots", slots))),
        OCommit: Entry(_SDPAXOS, (*_SRC_VIEW, ("entries", entries))),
        # ---------------------------------------------------------------- views, leases
        Heartbeat: Entry(_EVERY, (*_SRC_VIEW, ("executed", counter),
                                  ("lease_request", counter_or_none))),
        LeaseGrant: Entry(_SDPAXOS | _MULTIPAXOS, (*_SRC_VIEW, ("request", counter))),
        PreVote: Entry(_SDPAXOS, _SRC_VIEW),
        PreVoteReply: Entry(_SDPAXOS, (*_SRC_VIEW, ("granted", free))),
        VRequest: Entry(_SDPAXOS, (*_SRC_VIEW, ("from_slot", counter))),
        Vote: Entry(_SDPAXOS, (*_SRC_VIEW, ("accepted_view", accepted_view),
                               ("accepted_from", counter), ("executed", counter),
                               ("entries", ovotes), ("c_high", c_high))),
        NewView: Entry(_SDPAXOS, (*_SRC_VIEW, ("start", slot), ("owners", owners))),
        NewViewAck: Entry(_SDPAXOS, _SRC_VIEW),
        Suspect: Entry(_SDPAXOS, _SRC_VIEW),
        # ---------------------------------------------------------------- reads
        RRequest: Entry(_SDPAXOS, (*_SRC_VIEW, ("read_id", counter), ("keys", free))),
        RReply: Entry(_SDPAXOS, (*_SRC_VIEW, ("read_id", counter), ("slot", slot_or_none))),
        # ---------------------------------------------------------------- catch-up (all)
        Catchup: Entry(_EVERY, (*_SRC_VIEW, ("slot", slot))),
        CatchupMarkers: Entry(_EVERY, (*_SRC_VIEW, ("slot", slot))),
        # ---------------------------------------------------------------- membership
        # (between members by id, not core index: the membership layer checks src and view
        # against its configuration, consensus.protocol.membership; global slots are
        # frontiers here, and a reply's slots are bounded by the codec)
        LearnRequest: Entry(_SDPAXOS, (("src", counter), ("view", counter), ("slot", counter))),
        LearnReply: Entry(_SDPAXOS, (("src", counter), ("view", counter), ("start", counter),
                                     ("executed", counter), ("slots", free))),
        SnapshotChunk: Entry(_EVERY, (*_SRC_VIEW, ("slot", counter), ("offset", counter),
                                      ("total", counter), ("data", free)),
                             (_snapshot_chunk,)),
        # ---------------------------------------------------------------- Multi-Paxos
        PaxosForward: Entry(_MULTIPAXOS, (*_BASELINE, ("commands", free))),
        PaxosAccept: Entry(_MULTIPAXOS | _MENCIUS, (*_BASELINE, ("slot", slot),
                                                   ("ballot", own_ballot), ("batch", free))),
        PaxosAck: Entry(_MULTIPAXOS | _MENCIUS, (*_BASELINE, ("ballot", ballot),
                                                ("slots", slots))),
        PaxosCommit: Entry(_MULTIPAXOS | _MENCIUS, (*_BASELINE, ("slot", slot),
                                                   ("ballot", ballot), ("batch", free))),
        PaxosPrepare: Entry(_MULTIPAXOS, (*_BASELINE, ("ballot", prepare_ballot),
                                          ("from_slot", slot))),
        PaxosPromise: Entry(_MULTIPAXOS, (*_BASELINE, ("ballot", ballot), ("ok", free),
                                          ("from_slot", slot), ("through", slot),
                                          ("complete", free), ("accepted", slot_votes))),
        # ---------------------------------------------------------------- Mencius
        MenciusAccept: Entry(_MENCIUS, (*_BASELINE, ("slot", slot),
                                        ("ballot", own_baseline_ballot), ("batch", free),
                                        ("skip_start", slot), ("skip_stop", slot))),
        # (a revoker's accepts are acknowledged in MenciusAcks too: any replica's ballot)
        MenciusAck: Entry(_MENCIUS, (*_BASELINE, ("ballot", ballot),
                                     ("slots", slots), ("skip_start", slot),
                                     ("skip_stop", slot))),
        MenciusSkip: Entry(_MENCIUS, (*_BASELINE, ("skip_start", slot), ("skip_stop", slot))),
        MenciusPrepare: Entry(_MENCIUS, (*_BASELINE, ("owner", replica), ("start", slot),
                                         ("stop", slot), ("ballot", prepare_ballot)),
                              (_revoked_range,)),
        MenciusPromise: Entry(_MENCIUS, (*_BASELINE, ("owner", replica), ("start", slot),
                                         ("stop", slot), ("ballot", ballot), ("ok", free),
                                         ("accepted", slot_votes)),
                              (_revoked_range,)),
        # ---------------------------------------------------------------- EPaxos
        EPreAccept: Entry(_EPAXOS, (*_E_INSTANCE, ("batch", free), ("seq", counter),
                                    ("deps", epaxos_deps))),
        EPreAcceptReply: Entry(_EPAXOS, (*_E_INSTANCE, ("ok", free), ("seq", counter),
                                         ("deps", epaxos_deps), ("changed", free))),
        EAccept: Entry(_EPAXOS, (*_E_INSTANCE, ("batch", free), ("seq", counter),
                                 ("deps", epaxos_deps))),
        EAcceptReply: Entry(_EPAXOS, (*_E_INSTANCE, ("ok", free))),
        ECommit: Entry(_EPAXOS, (*_E_INSTANCE, ("batch", free), ("seq", counter),
                                 ("deps", epaxos_deps))),
        EPrepare: Entry(_EPAXOS, _E_INSTANCE),
        EPrepareReply: Entry(_EPAXOS, (*_E_INSTANCE, ("ok", free), ("status", epaxos_status),
                                       ("vballot", ballot), ("batch", free), ("seq", counter),
                                       ("deps", epaxos_deps))),
        ETryPreAccept: Entry(_EPAXOS, (*_E_INSTANCE, ("batch", free), ("seq", counter),
                                       ("deps", epaxos_deps))),
        ETryPreAcceptReply: Entry(_EPAXOS, (*_E_INSTANCE, ("ok", free),
                                            ("conflict", epaxos_conflict))),
    }
)


# --------------------------------------------------------------------------- entry points


def check_message(msg: PeerMessage, bounds: Bounds, sender: int | None = None) -> Rejection | None:
    """Why ``msg`` must not reach a core with ``bounds``, or None if it may. ``sender``: the
    peer the transport authenticated, if known (``msg.src`` must be it)."""
    entry = ADMISSION_TABLE.get(type(msg))
    if (entry is not None and (bounds.protocol is None or bounds.protocol in entry.protocols)
            and (sender is None or msg.src == sender) and entry.passes(msg, bounds)):
        return None  # (every message a correct peer sends: no sentence built)
    name = type(msg).__name__
    if entry is None:
        return Rejection("protocol", f"{name} is no peer message")
    if bounds.protocol is not None and bounds.protocol not in entry.protocols:
        return Rejection("protocol", f"{name} is not a {bounds.protocol} message")
    if sender is not None and msg.src != sender:
        return Rejection("sender", f"{name}.src {msg.src!r} is not the peer {sender} it came from")
    for field_name, rule in entry.rules:
        verdict = rule(getattr(msg, field_name), msg, bounds)
        if verdict is not None:
            return Rejection(verdict[0], f"{name}.{field_name}: {verdict[1]}")
    for across in entry.across:
        verdict = across(msg, bounds)
        if verdict is not None:
            return Rejection(verdict[0], f"{name}: {verdict[1]}")
    return None


def check_peer_message(
    msg: PeerMessage,
    n_replicas: int,
    receiver: Receiver,
    *,
    sender: int | None = None,
    protocol: str | None = None,
) -> str | None:
    """The reason ``msg`` must not reach ``receiver`` (a core of an ``n_replicas`` cluster
    running ``protocol``), or None if it may."""
    rejection = check_message(msg, Bounds.of(receiver, n_replicas, protocol), sender)
    return None if rejection is None else rejection.reason


def check_frame(
    messages: Iterable[PeerMessage],
    receiver: Receiver,
    n_replicas: int,
    *,
    sender: int | None = None,
    protocol: str | None = None,
) -> Rejection | None:
    """The first rejection among a frame's messages (the driver drops the whole frame), or
    None if every one may reach ``receiver``."""
    bounds = Bounds.of(receiver, n_replicas, protocol)
    for msg in messages:
        rejection = check_message(msg, bounds, sender)
        if rejection is not None:
            return rejection
    return None
