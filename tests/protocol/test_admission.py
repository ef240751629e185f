"""Admission of peer messages (``consensus.protocol.admission``): every id, index, slot, view
and ballot field of every peer message class is checked, out-of-range values are refused, the
documented bounds are admitted, and nothing admission lets through crashes a core."""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Callable, Iterator
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consensus.config import ProtocolConfig
from consensus.messages import (
    EVERY_INDEX,
    NO_CL,
    TRY_CONFLICT,
    TRY_CONFLICT_COMMITTED,
    TRY_OK,
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
    CVote,
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
    LearnedSlot,
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
    OEntry,
    OVote,
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
from consensus.protocol import admission
from consensus.protocol.admission import (
    ADMISSION_TABLE,
    INDEX_WINDOW,
    MAX_COUNTER,
    MAX_SNAPSHOT_BYTES,
    ORDER_WINDOW,
    OWN_WINDOW,
    REJECTION_KINDS,
    SLOT_WINDOW,
    VIEW_WINDOW,
    VOTE_WINDOW,
    Bounds,
    Index,
    check_message,
    check_peer_message,
)
from consensus.protocol.ballot import BALLOT_STRIDE, ballot_of
from consensus.protocol.base import DrivenCore
from consensus.protocol.epaxos import EPaxosReplica
from consensus.protocol.membership.replica import MemberReplica
from consensus.protocol.mencius import MAX_AHEAD, MenciusReplica
from consensus.protocol.multipaxos import MultiPaxosReplica
from consensus.protocol.registry import PROTOCOLS
from consensus.protocol.sdpaxos import SDPaxosReplica

PEER_CLASSES: tuple[type, ...] = get_args(PeerMessage)
INT64_MAX = (1 << 63) - 1
SDPAXOS_ONLY = {cls for cls, entry in ADMISSION_TABLE.items() if entry.protocols == {"sdpaxos"}}


def command(seq: int = 0) -> Command:
    return Command(client_id=9, seq=seq, op=b"put k v", keys=("k",), blind=True)


# --------------------------------------------------------------------------- valid messages


def valid_sdpaxos(n: int, me: int, s: int) -> list[PeerMessage]:
    """One valid message of every SDPaxos class, from ``s`` to a fresh replica ``me``."""
    other = next(r for r in range(n) if r not in (me, s))
    c_high = tuple(0 if r == s else -1 for r in range(n))
    return [
        CAccept(src=s, view=0, owner=s, index=0, ballot=s, batch=(command(),)),
        CAck(src=s, view=0, owner=me, index=0, ballot=me),
        CCommit(src=s, view=0, owner=other, index=0, ballot=ballot_of(1, s), batch=None),
        CRequest(src=s, view=0, owner=s, index=1, keys=("k",), o_prefix=0),
        OAccept(src=s, view=0, entries=(OEntry(slot=0, owner=s), OEntry(slot=1, owner=NO_CL))),
        OAck(src=s, view=0, slots=(0, 1)),
        OCommit(src=s, view=0, entries=(OEntry(slot=0, owner=me),)),
        Catchup(src=s, view=0, slot=0),
        CatchupMarkers(src=s, view=0, slot=0),
        Heartbeat(src=s, view=0, executed=3, lease_request=-1),
        LeaseGrant(src=s, view=0, request=7),
        PreVote(src=s, view=s + n),
        PreVoteReply(src=s, view=me + n, granted=True),
        VRequest(src=s, view=s + n, from_slot=0),
        Vote(src=s, view=me + n, accepted_view=0, accepted_from=0, executed=0,
             entries=(OVote(slot=0, owner=s, ballot=0), OVote(slot=1, owner=NO_CL, ballot=0)),
             c_high=c_high),
        NewView(src=s, view=s + n, start=0, owners=(s, NO_CL, other)),
        NewViewAck(src=s, view=me + n),
        CPrepare(src=s, view=0, owner=other, from_index=0, ballot=ballot_of(1, s)),
        CPromise(src=s, view=0, owner=other, from_index=0, ballot=ballot_of(1, me),
                 accepted=(CVote(index=0, ballot=other, batch=(command(),)),), high=0,
                 through=EVERY_INDEX),
        CNack(src=s, view=0, owner=me, index=0, ballot=ballot_of(2, other)),
        RRequest(src=s, view=0, read_id=1, keys=("k",)),
        RReply(src=s, view=0, read_id=1, slot=-1),
        Suspect(src=s, view=0),
        SnapshotChunk(src=s, view=0, slot=40, offset=0, total=4, data=b"snap"),
        LearnRequest(src=s, view=0, slot=0),
        LearnReply(src=s, view=0, start=0, executed=1,
                   slots=(LearnedSlot(seal=False, batch=(command(),)),)),
    ]


def valid_multipaxos(n: int, me: int, s: int) -> list[PeerMessage]:
    """Multi-Paxos (leader 0) traffic from ``s`` to ``me``: only the leader sends Accepts."""
    shared: list[PeerMessage] = [Heartbeat(src=s, view=0, executed=0, lease_request=-1),
              Catchup(src=s, view=0, slot=0), CatchupMarkers(src=s, view=0, slot=0),
              SnapshotChunk(src=s, view=0, slot=4, offset=0, total=1, data=b"x"),
              PaxosForward(src=s, view=0, commands=(command(),)),
              PaxosAck(src=s, view=0, ballot=0, slots=(0,)),
              PaxosCommit(src=s, view=0, slot=0, ballot=0, batch=(command(),)),
              PaxosPrepare(src=s, view=0, ballot=ballot_of(1, s), from_slot=0),
              PaxosPromise(src=s, view=0, ballot=ballot_of(1, me), ok=True, from_slot=0,
                           through=1, complete=True,
                           accepted=(CVote(index=1, ballot=0, batch=(command(),)),)),
              LeaseGrant(src=s, view=0, request=7),
              PaxosAccept(src=s, view=0, slot=0, ballot=ballot_of(2, s), batch=(command(),))]
    if s == 0:
        shared.append(PaxosAccept(src=0, view=0, slot=0, ballot=0, batch=(command(),)))
    return shared


def valid_mencius(n: int, me: int, s: int) -> list[PeerMessage]:
    return [Heartbeat(src=s, view=0, executed=0, lease_request=-1),
            Catchup(src=s, view=0, slot=0), CatchupMarkers(src=s, view=0, slot=0),
            SnapshotChunk(src=s, view=0, slot=4, offset=0, total=1, data=b"x"),
            MenciusAccept(src=s, view=0, slot=s + n, ballot=s, batch=(command(),),
                          skip_start=s, skip_stop=s + n),
            MenciusAck(src=s, view=0, ballot=me, slots=(me,), skip_start=s, skip_stop=s + n),
            MenciusSkip(src=s, view=0, skip_start=s, skip_stop=s + 2 * n),
            PaxosCommit(src=s, view=0, slot=me, ballot=me, batch=None),
            MenciusPrepare(src=s, view=0, owner=me, start=me, stop=me + 4 * n,
                           ballot=ballot_of(1, s)),
            MenciusPromise(src=s, view=0, owner=me, start=me, stop=me + 4 * n,
                           ballot=ballot_of(1, me), ok=True,
                           accepted=(CVote(index=me, ballot=me, batch=(command(),)),)),
            PaxosAccept(src=s, view=0, slot=me, ballot=ballot_of(1, s), batch=()),
            PaxosAck(src=s, view=0, ballot=ballot_of(1, me), slots=(me,)),
            # acknowledging a revoker's accept (the acks of a turn are merged)
            MenciusAck(src=s, view=0, ballot=ballot_of(1, me), slots=(me,), skip_start=0,
                       skip_stop=0)]


def valid_epaxos(n: int, me: int, s: int) -> list[PeerMessage]:
    deps = tuple(0 if r == s else -1 for r in range(n))
    none = (-1,) * n
    return [Heartbeat(src=s, view=0, executed=2, lease_request=-1),
            SnapshotChunk(src=s, view=0, slot=4, offset=0, total=1, data=b"x"),
            EPreAccept(src=s, view=0, owner=s, index=1, ballot=s, batch=(command(),), seq=2,
                       deps=deps),
            EPreAcceptReply(src=s, view=0, owner=me, index=0, ballot=me, ok=True, seq=1,
                            deps=none, changed=False),
            EAccept(src=s, view=0, owner=s, index=0, ballot=s, batch=(command(),), seq=1,
                    deps=none),
            EAcceptReply(src=s, view=0, owner=me, index=0, ballot=me, ok=False),
            ECommit(src=s, view=0, owner=s, index=0, ballot=s, batch=(command(),), seq=1,
                    deps=none),
            EPrepare(src=s, view=0, owner=me, index=0, ballot=ballot_of(1, s)),
            EPrepareReply(src=s, view=0, owner=s, index=0, ballot=ballot_of(1, me), ok=True,
                          status=2, vballot=s, batch=(command(),), seq=1, deps=deps),
            ETryPreAccept(src=s, view=0, owner=me, index=0, ballot=ballot_of(1, s),
                          batch=(command(),), seq=1, deps=none),
            ETryPreAcceptReply(src=s, view=0, owner=s, index=0, ballot=ballot_of(1, me),
                               ok=True, conflict=TRY_CONFLICT)]


Factory = Callable[[ProtocolConfig, int], DrivenCore]
VALID: dict[str, Callable[[int, int, int], list[PeerMessage]]] = {
    "sdpaxos": valid_sdpaxos, "multipaxos": valid_multipaxos, "mencius": valid_mencius,
    "epaxos": valid_epaxos,
}
FACTORIES: dict[str, Callable[..., DrivenCore]] = {
    "sdpaxos": SDPaxosReplica, "multipaxos": MultiPaxosReplica, "mencius": MenciusReplica,
    "epaxos": EPaxosReplica,
}
#: (protocol, replicas, receiver, sender): sequencer / leader and not, three and five replicas
SETUPS = [
    ("sdpaxos", 3, 0, 1), ("sdpaxos", 3, 1, 2), ("sdpaxos", 5, 0, 3), ("sdpaxos", 5, 2, 0),
    ("sdpaxos", 5, 1, 3),
    ("multipaxos", 3, 0, 1), ("multipaxos", 3, 1, 0), ("mencius", 3, 1, 2),
    ("epaxos", 3, 0, 1), ("epaxos", 5, 2, 4),
]


def make_core(protocol: str, n: int, me: int) -> DrivenCore:
    config = ProtocolConfig(replicas=n)
    return FACTORIES[protocol](config, me, rng=random.Random(me))


def bounds_of(protocol: str, n: int, me: int) -> Bounds:
    return Bounds.of(make_core(protocol, n, me), n, protocol)


# --------------------------------------------------------------------------- mutations


def field_mutations(msg: Any, b: Bounds) -> Iterator[tuple[str, Any, Any]]:
    """(field, out-of-range value, the mutated message) for every checked field of ``msg``,
    against a fresh receiver (view 0, nothing executed)."""
    n, me = b.replicas, b.me
    rules = dict(ADMISSION_TABLE[type(msg)].rules)
    for name, rule in rules.items():
        for bad in bad_values(rule, msg, name, n, me):
            if isinstance(bad, _Nested):
                yield f"{name}[0].{bad.field}", bad.value, bad.apply(msg, name)
            else:
                yield name, bad, dataclasses.replace(msg, **{name: bad})


@dataclasses.dataclass(frozen=True)
class _Nested:
    """Set ``field`` of the first element of a tuple of nested values (OEntry, OVote, CVote)."""

    field: str
    value: int

    def apply(self, msg: Any, name: str) -> Any:
        items = getattr(msg, name)
        first = dataclasses.replace(items[0], **{self.field: self.value})
        return dataclasses.replace(msg, **{name: (first, *items[1:])})


def index_window(owner: int, me: int, window: int) -> int:
    return min(window, OWN_WINDOW) if owner == me else window


def bad_values(rule: Any, msg: Any, name: str, n: int, me: int) -> list[Any]:
    huge = [1 << 62, INT64_MAX]
    a = admission
    if rule is a.sender:
        return [n, n + 7, -1, me, *huge]
    if rule is a.replica:
        return [n, n + 7, -1, *huge]
    if rule is a.view:
        return [VIEW_WINDOW + 1, -1, *huge]
    if rule is a.baseline_view:
        return [1, n, -1, *huge]
    if rule is a.slot:
        return [SLOT_WINDOW + 1, -1, *huge]
    if rule is a.slot_or_none:
        return [SLOT_WINDOW + 1, -2, *huge]
    if rule is a.counter:
        return [-1, MAX_COUNTER + 1, INT64_MAX]
    if rule is a.counter_or_none:
        return [-2, MAX_COUNTER + 1, INT64_MAX]
    if rule is a.ballot:
        return [n, ballot_of(3, n + 7), -1, MAX_COUNTER + BALLOT_STRIDE, INT64_MAX]
    if rule is a.prepare_ballot:
        return [msg.src, ballot_of(1, (msg.src + 1) % n), ballot_of(1, n), -1, INT64_MAX]
    if rule is a.baseline_ballot:
        return [n, ballot_of(1, 0), -1, *huge]
    if rule is a.own_baseline_ballot:
        return [(msg.src + 1) % n, ballot_of(1, msg.src), -1, *huge]
    if isinstance(rule, Index):
        high = index_window(msg.owner, me, rule.window)
        return [high, -2 if rule.none_ok else -1, *huge]
    if rule is a.slots:
        return [(SLOT_WINDOW + 1,), (0, 1 << 62), (-1,)]
    if rule is a.entries:
        return [_Nested("slot", v) for v in (SLOT_WINDOW + 1, -1, 1 << 62)] + [
            _Nested("owner", v) for v in (n, n + 7, -3, 1 << 62)  # (-2 is SEAL)
        ]
    if rule is a.owners:
        return [(n,), (0, -3), (n + 7, 0), (1 << 62,)]
    if rule is a.ovotes:
        return (
            [_Nested("slot", v) for v in (VOTE_WINDOW, -1, 1 << 62)]
            + [_Nested("owner", v) for v in (n, -3, 1 << 62)]
            + [_Nested("ballot", v) for v in (msg.view + 1, -1, 1 << 62)]
        )
    if rule is a.cvotes:
        high = index_window(msg.owner, me, ORDER_WINDOW)
        return [_Nested("index", v) for v in (high, -1, 1 << 62)] + [
            _Nested("ballot", v) for v in (n, ballot_of(1, n + 7), -1)
        ]
    if rule is a.c_high:
        minus = (-1,) * n
        return [
            minus[:-1], (*minus, -1), (index_window(0, me, VOTE_WINDOW), *minus[1:]),
            (-2, *minus[1:]), (*minus[:-1], 1 << 62),
        ]
    if rule is a.promise_through:
        high = index_window(msg.owner, me, ORDER_WINDOW)
        return [high, -1, msg.from_index - 1, INT64_MAX - 1, 1 << 62]
    if rule is a.accepted_view:
        return [msg.view + 1, -2, 1 << 62]
    if rule is a.own_ballot:
        return [(msg.src + 1) % n, ballot_of(1, (msg.src + 1) % n), -1, INT64_MAX]
    if rule is a.slot_votes:
        return [_Nested("index", v) for v in (SLOT_WINDOW + 1, -1, 1 << 62)] + [
            _Nested("ballot", v) for v in (n, ballot_of(1, n + 7), -1)
        ]
    if rule is a.epaxos_deps:
        minus = (-1,) * n
        return [minus[:-1], (*minus, -1), (-2, *minus[1:]),
                (*minus[:-1], index_window(n - 1, me, INDEX_WINDOW)), (1 << 62, *minus[1:])]
    if rule is a.epaxos_status:
        return [-1, a.EPAXOS_MAX_STATUS + 1, *huge]
    if rule is a.epaxos_conflict:
        return [-1, TRY_CONFLICT_COMMITTED + 1, *huge]
    if rule is a.free:
        return []
    raise AssertionError(f"no mutations for rule {rule!r} of {type(msg).__name__}.{name}")


def edge_values(rule: Any, msg: Any, name: str, b: Bounds) -> list[Any]:
    """The largest (and smallest) values the rule admits for a fresh receiver."""
    a, n, me = admission, b.replicas, b.me
    if isinstance(msg, SnapshotChunk) and name != "slot":
        return []  # offset and total: see test_snapshot_chunks_stay_inside_their_total
    if isinstance(msg, MenciusPrepare | MenciusPromise) and name in ("start", "stop"):
        return []  # see test_revocation_ranges_are_ordered_and_bounded
    if isinstance(msg, NewView) and rule is a.slot:  # its last slot is inside the window
        return [SLOT_WINDOW - len(msg.owners) + 1]
    edges: dict[Any, list[Any]] = {
        a.replica: [0, n - 1], a.view: [b.view_max], a.slot: [SLOT_WINDOW],
        a.slot_or_none: [-1, SLOT_WINDOW], a.counter: [0, MAX_COUNTER],
        a.counter_or_none: [-1, MAX_COUNTER], a.baseline_ballot: [n - 1],
        a.ballot: [n - 1, MAX_COUNTER - BALLOT_STRIDE + n - 1],
        a.epaxos_status: [0, a.EPAXOS_MAX_STATUS],
        a.epaxos_conflict: [TRY_OK, TRY_CONFLICT_COMMITTED],
        a.own_ballot: [msg.src, MAX_COUNTER - BALLOT_STRIDE + msg.src]
        if hasattr(msg, "src") else [],
    }
    if isinstance(rule, Index):
        return [-1 if rule.none_ok else 0, index_window(msg.owner, me, rule.window) - 1]
    if rule is a.promise_through:
        return [EVERY_INDEX, msg.from_index, index_window(msg.owner, me, ORDER_WINDOW) - 1]
    if rule is a.epaxos_deps:
        return [(-1,) * n, tuple(index_window(r, me, INDEX_WINDOW) - 1 for r in range(n))]
    return edges.get(rule, [])


# --------------------------------------------------------------------------- the table


def test_every_peer_message_class_has_a_table_entry_naming_every_field() -> None:
    assert set(ADMISSION_TABLE) == set(PEER_CLASSES), "a peer message class lacks admission"
    for cls, entry in ADMISSION_TABLE.items():
        assert [name for name, _ in entry.rules] == [f.name for f in dataclasses.fields(cls)]
        assert entry.protocols and entry.protocols <= set(PROTOCOLS)


def test_the_slot_window_is_mencius_own_plausibility_bound() -> None:
    assert SLOT_WINDOW == MAX_AHEAD  # the justification is shared: keep them one number


def test_the_valid_messages_cover_every_class() -> None:
    covered = {type(m) for protocol, gen in VALID.items() for m in gen(3, 0, 1) + gen(3, 1, 0)}
    assert covered == set(PEER_CLASSES)


@pytest.mark.parametrize(("protocol", "n", "me", "s"), SETUPS)
def test_valid_messages_are_admitted(protocol: str, n: int, me: int, s: int) -> None:
    b = bounds_of(protocol, n, me)
    for msg in VALID[protocol](n, me, s):
        assert check_message(msg, b, sender=s) is None, msg


@pytest.mark.parametrize(("protocol", "n", "me", "s"), SETUPS)
def test_every_out_of_range_field_is_rejected(protocol: str, n: int, me: int, s: int) -> None:
    b = bounds_of(protocol, n, me)
    tried = 0
    for msg in VALID[protocol](n, me, s):
        for name, value, mutated in field_mutations(msg, b):
            rejection = check_message(mutated, b)
            assert rejection is not None, f"{type(msg).__name__}.{name} = {value!r} admitted"
            assert rejection.kind in REJECTION_KINDS
            assert type(msg).__name__ in rejection.reason
            tried += 1
    assert tried > 20


@pytest.mark.parametrize(("protocol", "n", "me", "s"), SETUPS)
def test_the_documented_edges_are_admitted(protocol: str, n: int, me: int, s: int) -> None:
    b = bounds_of(protocol, n, me)
    for msg in VALID[protocol](n, me, s):
        for name, rule in ADMISSION_TABLE[type(msg)].rules:
            for value in edge_values(rule, msg, name, b):
                edged = dataclasses.replace(msg, **{name: value})
                assert check_message(edged, b) is None, f"{type(msg).__name__}.{name}={value}"


def test_src_must_be_the_authenticated_peer() -> None:
    b = bounds_of("sdpaxos", 3, 0)
    beat = Heartbeat(src=1, view=0, executed=0, lease_request=-1)
    assert check_message(beat, b, sender=1) is None
    rejection = check_message(beat, b, sender=2)
    assert rejection is not None and rejection.kind == "sender"


def test_another_protocols_messages_are_rejected() -> None:
    accept = PaxosAccept(src=0, view=0, slot=0, ballot=0, batch=())
    rejection = check_message(accept, bounds_of("sdpaxos", 3, 1))
    assert rejection is not None and rejection.kind == "protocol"
    assert check_message(accept, bounds_of("multipaxos", 3, 1)) is None
    caccept = CAccept(src=1, view=0, owner=1, index=0, ballot=1, batch=())
    rejection = check_message(caccept, bounds_of("mencius", 3, 0))
    assert rejection is not None and rejection.kind == "protocol"


def test_views_and_windows_follow_the_receiver() -> None:
    core = make_core("sdpaxos", 3, 1)
    core.step(Heartbeat(src=2, view=5, executed=0, lease_request=-1), 1)  # 5 % 3 == 2: joins
    assert core.view == 5
    far = Suspect(src=2, view=5 + VIEW_WINDOW)
    assert check_peer_message(far, 3, core) is None
    assert check_peer_message(dataclasses.replace(far, view=far.view + 1), 3, core) is not None
    # the baselines have views of 0 only
    beat = Heartbeat(src=0, view=1, executed=0, lease_request=-1)
    assert check_peer_message(beat, 3, make_core("mencius", 3, 1), protocol="mencius")


def test_snapshot_chunks_stay_inside_their_total() -> None:
    b = bounds_of("sdpaxos", 3, 0)
    chunk = SnapshotChunk(src=1, view=0, slot=9, offset=4, total=8, data=b"abcd")
    assert check_message(chunk, b) is None
    for bad in (dataclasses.replace(chunk, offset=5),
                dataclasses.replace(chunk, total=MAX_SNAPSHOT_BYTES + 1, offset=0)):
        rejection = check_message(bad, b)
        assert rejection is not None and rejection.kind == "length"


def test_revocation_ranges_are_ordered_and_bounded() -> None:
    b = bounds_of("mencius", 3, 1)
    prepare = MenciusPrepare(src=2, view=0, owner=1, start=4, stop=4 + admission.REVOKE_SLOTS,
                             ballot=ballot_of(1, 2))
    assert check_message(prepare, b) is None
    for bad in (dataclasses.replace(prepare, stop=prepare.stop + 1),
                dataclasses.replace(prepare, start=5, stop=4)):
        rejection = check_message(bad, b)
        assert rejection is not None and rejection.kind in ("length", "slot")


def test_the_reported_crashes_are_refused() -> None:
    """Issue 18: CAccept owner N (IndexError), CPrepare / OAccept naming N (KeyError)."""
    b = bounds_of("sdpaxos", 3, 1)
    for msg in (
        CAccept(src=0, view=0, owner=3, index=0, ballot=0, batch=()),
        CPrepare(src=0, view=0, owner=3, from_index=0, ballot=ballot_of(1, 0)),
        OAccept(src=0, view=0, entries=(OEntry(slot=0, owner=3),)),
    ):
        rejection = check_message(msg, b)
        assert rejection is not None and rejection.kind == "replica", msg


# --------------------------------------------------------------------------- into real cores


def run(core: DrivenCore, messages: list[PeerMessage], now: int = 1_000) -> None:
    """Step ``messages`` into ``core`` as one loop turn, then let timers run well past every
    timeout (retransmissions, catch-up, recoveries, elections), a few turns."""
    for msg in messages:
        core.step(msg, now)
    core.advance(core.ready())
    for later in (now + 400_000, now + 2_000_000, now + 5_000_000):
        core.tick(later)
        core.advance(core.ready())


def admitted_variants(protocol: str, n: int, me: int, s: int) -> list[PeerMessage]:
    """Every valid message, each at its documented edges (the most admission lets through)."""
    b = bounds_of(protocol, n, me)
    out: list[PeerMessage] = []
    for msg in VALID[protocol](n, me, s):
        out.append(msg)
        for name, rule in ADMISSION_TABLE[type(msg)].rules:
            for value in edge_values(rule, msg, name, b):
                edged = dataclasses.replace(msg, **{name: value})
                if check_message(edged, b, sender=s) is None:
                    out.append(edged)
    return out


@pytest.mark.parametrize(("protocol", "n", "me", "s"), SETUPS)
def test_admitted_edges_do_not_crash_the_core(protocol: str, n: int, me: int, s: int) -> None:
    variants = admitted_variants(protocol, n, me, s)
    assert len(variants) > len(VALID[protocol](n, me, s))
    for msg in variants:
        run(make_core(protocol, n, me), [msg])  # each alone, on a fresh core
    run(make_core(protocol, n, me), VALID[protocol](n, me, s))  # all valid ones together


# --------------------------------------------------------------------------- primed states


def primed_states(protocol: str, n: int, me: int) -> list[DrivenCore]:
    """Copies of replica ``me`` of a small cluster (instant delivery) at moments of its life:
    fresh, after client traffic executed, and (SDPaxos) through a view change that silences
    replica 0, the first sequencer: candidate, establishing, sequencer or follower of the new
    view, as the case may be."""
    cores = [make_core(protocol, n, r) for r in range(n)]
    states: list[DrivenCore] = [copy.deepcopy(cores[me])]
    inbox: list[tuple[int, PeerMessage]] = []
    now = 1_000
    cut = -1  # the replica cut off (none yet)

    def turn() -> None:
        nonlocal inbox
        for r, core in enumerate(cores):
            if r == cut:
                continue
            core.tick(now)
            ready = core.ready()
            core.advance(ready)
            for out in ready.send + ready.send_after_persist:
                if cut not in (r, out.to):
                    inbox.append((out.to, out.message))
        delivering, inbox = inbox, []
        for to, msg in delivering:
            cores[to].step(msg, now)

    for seq in range(12):
        cores[seq % n].propose(command(seq), now)
        turn()
        now += 1_000
    for _ in range(20):
        turn()
        now += 1_000
    states.append(copy.deepcopy(cores[me]))
    if protocol == "sdpaxos" and me != 0:
        cut = 0
        roles = set()
        for _ in range(80):
            now += 25_000
            turn()
            role = getattr(cores[me], "role", None)
            if (role, cores[me].view) not in roles:
                roles.add((role, cores[me].view))
                states.append(copy.deepcopy(cores[me]))
    return states


_PRIMED: dict[tuple[str, int, int], list[DrivenCore]] = {}


def primed(protocol: str, n: int, me: int) -> list[DrivenCore]:
    key = (protocol, n, me)
    if key not in _PRIMED:
        _PRIMED[key] = primed_states(protocol, n, me)
    return _PRIMED[key]


def test_primed_states_reach_the_interesting_roles() -> None:
    states = primed("sdpaxos", 5, 1)
    assert any(state.exec_slot > 0 for state in states)
    roles = {getattr(state, "role", None) for state in states}
    assert len(roles) >= 2, roles  # not just followers of view 0


#: values that sit on, just inside and just outside every bound
INTERESTING = st.sampled_from(sorted({
    -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 12, BALLOT_STRIDE, BALLOT_STRIDE + 1, 2 * BALLOT_STRIDE + 4,
    OWN_WINDOW - 1, OWN_WINDOW, ORDER_WINDOW - 1, ORDER_WINDOW, VOTE_WINDOW - 1, SLOT_WINDOW,
    SLOT_WINDOW + 1, INDEX_WINDOW - 1, VIEW_WINDOW, MAX_COUNTER - 1, MAX_COUNTER, INT64_MAX,
}))


@st.composite
def mutated(draw: st.DrawFn, protocol: str, n: int, me: int, s: int) -> PeerMessage:
    """A valid message with up to three int fields (or nested ints) set to interesting
    values."""
    msg: Any = draw(st.sampled_from(VALID[protocol](n, me, s)))
    for _ in range(draw(st.integers(0, 3))):
        ints = [f.name for f in dataclasses.fields(msg) if type(getattr(msg, f.name)) is int]
        nested = [f.name for f in dataclasses.fields(msg)
                  if getattr(msg, f.name) and isinstance(getattr(msg, f.name), tuple)
                  and isinstance(getattr(msg, f.name)[0], OEntry | OVote | CVote)]
        name = draw(st.sampled_from(ints + nested))
        value = draw(INTERESTING)
        if name in nested:
            inner = [f.name for f in dataclasses.fields(getattr(msg, name)[0])
                     if type(getattr(getattr(msg, name)[0], f.name)) is int]
            msg = _Nested(draw(st.sampled_from(inner)), value).apply(msg, name)
        else:
            msg = dataclasses.replace(msg, **{name: value})
    result: PeerMessage = msg
    return result


@pytest.mark.parametrize(("protocol", "n", "me", "s"), SETUPS)
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_whatever_admission_lets_through_no_core_raises_on(
    protocol: str, n: int, me: int, s: int, data: st.DataObject
) -> None:
    """Sequences of mutated messages, each turn's admitted ones stepped into one core (a
    copy of one of its primed states)."""
    core = copy.deepcopy(data.draw(st.sampled_from(primed(protocol, n, me))))
    now = 10_000_000
    for _ in range(data.draw(st.integers(1, 4))):
        turn = data.draw(st.lists(mutated(protocol, n, me, s), min_size=1, max_size=4))
        b = Bounds.of(core, n, protocol)
        admitted = [msg for msg in turn if check_message(msg, b, sender=s) is None]
        run(core, admitted, now)
        now += 6_000_000


@pytest.mark.parametrize(("protocol", "n", "me", "s"), SETUPS)
@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data())
def test_the_generated_fast_path_agrees_with_the_rules(
    protocol: str, n: int, me: int, s: int, data: st.DataObject
) -> None:
    """``Entry.passes`` (generated, inline tests) admits exactly what the rules admit."""
    msg = data.draw(mutated(protocol, n, me, s))
    b = bounds_of(protocol, n, me)
    entry = ADMISSION_TABLE[type(msg)]
    walked = all(rule(getattr(msg, name), msg, b) is None for name, rule in entry.rules) and all(
        across(msg, b) is None for across in entry.across
    )
    assert entry.passes(msg, b) == walked
    assert (check_message(msg, b) is None) == walked


# --------------------------------------------------------------------------- members' frames


def member(me: int = 0) -> MemberReplica:
    return MemberReplica(ProtocolConfig(replicas=3), me, rng=random.Random(me))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data())
def test_a_members_frame_is_judged_as_message_by_message(data: st.DataObject) -> None:
    """``MemberReplica.check_frame`` takes a frame of its own epoch's messages at once; its
    verdict is the message-by-message one (``_check_each``), whatever the frame holds:
    later epochs, messages between members by id, senders that do not vote."""
    receiver = member()
    sender = data.draw(st.sampled_from((1, 2, 7)))
    frame = data.draw(st.lists(mutated("sdpaxos", 3, 0, sender if sender < 3 else 1),
                               min_size=1, max_size=5))
    assert receiver.check_frame(frame, sender) == receiver._check_each(frame, sender)


def test_a_members_frame_is_refused_for_its_first_bad_message() -> None:
    receiver = member()
    good = [m for m in valid_sdpaxos(3, 0, 1)
            if not isinstance(m, LearnRequest | LearnReply | SnapshotChunk)]
    assert receiver.check_frame(good, 1) is None
    beat = Heartbeat(src=1, view=0, executed=0, lease_request=-1)
    late = CAccept(src=1, view=0, owner=1, index=INT64_MAX, ballot=1, batch=(command(),))
    refused = receiver.check_frame([beat, late, beat], 1)
    assert refused is not None and refused == receiver._check_each([beat, late], 1)
    assert "CAccept" in refused.reason
    stranger = receiver.check_frame([dataclasses.replace(beat, src=7)], 7)
    assert stranger is not None and stranger.kind == "sender"
