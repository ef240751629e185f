"""Paper-style unit tests of the SDPaxos core's message handlers, one core at a time.

Each test builds ``SDPaxosReplica`` directly, feeds it ``propose`` / ``step`` / ``tick``,
drains ``ready()`` + ``advance()`` and asserts the exact outputs against SoCC'18 §3.2 and
Figure 5. View 0's sequencer is replica 0 throughout.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from sdp_util import Net, cmd, core, drain, msgs

from consensus.config import ProtocolConfig
from consensus.errors import LocalProtocolError
from consensus.messages import (
    EVERY_INDEX,
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
    CRequest,
    CVote,
    ExecutedRecord,
    Heartbeat,
    LeaseGrant,
    NewView,
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
from consensus.protocol.ballot import ballot_of
from consensus.protocol.batch import CATCHUP_BYTES, batch_size
from consensus.protocol.ready import Execution, Ready
from consensus.protocol.sdpaxos import Role, SDPaxosReplica, SnapshotMeta
from consensus.protocol.sdpaxos import recovery as recovery_module
from consensus.protocol.sdpaxos import view_change as view_change_module
from consensus.protocol.sdpaxos.catchup import CATCHUP_BATCH
from consensus.protocol.sdpaxos.liveness import (
    SILENCE_CEILING_FACTOR,
    SILENCE_FACTOR,
    SILENCE_WINDOW_FACTOR,
)
from consensus.protocol.sdpaxos.view_change import fill_for

A = cmd(7, 0)
B = cmd(7, 1)
C = cmd(8, 0)
D = cmd(9, 0)


def caccept(src: int, owner: int, index: int, batch: tuple, *, ballot: int | None = None,
            view: int = 0) -> CAccept:
    return CAccept(src=src, view=view, owner=owner, index=index,
                   ballot=owner if ballot is None else ballot, batch=batch)


def cack(src: int, owner: int, index: int, *, ballot: int | None = None,
         view: int = 0) -> CAck:
    return CAck(src=src, view=view, owner=owner, index=index,
                ballot=owner if ballot is None else ballot)


def ccommit(src: int, owner: int, index: int, batch: tuple | None, *,
            ballot: int | None = None, view: int = 0) -> CCommit:
    return CCommit(src=src, view=view, owner=owner, index=index,
                   ballot=owner if ballot is None else ballot, batch=batch)


def crequest(src: int, index: int, *, o_prefix: int = 0, view: int = 0) -> CRequest:
    return CRequest(src=src, view=view, owner=src, index=index, keys=(), o_prefix=o_prefix)


def oaccept(*entries: tuple[int, int], view: int = 0, src: int = 0) -> OAccept:
    return OAccept(src=src, view=view, entries=tuple(OEntry(slot=s, owner=o) for s, o in entries))


def ocommit(src: int, *entries: tuple[int, int], view: int = 0) -> OCommit:
    return OCommit(src=src, view=view, entries=tuple(OEntry(slot=s, owner=o) for s, o in entries))


def oack(src: int, *slots: int) -> OAck:
    return OAck(src=src, view=0, slots=slots)


def o_entries(ready: Ready) -> list[tuple[int, int]]:
    """(slot, owner) of every O-instance persisted in ``ready``."""
    return [
        (e.slot, e.owner)
        for r in ready.persist
        if isinstance(r, OAcceptedRecord)
        for e in r.entries
    ]


def all_out(ready: Ready) -> list[tuple[int, PeerMessage]]:
    return msgs(ready.send_after_persist) + msgs(ready.send)


# =========================================================================== C-phase, leader


def test_proposal_at_non_sequencer_persists_then_sends_caccepts() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    ready = drain(r1)
    assert ready.persist == [CAcceptedRecord(owner=1, index=0, ballot=1, batch=(A,))]
    accept = caccept(1, 1, 0, (A,))
    assert msgs(ready.send_after_persist) == [(0, accept), (2, accept)]
    assert ready.send == []  # the sequencer gets the CAccept: no CRequest (line 4)
    assert ready.ready == ready.apply == ready.failed == []


def test_proposal_at_sequencer_starts_c_and_o_instance_together() -> None:
    r0 = core(3, 0)
    r0.propose(A, 0)
    ready = drain(r0)
    assert ready.persist == [
        CAcceptedRecord(owner=0, index=0, ballot=0, batch=(A,)),
        OAcceptedRecord(view=0, entries=(OEntry(slot=0, owner=0),)),
    ]
    accept = caccept(0, 0, 0, (A,))
    order = oaccept((0, 0))
    assert msgs(ready.send_after_persist) == [(1, accept), (2, accept), (1, order), (2, order)]
    assert ready.send == []


def test_proposals_in_one_turn_form_one_c_instance() -> None:
    r1 = core(3, 1)
    for command in (A, B, C):
        r1.propose(command, 0)
    ready = drain(r1)
    assert ready.persist == [CAcceptedRecord(owner=1, index=0, ballot=1, batch=(A, B, C))]
    sent = [m for _, m in msgs(ready.send_after_persist) if isinstance(m, CAccept)]
    assert [m.index for m in sent] == [0, 0]
    r1.propose(D, 1)
    ready = drain(r1)
    assert ready.persist == [CAcceptedRecord(owner=1, index=1, ballot=1, batch=(D,))]


def test_max_batch_splits_a_turn_into_several_instances() -> None:
    r1 = core(3, 1, max_batch=2)
    commands = [cmd(1, s) for s in range(5)]
    for command in commands:
        r1.propose(command, 0)
    ready = drain(r1)
    assert ready.persist == [
        CAcceptedRecord(owner=1, index=0, ballot=1, batch=tuple(commands[0:2])),
        CAcceptedRecord(owner=1, index=1, ballot=1, batch=tuple(commands[2:4])),
        CAcceptedRecord(owner=1, index=2, ballot=1, batch=tuple(commands[4:5])),
    ]
    assert len(msgs(ready.send_after_persist, CAccept)) == 3 * 2


def test_max_batch_bytes_bounds_an_instance_by_the_size_of_its_commands() -> None:
    # so that no CAccept outgrows a frame, however large the commands of one turn
    r1 = core(3, 1, max_batch_bytes=3000)
    commands = [Command(client_id=1, seq=s, op=b"x" * 1000) for s in range(7)]
    for command in commands:
        r1.propose(command, 0)
    batches = [r.batch for r in drain(r1).persist if isinstance(r, CAcceptedRecord)]
    assert batches == [tuple(commands[0:3]), tuple(commands[3:6]), tuple(commands[6:])]


def test_thrifty_sends_caccept_to_q_minus_1_and_crequest_when_sequencer_missed() -> None:
    # N=3, replica 1: nearest by id distance is 2; the sequencer (0) is not in the quorum
    r1 = core(3, 1, thrifty=True)
    r1.propose(A, 0)
    ready = drain(r1)
    assert msgs(ready.send_after_persist) == [(2, caccept(1, 1, 0, (A,)))]
    # a CRequest promises nothing: it is in ``send``
    assert msgs(ready.send) == [(0, crequest(1, 0))]
    # N=5, replica 1: nearest are 2 and 3
    r1 = core(5, 1, thrifty=True)
    r1.propose(A, 0)
    ready = drain(r1)
    accept = caccept(1, 1, 0, (A,))
    assert msgs(ready.send_after_persist) == [(2, accept), (3, accept)]
    assert msgs(ready.send) == [(0, crequest(1, 0))]


def test_thrifty_sends_no_crequest_when_sequencer_is_in_quorum() -> None:
    r2 = core(3, 2, thrifty=True)  # nearest of 2 by id distance: 0, the sequencer
    r2.propose(A, 0)
    ready = drain(r2)
    assert msgs(ready.send_after_persist) == [(0, caccept(2, 2, 0, (A,)))]
    assert ready.send == []
    r4 = core(5, 4, thrifty=True)  # nearest of 4: 0 and 1
    r4.propose(A, 0)
    ready = drain(r4)
    assert [to for to, _ in msgs(ready.send_after_persist)] == [0, 1]
    assert ready.send == []


def test_thrifty_follows_configured_preference() -> None:
    r1 = core(5, 1, thrifty=True, preference=((1, 2, 3, 4), (4, 0, 2, 3), (0, 1, 3, 4),
                                              (0, 1, 2, 4), (0, 1, 2, 3)))
    r1.propose(A, 0)
    ready = drain(r1)
    assert [to for to, _ in msgs(ready.send_after_persist)] == [4, 0]
    assert ready.send == []


def test_commit_after_majority_of_cacks_and_ccommit_carries_batch_only_when_needed() -> None:
    r1 = core(5, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(cack(3, 1, 0), 1)
    assert drain(r1).is_empty()  # 2 of 5
    r1.step(cack(3, 1, 0), 1)  # a duplicate CAck counts once
    assert drain(r1).is_empty()
    r1.step(cack(2, 1, 0, ballot=99), 1)  # an ack for another ballot does not count
    assert drain(r1).is_empty()
    r1.step(cack(4, 1, 0), 1)
    ready = drain(r1)
    # every peer was sent the CAccept first on the same connection: no batch again
    assert msgs(ready.send_after_persist) == [
        (peer, ccommit(1, 1, 0, None)) for peer in (0, 2, 3, 4)
    ]
    assert ready.ready == []  # not ordered yet
    r1.step(cack(0, 1, 0), 1)  # late: the instance is chosen already
    assert drain(r1).is_empty()


def test_thrifty_commit_carries_the_batch_to_the_peers_left_out_of_the_accept() -> None:
    r4 = core(5, 4, thrifty=True)  # CAccepts go to 0 and 1 only
    r4.propose(A, 0)
    drain(r4)
    r4.step(cack(0, 4, 0), 1)
    r4.step(cack(1, 4, 0), 1)
    assert msgs(drain(r4).send_after_persist, CCommit) == [
        (0, ccommit(4, 4, 0, None)),
        (1, ccommit(4, 4, 0, None)),
        (2, ccommit(4, 4, 0, (A,))),
        (3, ccommit(4, 4, 0, (A,))),
    ]


# =========================================================================== C-phase, acceptor


def test_acceptor_persists_and_acks_to_sender() -> None:
    r2 = core(3, 2)
    r2.step(caccept(1, 1, 0, (A,)), 5)
    ready = drain(r2)
    assert ready.persist == [CAcceptedRecord(owner=1, index=0, ballot=1, batch=(A,))]
    assert msgs(ready.send_after_persist) == [(1, cack(2, 1, 0))]
    assert ready.send == []
    # a duplicate is acknowledged again (its first CAck may be lost) without a new record
    r2.step(caccept(1, 1, 0, (A,)), 6)
    ready = drain(r2)
    assert ready.persist == []
    assert msgs(ready.send_after_persist) == [(1, cack(2, 1, 0))]


def test_acceptor_rejects_lower_ballot() -> None:
    high = ballot_of(1, 2)  # a recoverer (replica 2) took over C[1][0]
    r0 = core(3, 0)
    r0.step(caccept(2, 1, 0, (), ballot=high), 1)
    drain(r0)
    r0.step(caccept(1, 1, 0, (A,)), 2)  # the owner's original, at ballot (0, 1)
    ready = drain(r0)
    assert ready.persist == []
    assert msgs(ready.send_after_persist, CAck) == []
    assert msgs(ready.send_after_persist, CNack) == [
        (1, CNack(src=0, view=0, owner=1, index=0, ballot=high))
    ]
    assert o_entries(ready) == []  # the sequencer does not order on a rejected CAccept


def test_acceptor_higher_ballot_replaces_value() -> None:
    # five replicas: with three, accepting A from its proposer would have chosen it
    r2 = core(5, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)
    drain(r2)
    high = ballot_of(1, 0)
    r2.step(caccept(0, 1, 0, (B,), ballot=high), 2)
    ready = drain(r2)
    assert ready.persist == [CAcceptedRecord(owner=1, index=0, ballot=high, batch=(B,))]
    # with five replicas the acknowledgement goes to every replica (the proposer, 0, too)
    ack = cack(2, 1, 0, ballot=high)
    assert msgs(ready.send_after_persist) == [(0, ack), (1, ack), (3, ack), (4, ack)]


def test_with_three_replicas_an_acceptor_learns_a_choice_from_the_accept_itself() -> None:
    r2 = core(3, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)  # 1 accepted it before sending: with us, a majority
    r2.step(oaccept((0, 1)), 1)  # the sequencer and we: slot 0 is chosen too
    ready = drain(r2)
    assert [e.command for e in ready.apply] == [A]  # no CCommit, no OCommit needed
    assert (0, OAck(src=2, view=0, slots=(0,))) in msgs(ready.send_after_persist)
    r2 = core(5, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)
    r2.step(oaccept((0, 1)), 1)
    assert list(drain(r2).apply) == []  # two of five: not yet


def test_with_three_replicas_the_sequencer_learns_a_slot_from_one_acceptor() -> None:
    r0 = core(3, 0)
    r0.step(caccept(1, 1, 0, (A,)), 1)  # orders it: slot 0 => 1, and knows C[1][0] chosen
    drain(r0)
    r0.step(OAck(src=2, view=0, slots=(0,)), 2)  # 2 accepted slot 0: with us, a majority
    assert [e.command for e in drain(r0).apply] == [A]  # before the learner's OCommit


def test_with_five_replicas_a_replica_learns_a_choice_from_the_acceptors_acks() -> None:
    r2 = core(5, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)  # proposer 1 and we accepted: two of five
    r2.step(ocommit(0, (0, 1)), 1)
    ready = drain(r2)
    assert list(ready.apply) == []
    ack = cack(2, 1, 0)
    assert msgs(ready.send_after_persist, CAck) == [(0, ack), (1, ack), (3, ack), (4, ack)]
    r2.step(cack(3, 1, 0), 2)  # a third acceptance of ballot 1: chosen, no CCommit needed
    assert [e.command for e in drain(r2).apply] == [A]


def test_acks_that_overtake_the_accept_count_once_it_arrives() -> None:
    r2 = core(5, 2)
    r2.step(ocommit(0, (0, 1)), 1)
    r2.step(cack(3, 1, 0), 1)  # from acceptors nearer than the proposer
    r2.step(cack(4, 1, 0), 1)
    assert list(drain(r2).apply) == []  # we lack the value
    r2.step(caccept(1, 1, 0, (A,)), 2)
    assert [e.command for e in drain(r2).apply] == [A]


def test_acks_kept_for_an_instance_are_dropped_once_it_is_decided() -> None:
    # acknowledgements that overtook their Accept must not pile up in memory
    r2 = core(5, 2)
    r2.step(cack(3, 1, 0), 1)
    assert r2.c_phase.c_acks_seen  # kept until the Accept comes
    r2.step(ccommit(1, 1, 0, (A,)), 2)  # decided by the proposer's commit instead
    assert r2.c_phase.c_acks_seen == {}
    r2.step(cack(4, 1, 0), 3)  # a late acknowledgement of a decided instance
    assert r2.c_phase.c_acks_seen == {}


def test_acks_of_another_ballot_do_not_choose_what_we_accepted() -> None:
    r2 = core(5, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)  # we accepted A at the owner's ballot
    r2.step(ocommit(0, (0, 1)), 1)
    high = ballot_of(1, 0)
    r2.step(cack(3, 1, 0, ballot=high), 2)  # 3 and 4 accepted a recoverer's value instead
    r2.step(cack(4, 1, 0, ballot=high), 2)
    r2.step(cack(4, 1, 0), 2)  # an older acknowledgement arriving late counts no more
    assert list(drain(r2).apply) == []
    r2.step(caccept(0, 1, 0, (B,), ballot=high), 3)  # now we accept it too: 0, 2, 3, 4
    assert [e.command for e in drain(r2).apply] == [B]


def test_an_overtaken_proposer_counts_acks_only_for_its_own_ballot() -> None:
    """An owner that accepted a recoverer's higher ballot still leads its instance until it
    learns the outcome: acknowledgements of the recoverer's ballot are not its own."""
    r1 = core(5, 1)
    r1.propose(A, 0)
    drain(r1)
    high = ballot_of(1, 0)
    r1.step(caccept(0, 1, 0, (B,), ballot=high), 1)  # the recoverer's value, accepted
    drain(r1)
    r1.step(ocommit(0, (0, 1)), 2)
    r1.step(cack(3, 1, 0), 2)  # an acknowledgement of our own ballot: A is not chosen
    assert list(drain(r1).apply) == []
    r1.step(cack(4, 1, 0, ballot=high), 3)  # recoverer 0, we and 4 accepted B: chosen
    ready = drain(r1)
    assert [e.command for e in ready.apply] == [B]
    assert [(f.command, f.definite) for f in ready.failed] == [(A, True)]


def test_with_three_replicas_an_acceptor_acknowledges_to_the_proposer_only() -> None:
    r2 = core(3, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)
    assert msgs(drain(r2).send_after_persist, CAck) == [(1, cack(2, 1, 0))]


# =========================================================================== O-phase, sequencer


def test_sequencer_orders_on_caccept() -> None:
    r0 = core(3, 0)
    r0.step(caccept(1, 1, 0, (A,)), 1)
    ready = drain(r0)
    assert ready.persist == [
        CAcceptedRecord(owner=1, index=0, ballot=1, batch=(A,)),
        OAcceptedRecord(view=0, entries=(OEntry(slot=0, owner=1),)),
    ]
    assert msgs(ready.send_after_persist) == [
        (1, cack(0, 1, 0)),
        (1, oaccept((0, 1))),
        (2, oaccept((0, 1))),
    ]


def test_sequencer_orders_on_crequest() -> None:
    r0 = core(3, 0)
    r0.step(crequest(2, 0), 1)
    ready = drain(r0)
    assert o_entries(ready) == [(0, 2)]
    assert (1, oaccept((0, 2))) in msgs(ready.send_after_persist)
    assert (2, oaccept((0, 2))) in msgs(ready.send_after_persist)


def test_sequencer_turn_batches_entries_into_one_oaccept_per_peer() -> None:
    r0 = core(3, 0)
    r0.step(caccept(1, 1, 0, (A,)), 1)
    r0.step(caccept(2, 2, 0, (B,)), 1)
    r0.propose(C, 1)
    ready = drain(r0)
    # the own proposal is flushed at ready(): its slot comes last
    assert o_entries(ready) == [(0, 1), (1, 2), (2, 0)]
    assert msgs(ready.send_after_persist, OAccept) == [
        (1, oaccept((0, 1), (1, 2), (2, 0))),
        (2, oaccept((0, 1), (1, 2), (2, 0))),
    ]


def test_duplicated_and_reordered_crequests_are_idempotent() -> None:
    r0 = core(5, 0)
    r0.step(crequest(2, 2), 1)  # index 2 first: replica 2 needs three O-instances
    first = drain(r0)
    assert o_entries(first) == [(0, 2), (1, 2), (2, 2)]
    created: list[tuple[int, int]] = []
    for message in (crequest(2, 0), crequest(2, 2), crequest(2, 1), crequest(2, 2),
                    caccept(2, 2, 1, (A,)), caccept(2, 2, 0, (B,))):
        r0.step(message, 2)
        created += o_entries(drain(r0))
    assert created == []
    r0.step(crequest(3, 0), 3)  # another replica gets the next slot
    assert o_entries(drain(r0)) == [(3, 3)]


def test_crequest_for_ordered_instance_resends_from_requester_prefix() -> None:
    r0 = core(3, 0)
    r0.step(caccept(2, 2, 0, (A,)), 1)  # slot 0 => 2
    r0.step(caccept(1, 1, 0, (B,)), 1)  # slot 1 => 1
    r0.step(caccept(1, 1, 1, (C,)), 1)  # slot 2 => 1
    r0.propose(D, 1)  # slot 3 => 0
    drain(r0)
    # replica 1 accepted slot 0 only and asks again for its index 0 (slot 1)
    r0.step(crequest(1, 0, o_prefix=1), 2)
    ready = drain(r0)
    assert o_entries(ready) == []
    assert msgs(ready.send_after_persist) == [(1, oaccept((1, 1)))]
    # with a gap from slot 0 and a request for index 1 (slot 2): slots 0..2
    r0.step(crequest(1, 1, o_prefix=0), 3)
    ready = drain(r0)
    assert msgs(ready.send_after_persist) == [(1, oaccept((0, 2), (1, 1), (2, 1)))]


def test_fresh_crequest_sends_one_oaccept() -> None:
    r0 = core(5, 0)
    r0.step(crequest(1, 0), 1)
    ready = drain(r0)
    assert o_entries(ready) == [(0, 1)]
    # one OAccept to each replica (the requester included) — not two to the requester
    assert msgs(ready.send_after_persist, OAccept) == [
        (p, oaccept((0, 1))) for p in (1, 2, 3, 4)
    ]


def test_o_phase_messages_only_from_sequencer() -> None:
    r2 = core(3, 2)
    r2.step(oaccept((0, 1), src=1), 1)  # replica 1 is not the sequencer of view 0
    assert drain(r2).is_empty()
    r1 = core(3, 1)
    r1.step(crequest(2, 0), 1)  # only the sequencer orders
    assert drain(r1).is_empty()


# =========================================================================== O-phase, acceptor


def test_oack_goes_to_learner_and_sequencer_n3_and_to_every_replica_n5() -> None:
    r2 = core(3, 2)
    r2.step(oaccept((0, 1)), 1)
    ready = drain(r2)
    assert ready.persist == [OAcceptedRecord(view=0, entries=(OEntry(slot=0, owner=1),))]
    assert sorted(msgs(ready.send_after_persist)) == [(0, oack(2, 0)), (1, oack(2, 0))]
    r1 = core(3, 1)  # the learner itself: its OCommit tells the sequencer
    r1.step(oaccept((0, 1)), 1)
    assert msgs(drain(r1).send_after_persist, OAck) == []
    r2 = core(5, 2)
    r2.step(oaccept((0, 1)), 1)
    ready = drain(r2)
    assert msgs(ready.send_after_persist) == [(0, oack(2, 0)), (1, oack(2, 0)), (3, oack(2, 0)),
                                              (4, oack(2, 0))]


def test_with_five_replicas_a_replica_learns_a_slot_from_the_acceptors_oacks() -> None:
    r2 = core(5, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)
    r2.step(cack(3, 1, 0), 1)  # C[1][0] chosen: 1, 2 and 3 accepted it
    r2.step(oack(3, 0), 1)  # an OAck overtaking the sequencer's OAccept: kept
    assert list(drain(r2).apply) == []
    r2.step(oaccept((0, 1)), 2)  # the sequencer, we and 3 accepted slot 0: chosen
    assert [e.command for e in drain(r2).apply] == [A]  # no OCommit from replica 1 needed
    r3 = core(5, 3)
    r3.step(caccept(1, 1, 0, (A,)), 1)
    r3.step(cack(2, 1, 0), 1)
    r3.step(oaccept((0, 1)), 2)
    assert list(drain(r3).apply) == []  # the sequencer and we: two of five
    r3.step(oack(4, 0), 3)
    assert [e.command for e in drain(r3).apply] == [A]


# =========================================================================== ready rules


def test_ready_n3_needs_commit_and_oaccept_cack_first() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 1)
    ready = drain(r1)
    assert ready.ready == []  # C chosen, not ordered
    r1.step(oaccept((0, 1)), 2)
    ready = drain(r1)
    assert ready.ready == [A]
    assert msgs(ready.send_after_persist, OCommit) == [
        (0, ocommit(1, (0, 1))),
        (2, ocommit(1, (0, 1))),
    ]
    assert ready.apply == [Execution(0, 0, A, True)]


def test_ready_n3_needs_commit_and_oaccept_oaccept_first() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(oaccept((0, 1)), 1)
    ready = drain(r1)
    assert ready.ready == []  # ordered (O chosen: sequencer + us), C not chosen yet
    assert msgs(ready.send_after_persist, OCommit) == [
        (0, ocommit(1, (0, 1))),
        (2, ocommit(1, (0, 1))),
    ]
    assert ready.apply == []
    r1.step(cack(0, 1, 0), 2)
    ready = drain(r1)
    assert ready.ready == [A]
    assert ready.apply == [Execution(0, 0, A, True)]


def test_ready_n3_needs_i_plus_1_o_instances() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.propose(B, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 1)
    r1.step(cack(2, 1, 1), 1)
    r1.step(oaccept((0, 1)), 1)  # one O-instance for 1: only C[1][0] is placed
    assert drain(r1).ready == [A]
    r1.step(oaccept((1, 1)), 2)
    assert drain(r1).ready == [B]


def test_ready_n5_non_sequencer_waits_for_gap_free_prefix() -> None:
    r1 = core(5, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 1)
    r1.step(cack(3, 1, 0), 1)
    assert drain(r1).ready == []  # C chosen
    r1.step(oaccept((1, 1)), 2)  # our slot, but slot 0 (for replica 2) is withheld
    ready = drain(r1)
    assert ready.ready == []
    # committed on the OAccept alone (line 29): OCommit broadcast, OAck to the sequencer
    assert msgs(ready.send_after_persist, OAck) == [(0, oack(1, 1))]
    assert len(msgs(ready.send_after_persist, OCommit)) == 4
    r1.step(oaccept((0, 2)), 3)
    ready = drain(r1)
    assert ready.ready == [A]
    assert ready.apply == []  # slot 0's C-instance (replica 2's) is unknown here


def test_ready_n5_prefix_from_an_older_view_proves_nothing_after_joining_a_newer() -> None:
    # (found by the simulator: N=5 seed 54 with all faults) an O-instance accepted in view 0
    # may be replaced by view 2's rebuild if our vote is not among the majority it uses, so a
    # command chosen after we joined view 2 is not ready on the strength of it
    r1 = core(5, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(oaccept((0, 2), (1, 1)), 1)  # our slot 1 in view 0; slot 0's instance unknown
    drain(r1)
    later = 10_000_000  # past any lease r1 granted
    r1.step(VRequest(src=2, view=2, from_slot=0), later)  # replica 2 stands for view 2
    assert msgs(drain(r1).send_after_persist, Vote)
    r1.step(cack(2, 1, 0, view=2), later)
    r1.step(cack(3, 1, 0, view=2), later)  # C chosen now, in view 2
    ready = drain(r1)
    assert len(msgs(ready.send_after_persist, CCommit)) == 4
    assert ready.ready == []


def test_ready_n5_non_sequencer_not_before_c_chosen() -> None:
    r1 = core(5, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(oaccept((0, 1)), 1)
    r1.step(cack(2, 1, 0), 1)
    assert drain(r1).ready == []  # 2 of 5 accepted C[1][0]
    r1.step(cack(4, 1, 0), 2)
    assert drain(r1).ready == [A]


def test_ready_n5_sequencer_needs_majority_accepted_prefix() -> None:
    r0 = core(5, 0)
    r0.step(caccept(1, 1, 0, (B,)), 0)  # slot 0 => 1
    drain(r0)
    r0.propose(A, 0)  # slot 1 => 0
    ready = drain(r0)
    assert o_entries(ready) == [(1, 0)]
    r0.step(cack(1, 0, 0), 1)
    r0.step(cack(2, 0, 0), 1)
    assert drain(r0).ready == []  # C[0][0] chosen (3 of 5), O not
    r0.step(oack(1, 1), 2)
    r0.step(oack(2, 1), 2)
    ready = drain(r0)
    # O[1] is accepted by a majority (0, 1, 2): committed and broadcast (line 25) ...
    assert msgs(ready.send_after_persist, OCommit) == [
        (p, ocommit(0, (1, 0))) for p in (1, 2, 3, 4)
    ]
    # ... but not ready: slot 0, before ours, is not majority-accepted (line 26)
    assert ready.ready == []
    r0.step(oack(1, 0), 3)
    assert drain(r0).ready == []  # prefix [0, 2) accepted by 0 and 1 only
    r0.step(oack(3, 0), 3)
    assert drain(r0).ready == []  # replica 3 covers slot 0 but not slot 1
    r0.step(oack(2, 0), 4)
    ready = drain(r0)
    assert ready.ready == [A]  # 0, 1 and 2 accepted every slot through 1
    assert msgs(ready.send_after_persist, OCommit) == []  # O[1] was committed already


def test_ready_n5_sequencer_not_before_c_chosen() -> None:
    r0 = core(5, 0)
    r0.propose(A, 0)
    drain(r0)
    r0.step(oack(1, 0), 1)
    r0.step(oack(2, 0), 1)
    ready = drain(r0)
    assert ready.ready == []  # O chosen, C[0][0] only at 0
    assert len(msgs(ready.send_after_persist, OCommit)) == 4
    r0.step(cack(3, 0, 0), 2)
    assert drain(r0).ready == []
    r0.step(cack(4, 0, 0), 2)
    assert drain(r0).ready == [A]


def test_ready_n7_non_sequencer_needs_oacks_from_a_majority() -> None:
    r1 = core(7, 1)
    r1.propose(A, 0)
    drain(r1)
    for src in (2, 3, 4):
        r1.step(cack(src, 1, 0), 1)
    assert drain(r1).ready == []  # C chosen (4 of 7)
    r1.step(oaccept((0, 1)), 2)
    ready = drain(r1)
    assert ready.ready == []  # the sequencer and us: 2 of 7
    assert msgs(ready.send_after_persist, OCommit) == []
    r1.step(oack(5, 0), 3)
    assert drain(r1).ready == []  # 3 of 7
    r1.step(oack(6, 0), 3)
    ready = drain(r1)
    assert ready.ready == [A]  # 4 of 7
    assert len(msgs(ready.send_after_persist, OCommit)) == 6


def test_ready_n7_oacks_before_oaccept_count() -> None:
    r1 = core(7, 1)
    r1.propose(A, 0)
    drain(r1)
    for src in (2, 3, 4):
        r1.step(cack(src, 1, 0), 1)
    r1.step(oack(5, 0), 2)
    r1.step(oack(6, 0), 2)
    assert drain(r1).ready == []  # slot 0's value is not known here yet
    r1.step(oaccept((0, 1)), 3)
    assert drain(r1).ready == [A]


def test_ready_n7_sequencer_needs_oacks_from_a_majority() -> None:
    r0 = core(7, 0)
    r0.propose(A, 0)
    drain(r0)
    for src in (1, 2, 3):
        r0.step(cack(src, 0, 0), 1)
    assert drain(r0).ready == []
    r0.step(oack(1, 0), 2)
    r0.step(oack(2, 0), 2)
    assert drain(r0).ready == []  # 3 of 7
    r0.step(oack(3, 0), 2)
    assert drain(r0).ready == [A]


# =========================================================================== execution


def test_execution_follows_global_log_order() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 1)
    r1.step(oaccept((0, 0), (1, 1)), 1)  # slot 0 => sequencer, slot 1 => us
    ready = drain(r1)
    assert ready.ready == [A]  # C chosen and one O-instance for us chosen
    assert ready.apply == []  # but slot 0 is not committed here
    assert msgs(ready.send_after_persist, OCommit) == [
        (0, ocommit(1, (1, 1))), (2, ocommit(1, (1, 1)))
    ]
    r1.step(ocommit(0, (0, 0)), 2)  # slot 0 committed; C[0][0] still unknown
    assert drain(r1).apply == []
    r1.step(ccommit(0, 0, 0, (B,)), 3)
    ready = drain(r1)
    assert ready.apply == [Execution(0, 0, B, False), Execution(1, 0, A, True)]
    assert r1.executed_through() == 1
    assert r1.committed_log() == {0: (B,), 1: (A,)}


def test_ocommit_out_of_order_at_follower() -> None:
    r2 = core(3, 2)
    r2.step(ccommit(0, 0, 0, (A, B)), 1)
    r2.step(ccommit(1, 1, 0, (C,)), 1)
    r2.step(ocommit(1, (1, 1)), 2)
    assert drain(r2).apply == []
    r2.step(ocommit(0, (0, 0)), 3)
    assert drain(r2).apply == [
        Execution(0, 0, A, False),
        Execution(0, 1, B, False),
        Execution(1, 0, C, False),
    ]
    r2.step(ocommit(0, (0, 0)), 4)  # a duplicate commit executes nothing again
    assert drain(r2).is_empty()


def test_kth_o_instance_places_kth_c_instance() -> None:
    r2 = core(3, 2)
    r2.step(ccommit(1, 1, 1, (B,)), 1)  # C[1][1] first
    r2.step(ccommit(1, 1, 0, (A,)), 1)
    r2.step(ocommit(1, (0, 1), (1, 0), (2, 1)), 2)
    r2.step(ccommit(0, 0, 0, (C,)), 2)
    ready = drain(r2)
    assert [(e.slot, e.command) for e in ready.apply] == [(0, A), (1, C), (2, B)]


def test_ccommit_without_batch_needs_matching_ballot() -> None:
    r2 = core(5, 2)  # with three replicas accepting from the proposer would have chosen it
    r2.step(caccept(1, 1, 0, (A,)), 1)  # accepted at ballot (0, 1)
    drain(r2)
    r2.step(ocommit(1, (0, 1)), 2)
    assert drain(r2).apply == []
    other = ballot_of(1, 0)  # chosen at a recoverer's ballot, perhaps with another value
    r2.step(ccommit(0, 1, 0, None, ballot=other), 3)
    assert drain(r2).apply == []  # not applied: our value may not be the chosen one
    r2.step(ccommit(0, 1, 0, (B,), ballot=other), 4)
    assert drain(r2).apply == [Execution(0, 0, B, False)]


def test_ccommit_without_batch_at_matching_ballot_applies() -> None:
    r2 = core(5, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)
    r2.step(ocommit(1, (0, 1)), 2)
    assert drain(r2).apply == []
    r2.step(ccommit(1, 1, 0, None), 3)
    assert drain(r2).apply == [Execution(0, 0, A, False)]


def test_ccommit_without_batch_for_unknown_instance_is_ignored() -> None:
    r2 = core(3, 2)
    r2.step(ccommit(1, 1, 0, None), 1)
    r2.step(ocommit(1, (0, 1)), 2)
    assert drain(r2).apply == []


# =========================================================================== views


def _in_view_1(me: int) -> SDPaxosReplica:
    """A replica that joined view 1 (sequencer: replica 1) and accepted its NewView."""
    r = core(3, me)
    r.step(NewView(src=1, view=1, start=0, owners=()), 0)
    ready = drain(r)
    assert ready.persist == [
        ViewRecord(view=1),
        NewViewRecord(view=1, start=0, owners=()),
    ]
    assert r.view == 1
    return r


def test_o_phase_messages_from_an_older_view_are_ignored() -> None:
    r2 = _in_view_1(2)
    r2.propose(B, 1)  # C[2][0], leading it in view 1
    drain(r2)
    for message in (
        oaccept((0, 0), view=0, src=0),  # view 0's sequencer
        ocommit(0, (0, 0), view=0),
        crequest(0, 0, view=0),
        OAck(src=0, view=0, slots=(0,)),
    ):
        r2.step(message, 2)
        assert drain(r2).is_empty(), message
    # the sequencer of view 1 is heard
    r2.step(oaccept((0, 0), view=1, src=1), 3)
    assert o_entries(drain(r2)) == [(0, 0)]


def test_c_phase_messages_count_in_any_view() -> None:
    # C-instances are ordered by ballots, not views: an acknowledgement or a recovery's
    # promise that crossed a view change still counts (dropping it stalled failover)
    r2 = _in_view_1(2)
    r2.propose(B, 1)  # C[2][0]
    drain(r2)
    r2.step(CAck(src=0, view=0, owner=2, index=0, ballot=2), 2)
    assert len(msgs(drain(r2).send_after_persist, CCommit)) == 2
    r2.step(caccept(0, 0, 0, (A,), view=0), 3)
    assert msgs(drain(r2).send_after_persist, CAck) == [
        (0, CAck(src=2, view=1, owner=0, index=0, ballot=0))
    ]


def test_older_view_ccommit_is_still_a_fact() -> None:
    r2 = _in_view_1(2)
    r2.step(ccommit(0, 0, 0, (A,), view=0), 1)  # a chosen value is a fact in any view
    assert drain(r2).is_empty()
    r2.step(ocommit(1, (0, 0), view=1), 2)  # slot 0 => 0 committed in view 1
    assert drain(r2).apply == [Execution(0, 0, A, False)]


def test_old_sequencer_does_not_order_after_view_change() -> None:
    r0 = _in_view_1(0)
    r0.step(crequest(2, 0, view=1), 1)
    assert drain(r0).is_empty()  # replica 0 is not the sequencer of view 1


# =========================================================================== driver contract


def test_ready_twice_without_advance_raises() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    first = r1.ready()
    with pytest.raises(LocalProtocolError):
        r1.ready()
    with pytest.raises(LocalProtocolError):
        r1.advance(Ready())
    r1.advance(first)
    with pytest.raises(LocalProtocolError):
        r1.advance(first)
    assert r1.ready().is_empty()


# =========================================================================== retransmission


def test_retransmission_resends_caccept_to_non_ackers_and_crequest_with_prefix() -> None:
    r1 = core(5, 1)
    r1.step(oaccept((0, 2)), 0)  # slot 0 => 2 accepted: our o_prefix is 1
    drain(r1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 10)
    drain(r1)
    r1.tick(199_999)
    ready = drain(r1)
    assert msgs(ready.send_after_persist, CAccept) == []
    assert msgs(ready.send, CRequest) == []
    r1.tick(200_000)
    ready = drain(r1)
    accept = caccept(1, 1, 0, (A,))
    assert msgs(ready.send_after_persist, CAccept) == [(0, accept), (3, accept), (4, accept)]
    assert msgs(ready.send, CRequest) == [(0, crequest(1, 0, o_prefix=1))]
    # not again until another retransmit_us has passed
    r1.tick(300_000)
    ready = drain(r1)
    assert msgs(ready.send_after_persist, CAccept) == []
    assert msgs(ready.send, CRequest) == []
    r1.tick(400_000)
    ready = drain(r1)
    assert len(msgs(ready.send_after_persist, CAccept)) == 3


def test_the_retransmission_timeout_follows_how_long_commits_take() -> None:
    # a loaded cluster chooses instances in 900 ms: re-sending after the 200 ms floor would
    # only queue copies behind the originals (half the bytes of a saturated run). (Nothing
    # is ever ordered here: a shorter election timeout would have replica 1 recover its own
    # instances, and hold new ones until that recovery has its promises.)
    r1 = core(3, 1, election_timeout_us=10_000_000)
    r1.propose(A, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 900_000)
    drain(r1)
    floor = r1.config.retransmit_us
    assert r1.retransmit_timeout_us == min(900_000 + 4 * 450_000, 10 * floor)
    r1.propose(B, 1_000_000)
    drain(r1)
    r1.tick(1_000_000 + 5 * floor)
    assert msgs(drain(r1).send_after_persist, CAccept) == []
    r1.tick(1_000_000 + r1.retransmit_timeout_us)
    assert len(msgs(drain(r1).send_after_persist, CAccept)) == 2
    # fast commits bring it back down to the floor (a retransmitted instance is no sample)
    r1.step(cack(2, 1, 1), 3_100_000)
    drain(r1)
    assert r1.retransmit_timeout_us == 2_000_000
    for i, now in enumerate(range(4_000_000, 5_000_000, 10_000), start=2):
        r1.propose(cmd(7, i), now)
        drain(r1)
        r1.step(cack(2, 1, i), now + 1_000)
        drain(r1)
    assert r1.retransmit_timeout_us == floor


def test_retransmission_after_commit_sends_only_crequest() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.propose(B, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 1)
    r1.step(cack(2, 1, 1), 1)
    drain(r1)
    r1.tick(200_000)
    ready = drain(r1)
    assert msgs(ready.send_after_persist, CAccept) == []
    # one request for the highest late index covers the lower ones
    assert msgs(ready.send, CRequest) == [(0, crequest(1, 1, o_prefix=0))]


def test_ready_instance_is_not_retransmitted() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 1)
    r1.step(oaccept((0, 1)), 1)
    assert drain(r1).ready == [A]
    r1.tick(500_000)
    ready = drain(r1)
    assert msgs(ready.send_after_persist, CAccept) == []
    assert msgs(ready.send, CRequest) == []


# =========================================================================== catch-up


def _executed_sequencer() -> SDPaxosReplica:
    """Replica 0 (N=3) that executed slot 0 => 1 (C[1][0] = [A]) and slot 1 => 0 ([B, C])."""
    r0 = core(3, 0)
    r0.step(caccept(1, 1, 0, (A,)), 0)
    r0.step(ccommit(1, 1, 0, None), 0)
    r0.step(ocommit(1, (0, 1)), 0)
    r0.propose(B, 0)
    r0.propose(C, 0)
    applied = list(drain(r0).apply)
    r0.step(cack(2, 0, 0), 1)
    r0.step(oack(2, 1), 1)
    applied += drain(r0).apply
    assert [(e.slot, e.command) for e in applied] == [(0, A), (1, B), (1, C)]
    return r0


def test_catchup_answer_carries_ocommit_and_ccommits_with_batches() -> None:
    r0 = _executed_sequencer()
    r0.step(Catchup(src=2, view=0, slot=0), 2)
    ready = drain(r0)
    out = all_out(ready)
    assert (2, ocommit(0, (0, 1), (1, 0))) in out
    assert (2, ccommit(0, 1, 0, (A,))) in out
    assert (2, ccommit(0, 0, 0, (B, C), ballot=0)) in out
    assert all(to == 2 for to, _ in out)
    # a lagging replica that knew nothing executes both slots from the answer alone
    r2 = core(3, 2)
    for _, message in out:
        r2.step(message, 3)
    assert [(e.slot, e.offset, e.command, e.led_here) for e in drain(r2).apply] == [
        (0, 0, A, False),
        (1, 0, B, False),
        (1, 1, C, False),
    ]


def test_catchup_from_a_later_slot() -> None:
    r0 = _executed_sequencer()
    r0.step(Catchup(src=1, view=0, slot=1), 2)
    out = all_out(drain(r0))
    assert (1, ocommit(0, (1, 0))) in out
    assert (1, ccommit(0, 0, 0, (B, C), ballot=0)) in out
    assert not any(isinstance(m, OCommit) and m.entries[0].slot == 0 for _, m in out)


def test_stuck_replica_asks_for_markers_then_for_the_values_it_lacks() -> None:
    r0 = core(3, 0)
    r0.step(caccept(1, 1, 0, (A,)), 0)
    r0.step(ccommit(1, 1, 0, None), 0)
    drain(r0)
    r2 = core(3, 2)
    r2.step(oaccept((0, 1)), 0)  # knows slot 0's owner, never hears of C[1][0]
    drain(r2)
    r2.tick(299_999)
    assert msgs(drain(r2).send) == []
    r2.tick(300_000)
    assert msgs(drain(r2).send) == [(0, CatchupMarkers(src=2, view=0, slot=0))]
    r0.step(CatchupMarkers(src=2, view=0, slot=0), 1)
    answer = all_out(drain(r0))
    assert (2, ccommit(0, 1, 0, None)) in answer  # no value: r2 may hold it
    for _, message in answer:
        r2.step(message, 300_001)
    assert list(drain(r2).apply) == []  # it did not
    r2.tick(300_002)  # the marker it could not use: values at once, not a timeout later
    assert msgs(drain(r2).send) == [(1, Catchup(src=2, view=0, slot=0))]
    r0.step(Catchup(src=2, view=0, slot=0), 2)
    for _, message in all_out(drain(r0)):
        r2.step(message, 300_003)
    assert [e.command for e in drain(r2).apply] == [A]


def test_markers_alone_unblock_a_replica_that_holds_the_values() -> None:
    # an overloaded cluster: the commits are late, the values arrived long ago (five
    # replicas: with three, accepting from the proposer is learning the choice)
    r0 = core(5, 0)
    r0.step(caccept(1, 1, 0, (A,)), 0)  # the sequencer orders it: slot 0
    r0.step(ccommit(1, 1, 0, None), 0)
    r0.step(ocommit(1, (0, 1)), 0)
    assert [e.command for e in drain(r0).apply] == [A]
    r2 = core(5, 2)
    r2.step(caccept(1, 1, 0, (A,)), 0)
    r2.step(oaccept((0, 1)), 0)
    drain(r2)
    r2.tick(300_000)
    (ask,) = msgs(drain(r2).send, CatchupMarkers)
    assert ask[1] == CatchupMarkers(src=2, view=0, slot=0)
    r0.step(ask[1], 1)
    answer = all_out(drain(r0))
    assert (2, ccommit(0, 1, 0, None)) in answer
    for _, message in answer:
        r2.step(message, 300_001)
    assert [e.command for e in drain(r2).apply] == [A]
    r2.tick(600_001)
    assert msgs(drain(r2).send, Catchup) == []  # no values were ever needed


# =========================================================================== known liveness bug


_LOST_OWN_OACCEPT = (
    "N=3/N>=7 sequencer: once C[0][k] is reported ready by the count rule (i+1 O-instances "
    "for 0 chosen) while its own slot is not chosen, _retransmit only re-sends the slots of "
    "*late* indexes, so an own O-instance lost to every peer is never re-sent"
)


def test_n3_sequencer_resends_unchosen_own_oaccept() -> None:
    r0 = core(3, 0)
    r0.propose(A, 0)  # C[0][0] in slot 0
    drain(r0)
    r0.propose(B, 0)  # C[0][1] in slot 1
    drain(r0)
    # both C-instances chosen; the OAccepts for slot 0 were lost, slot 1 was accepted by 1
    r0.step(cack(1, 0, 0), 1)
    r0.step(cack(1, 0, 1), 1)
    r0.step(oack(1, 1), 1)
    ready = drain(r0)
    # Figure 5 line 21 counts O-instances: one is chosen (slot 1), so C[0][0] is ready
    assert ready.ready == [A]
    assert ready.apply == []  # slot 0 is not chosen: nothing can execute anywhere
    r0.tick(200_000)
    ready = drain(r0)
    resent = {
        to
        for to, m in msgs(ready.send_after_persist, OAccept)
        if isinstance(m, OAccept) and OEntry(slot=0, owner=0) in m.entries
    }
    assert resent == {1, 2}  # actual: no OAccept at all, on this or any later tick


def test_n3_cluster_recovers_sequencer_slot_lost_to_every_peer() -> None:
    net = Net(ProtocolConfig(replicas=3))  # heartbeats flow: the sequencer is never suspected
    net.propose(0, A)
    net.propose(0, B)
    first = net.matching("0", "*", "OAccept")[:2]
    assert [f.message.entries for f in first] == [(OEntry(slot=0, owner=0),)] * 2
    for flight in first:
        net.drop(flight)
    net.deliver_all()
    assert net.ready_cmds[0] == [A]  # reported ready (blind writes are acknowledged now)
    for round_ in range(1, 16):  # three seconds of timers, with every message delivered
        for replica in range(3):
            net.tick(replica, at=round_ * 200_000)
        net.deliver_all()
    # actual: nobody executes anything, ever; B never becomes ready
    assert [[e.command for e in executed] for executed in net.executed] == [[A, B]] * 3


# =========================================================================== found by the sweeps


def test_deposed_sequencer_records_its_last_orders_under_their_own_view() -> None:
    # (N=3 seed 1466, all faults) a sequencer that orders and then joins a higher view in
    # the same turn must not stamp those orders with the new view: a restart would read them
    # back as the new view's, a second value for a slot the new sequencer assigns
    r0 = core(3, 0)
    r0.tick(0)
    drain(r0)
    later = 10_000_000  # past any lease
    r0.step(crequest(2, 0), later)  # ordered at once: slot 0 -> 2, OAccept queued
    r0.step(VRequest(src=1, view=1, from_slot=0), later)
    ready = drain(r0)
    assert r0.view == 1
    records = [r for r in ready.persist if isinstance(r, OAcceptedRecord)]
    assert records == [OAcceptedRecord(view=0, entries=(OEntry(slot=0, owner=2),))]
    assert {m.view for _, m in msgs(ready.send_after_persist, OAccept)} <= {0}


def test_owner_recovers_an_instance_execution_waits_for_and_retransmits_the_noop() -> None:
    # (N=3 seeds 354, 1472, all faults) slot 0 is chosen for replica 1's index 0, which it
    # does not hold (proposed before a crash and never made durable, say): it must recover
    # the index itself, and keep re-sending the no-op it proposes until a majority has it
    r1 = core(3, 1)
    r1.step(oaccept((0, 1)), 1)
    drain(r1)
    prepare: CPrepare | None = None
    now = 0
    while prepare is None:
        now += 50_000
        assert now < 2_000_000, "no recovery of the instance execution waits for"
        r1.tick(now)
        ready = drain(r1)
        found = msgs(ready.send_after_persist + ready.send, CPrepare)
        prepare = found[0][1] if found else None  # type: ignore[assignment]
    assert (prepare.owner, prepare.from_index) == (1, 0)
    r1.step(CPromise(src=2, view=0, owner=1, from_index=0, ballot=prepare.ballot,
                     accepted=(), high=-1, through=EVERY_INDEX), now)
    ready = drain(r1)
    noop = CAccept(src=1, view=0, owner=1, index=0, ballot=prepare.ballot, batch=())
    assert msgs(ready.send_after_persist, CAccept) == [(0, noop), (2, noop)]
    # both lost: the no-op is sent again after the retransmission timeout
    r1.tick(now + 250_000)
    assert (2, noop) in msgs(drain(r1).send_after_persist, CAccept)


def test_a_recovery_without_a_majority_in_time_asks_again_at_the_same_ballot() -> None:
    # past saturation a Prepare round trip outlasted the timeout: each retry at a higher
    # ballot voided the promises on their way, and owners re-prepared their own instances
    # over and over, holding back their clients' commands meanwhile
    r1 = core(5, 1)
    r1.step(oaccept((0, 1)), 1)
    drain(r1)
    prepares: list[tuple[int, PeerMessage]] = []
    now = 0
    while not prepares:  # execution stopped: it recovers the instance execution waits for
        now += 50_000
        assert now < 2_000_000, "no recovery"
        r1.tick(now)
        prepares = [(to, m) for to, m in all_out(drain(r1)) if isinstance(m, CPrepare)]
    prepare = prepares[0][1]
    assert isinstance(prepare, CPrepare) and (prepare.owner, prepare.from_index) == (1, 0)
    timeout = r1.config.election_timeout_us
    late = now + 10_000
    r1.step(CPromise(src=2, view=0, owner=1, from_index=0, ballot=prepare.ballot,
                     accepted=(), high=-1, through=EVERY_INDEX), late)
    drain(r1)
    r1.tick(late + timeout)
    again = [(to, m) for to, m in all_out(drain(r1)) if isinstance(m, CPrepare)]
    assert again == [(0, prepare), (3, prepare), (4, prepare)]
    r1.step(CPromise(src=3, view=0, owner=1, from_index=0, ballot=prepare.ballot,
                     accepted=(), high=-1, through=EVERY_INDEX), late + timeout + 1)
    noop = CAccept(src=1, view=0, owner=1, index=0, ballot=prepare.ballot, batch=())
    assert msgs(drain(r1).send_after_persist, CAccept) == [(0, noop), (2, noop), (3, noop),
                                                           (4, noop)]


def test_a_recovery_asks_again_from_where_execution_got_to() -> None:
    # (N=5 seeds 4, 6, 7 with snapshots every 10 slots) asking again from the first start
    # reached below the peers' compaction point: they answered with snapshots, never with
    # promises, and the recovery never ended
    r2 = core(5, 2)
    r2.tick(0)
    r2.recovery.start_recovery(1, 0)
    (prepare,) = {m for _, m in all_out(drain(r2)) if isinstance(m, CPrepare)}
    r2.step(caccept(1, 1, 0, (A,)), 10)
    r2.step(ccommit(1, 1, 0, (A,)), 10)
    r2.step(oaccept((0, 1)), 10)
    r2.step(ocommit(0, (0, 1)), 10)
    assert [e.command for e in drain(r2).apply] == [A]
    r2.tick(r2.config.election_timeout_us + 20)
    again = {m for _, m in all_out(drain(r2)) if isinstance(m, CPrepare)}
    assert again == {dataclasses.replace(prepare, from_index=1)}


def test_an_owner_does_not_recover_its_own_chosen_instances_while_execution_waits() -> None:
    # past saturation execution stalled for longer than the election timeout behind others'
    # instances; an owner took its chosen but not yet ordered instances for ones nobody drove
    # and prepared them again, raising its ballot each time (33 of 36 recoveries in a run)
    r1 = core(5, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 1)
    r1.step(cack(4, 1, 0), 1)
    drain(r1)
    for now in range(50_000, 3_000_000, 50_000):
        for peer in (0, 2, 3, 4):
            r1.step(Heartbeat(src=peer, view=0, executed=0, lease_request=-1), now)
        r1.tick(now)
        assert [m for _, m in all_out(drain(r1)) if isinstance(m, CPrepare)] == [], now
    assert r1.recoveries_started == 0


def test_an_owner_overtaken_by_a_recoverer_takes_back_what_it_proposed_after() -> None:
    # Found by `bench throughput --straggler 0.33 --straggler-replica 1`: peers suspected the
    # slow replica 1 and recovered its instances. A recoverer's promise covers every later
    # index, so what replica 1 had in flight was refused, and nobody drove it. Replica 1
    # retook its own instances only once execution stopped, which it never did under load:
    # its clients waited for good.
    r1 = core(3, 1, heartbeat_us=10_000_000)
    r1.tick(0)
    r1.propose(C, 1)
    (accept,) = {m for _, m in msgs(drain(r1).send_after_persist, CAccept)}
    for src in (0, 2):  # both promised a recoverer of ours a higher ballot meanwhile
        r1.step(CNack(src=src, view=0, owner=1, index=accept.index,
                      ballot=ballot_of(1, 0)), 2)
    drain(r1)
    prepare: CPrepare | None = None
    now, slot = 0, 0
    while prepare is None:
        now += 50_000
        assert now < 2_000_000, "the refused proposal is never taken back"
        # replica 2's commands keep executing here meanwhile
        r1.step(caccept(2, 2, slot, (cmd(100 + slot, 2),)), now)
        r1.step(ccommit(2, 2, slot, (cmd(100 + slot, 2),)), now)
        r1.step(ocommit(0, (slot, 2)), now)
        slot += 1
        r1.tick(now)
        ready = drain(r1)
        assert ready.apply
        found = msgs(ready.send_after_persist + ready.send, CPrepare)
        prepare = found[0][1] if found else None  # type: ignore[assignment]
    assert (prepare.owner, prepare.from_index) == (1, accept.index)
    assert prepare.ballot > ballot_of(1, 0)


def test_an_owner_never_accepts_its_own_proposal_below_a_ballot_it_promised() -> None:
    # Replica 2 recovers replica 1's instances from index 0; replica 1 promises, then gets a
    # command. Accepting it at its own ballot 1 broke that promise: with the sequencer's
    # acceptance (it had not promised yet) it was chosen, while replica 2, promised by 1 and
    # 2 (neither reporting it), chose a no-op for the same instance. Replicas 0 and 1 executed
    # the command in slot 0 and replica 2 did not. The command now waits for replica 1's own
    # recovery, which proposes it where nothing else was chosen.
    net = Net(ProtocolConfig(replicas=3))
    for r in range(3):
        net.tick(r, 0)
    net.bag.clear()
    net.cores[2].recovery.start_recovery(1, 0)
    net.flush(2)
    (prepare,) = net.matching("2", "1", "CPrepare")
    net.deliver(prepare)
    (promise,) = net.matching("1", "2", "CPromise")
    net.propose(1, C)
    assert net.matching("1", "*", "CAccept") == []
    assert not any(isinstance(r, CAcceptedRecord) and r.owner == 1 for r in net.durable[1])
    # the old race: the sequencer hears from replica 1 before replica 2's Prepare reaches it,
    # and replica 2 completes its recovery before hearing more from replica 1
    for flight in [*net.matching("1", "0", "*"), *net.matching("0", "*", "*")]:
        net.deliver(flight)
    net.deliver(promise)
    net.deliver_all()
    chosen = {
        (inst.ballot, inst.batch)
        for replica in net.cores
        if (inst := replica.c.get((1, 0))) is not None and inst.committed
    }
    assert len(chosen) == 1
    # the command is chosen there (replica 2's no-op was not), and runs everywhere
    assert [b for _, b in chosen] == [(C,)]
    for r in range(3):
        net.tick(r, 10_000_000)
    net.deliver_all()
    assert [[e.command for e in executed] for executed in net.executed] == [[C]] * 3


def test_a_recoverer_that_promised_a_higher_ballot_meanwhile_proposes_nothing() -> None:
    # (N=3 seed 390 at 6 clients per site) replica 0 recovered replica 2's instances at
    # ballot 1280, promised replica 2's own recovery 1282, then got its last promise: its
    # no-op at 1280, accepted by itself against its promise, was chosen with replica 1, and
    # replica 2's batch at 1282 was chosen too. Replica 2 executed the batch in slot 77,
    # the others nothing.
    r0 = core(3, 0)
    r0.tick(0)
    r0.recovery.start_recovery(2, 0)
    (ours,) = {m for _, m in all_out(drain(r0)) if isinstance(m, CPrepare)}
    r0.step(CPrepare(src=2, view=0, owner=2, from_index=0, ballot=ours.ballot + 2), 1)
    assert [type(m) for _, m in all_out(drain(r0))] == [CPromise]
    r0.step(CPromise(src=1, view=0, owner=2, from_index=0, ballot=ours.ballot, accepted=(),
                     high=0, through=EVERY_INDEX), 2)
    ready = drain(r0)
    assert [m for _, m in all_out(ready) if isinstance(m, CAccept)] == []
    assert [r for r in ready.persist if isinstance(r, CAcceptedRecord)] == []


def test_a_proposal_held_for_a_recovery_is_named_nowhere_until_it_is_durable() -> None:
    # (N=3 WAN seeds 86 and 97, with a first version of the hold) a CRequest named the held
    # index, the sequencer ordered it, and a restart (which forgets what was held) used the
    # index again: a read proposed after the restart ran in a slot given out before a write
    # it had seen acknowledged.
    r1 = core(3, 1)
    r1.tick(0)
    r1.step(CPrepare(src=2, view=0, owner=1, from_index=0, ballot=ballot_of(1, 2)), 0)
    drain(r1)
    r1.propose(C, 1)
    ready = drain(r1)
    assert not any(isinstance(r, CAcceptedRecord) for r in ready.persist)
    sent = [m for _, m in all_out(ready)]
    for now in range(100_000, 3_000_000, 100_000):
        r1.tick(now)
        sent += [m for _, m in all_out(drain(r1))]
        if now >= 1_000_000 and isinstance(sent[-1], CPrepare):
            break
    assert [m for m in sent if isinstance(m, CAccept | CRequest | CCommit)] == []
    # its own recovery (retried while no promise came) is what proposes it, durably first
    prepares = [m for m in sent if isinstance(m, CPrepare)]
    assert {(m.owner, m.from_index) for m in prepares} == {(1, 0)}
    r1.step(CPromise(src=0, view=0, owner=1, from_index=0, ballot=prepares[-1].ballot,
                     accepted=(), high=-1, through=EVERY_INDEX), now)
    ready = drain(r1)
    assert [(r.index, r.batch) for r in ready.persist if isinstance(r, CAcceptedRecord)] == [
        (0, (C,))
    ]
    assert {m.batch for _, m in msgs(ready.send_after_persist, CAccept)} == {(C,)}


def _silence_until_prevote(r: SDPaxosReplica, now: int) -> tuple[PreVote, int]:
    """Tick ``r`` in 50 ms steps, hearing nothing, until it asks for pre-votes."""
    while True:
        now += 50_000
        r.tick(now)
        found = msgs(drain(r).send, PreVote)
        if found:
            return found[0][1], now


def _candidate_of_view_4_after_view_2(
    new_view_start: int, owners: tuple[int, ...]
) -> SDPaxosReplica:
    """Replica 1 installed view 2's NewView, then stands for view 4 (replica 0 pre-votes)."""
    r1 = core(3, 1)
    r1.tick(0)
    drain(r1)
    r1.step(NewView(src=2, view=2, start=new_view_start, owners=owners), 1_000)
    drain(r1)
    prevote, now = _silence_until_prevote(r1, 1_000)  # view 2's sequencer falls silent
    assert prevote.view == 4
    r1.step(PreVoteReply(src=0, view=4, granted=True), now)
    drain(r1)
    return r1


TICK_US = 50_000


def _first_prepare(owner_speaks: set[int], accepted_at: int, until: int) -> int:
    """Replica 2 of five (the recoverer of replica 1) runs in 50 ms turns until ``until``:
    every other peer heartbeats each turn, replica 1 only at the times in ``owner_speaks``;
    at ``accepted_at`` replica 2 accepts an instance of replica 1 and never learns it chosen.
    When replica 2 first recovers replica 1's instances (-1: never)."""
    r2 = core(5, 2)
    for now in range(TICK_US, until + 1, TICK_US):
        for peer in (0, 1, 3, 4):
            if peer != 1 or now in owner_speaks:
                r2.step(Heartbeat(src=peer, view=0, executed=0, lease_request=-1), now)
        if now == accepted_at:
            r2.step(caccept(1, 1, 0, (A,)), now)
        r2.tick(now)
        if any(m.owner == 1 for _, m in all_out(drain(r2)) if isinstance(m, CPrepare)):
            return now
    return -1


TIMEOUT_US = ProtocolConfig(replicas=5).election_timeout_us


def test_a_silent_peer_is_recovered_after_the_election_timeout() -> None:
    last = 1_000_000
    speaks = set(range(TICK_US, last + 1, TICK_US))
    assert _first_prepare(speaks, TICK_US, 3_000_000) == last + TIMEOUT_US + TICK_US


def test_a_peer_slow_but_alive_is_recovered_only_after_twice_its_recent_silences() -> None:
    # past saturation (5 replicas at 0.15 CPU) loop turns stretched to 150-330 ms: replicas
    # were recovered while alive, and their clients were told "recovered without it"
    gap = TIMEOUT_US + 2 * TICK_US  # a message every 400 ms, longer than the timeout
    last = 2_000_000
    speaks = set(range(gap, last + 1, gap))
    assert _first_prepare(speaks, gap, 5_000_000) == last + SILENCE_FACTOR * gap + TICK_US


def test_slow_silences_are_forgotten_after_two_windows_of_regular_messages() -> None:
    gap = TIMEOUT_US + 2 * TICK_US
    slow_until = 2_000_000
    regular_until = slow_until + 2 * SILENCE_WINDOW_FACTOR * TIMEOUT_US + TICK_US
    speaks = set(range(gap, slow_until, gap)) | set(
        range(slow_until, regular_until + 1, TICK_US)
    )
    expected = regular_until + TIMEOUT_US + TICK_US
    assert _first_prepare(speaks, gap, regular_until + 2_000_000) == expected


def test_a_silence_longer_than_slow_turns_explain_is_not_learned() -> None:
    # a crash and restart: the peer is suspected after the usual timeout afterwards
    crash = SILENCE_CEILING_FACTOR * TIMEOUT_US // SILENCE_FACTOR + TICK_US
    back = 1_000_000 + crash
    last = back + 1_000_000
    speaks = set(range(TICK_US, 1_000_000, TICK_US)) | set(range(back, last + 1, TICK_US))
    assert _first_prepare(speaks, back, last + 2_000_000) == last + TIMEOUT_US + TICK_US


def test_new_sequencer_drops_a_deposed_sequencers_leftover_order() -> None:
    # (N=3 seeds 490 LAN, 1044 WAN, all faults) replica 0, deposed sequencer of view 0, ordered
    # slot 5 for replica 2 after view 2 was elected without it. Slot 5 cannot have been chosen
    # (view 2's NewView, which replica 1 installed, would hold it), so view 4 must not revive
    # it: replica 2's next command would land there, before commands already ready
    r1 = _candidate_of_view_4_after_view_2(0, (0, 0, 0, 0, 0))
    stale = OVote(slot=5, owner=2, ballot=0)
    r1.step(Vote(src=0, view=4, accepted_view=0, accepted_from=0, executed=0, entries=(stale,),
                 c_high=(-1, -1, 9)), 10_000_000)
    new_views = msgs(drain(r1).send_after_persist, NewView)
    assert new_views and all(m.owners == (0, 0, 0, 0, 0) for _, m in new_views)


def test_new_sequencer_keeps_old_values_below_the_newest_views_start() -> None:
    # below the start of view 2's NewView, replica 1 holding nothing proves nothing: those
    # slots were decided before view 2 (executed by its sequencer), maybe as replica 0 says
    r1 = _candidate_of_view_4_after_view_2(3, (0, 0))
    old = OVote(slot=1, owner=2, ballot=0)
    r1.step(Vote(src=0, view=4, accepted_view=0, accepted_from=0, executed=0, entries=(old,),
                 c_high=(-1, -1, 9)), 10_000_000)
    new_views = msgs(drain(r1).send_after_persist, NewView)
    assert new_views and all(m.owners[1] == 2 for _, m in new_views)


# ------------------------------------------------------------------ straggler detection (§4)
def _steady_load(c_wait_ms: int, o_wait_ms: int, *, seconds: float = 3.0,
                 healed_at_ms: int | None = None,
                 **config: object) -> tuple[SDPaxosReplica, list[tuple[int, int, Suspect]]]:
    """Replica 1 of three leads a command every 5 ms, as closed-loop clients would at the
    pace the cluster allows; its C-phase takes ``c_wait_ms`` and its order ``o_wait_ms``
    (``c_wait_ms`` too from ``healed_at_ms`` on). Returns the core and every Suspect it sent
    (time in ms, destination, message)."""
    r1 = core(3, 1, straggler_cooldown_us=0, election_timeout_us=10_000_000, **config)
    due: dict[int, list[PeerMessage]] = {}
    suspects = []
    index = 0
    for ms in range(int(seconds * 1000)):
        now = ms * 1000
        if ms % 5 == 0:
            r1.propose(cmd(7, index), now)
            due.setdefault(ms + c_wait_ms, []).append(cack(2, 1, index))
            healed = healed_at_ms is not None and ms >= healed_at_ms
            due.setdefault(ms + (c_wait_ms if healed else o_wait_ms), []).append(
                oaccept((index, 1))
            )
            index += 1
        for message in due.pop(ms, []):
            r1.step(message, now)
        r1.tick(now)
        ready = drain(r1)
        suspects += [(ms, to, m) for to, m in msgs(ready.send_after_persist, Suspect)]
    return r1, suspects



def test_a_sequencer_ordering_far_slower_than_the_c_phase_is_suspected() -> None:
    # the sequencer orders 40 ms after the C-phase took 1 ms, steadily: demand never
    # outruns supply by 2x (closed loop), only the waits show the straggler
    r1, suspects = _steady_load(1, 40)
    assert suspects, "a lagging sequencer went unsuspected"
    first = suspects[0][0]
    # three slow 500 ms windows in a row, the first one from start-up
    assert 1500 <= first < 2000
    assert {(to, m) for ms, to, m in suspects if ms == first} == {
        (0, Suspect(src=1, view=0)), (2, Suspect(src=1, view=0))}
    # said again every window while it lasts (a lost Suspect must not leave it alone)
    assert sorted({ms for ms, _, _ in suspects}) == list(range(first, 3000, 500))
    # alone it changes nothing; with replica 2 agreeing (a majority) it stops renewing the
    # lease and runs for the sequencer once the lease has lapsed (plus a random part of half
    # the election timeout, 10 s here)
    r1.step(Suspect(src=2, view=0), first * 1000 + 1)
    drain(r1)
    for ms in range(first + 1, first + 6000):
        r1.tick(ms * 1000)
        if msgs(drain(r1).send, PreVote) or r1.role is not Role.FOLLOWER:
            break
    else:
        raise AssertionError("a majority of suspects did not start an election")


def test_a_suspicion_no_majority_joins_ends_once_ordering_is_good_again() -> None:
    # (N=3 seeds 70, 159, 204, ... at 6 clients per site) both followers suspected the
    # sequencer during partitions, each never heard the other's only Suspect, and they
    # stopped renewing its leases for good: no election followed, and every read stalled.
    r1, suspects = _steady_load(1, 40, seconds=5.0, healed_at_ms=2500)
    first, last = suspects[0][0], suspects[-1][0]
    assert 1500 <= first < 2000 and last < 3000 + 3 * 500
    assert not r1.straggler.suspecting
    r1.step(Heartbeat(src=0, view=0, executed=0, lease_request=5_000_000), 5_000_000)
    assert msgs(drain(r1).send_after_persist, LeaseGrant) == [
        (0, LeaseGrant(src=1, view=0, request=5_000_000))
    ]


@pytest.mark.parametrize(("c_wait_ms", "o_wait_ms"), [
    (1, 1),      # LAN, idle
    (1, 3),      # LAN, the sequencer busier than the rest
    (20, 20),    # paper's WAN, 3 replicas: OR
    (125, 146),  # paper's WAN, 5 replicas: the sites far from the sequencer
])
def test_ordering_in_step_with_the_c_phase_is_never_suspected(
    c_wait_ms: int, o_wait_ms: int
) -> None:
    _, suspects = _steady_load(c_wait_ms, o_wait_ms, seconds=5.0)
    assert suspects == []


def test_detection_can_be_configured_off() -> None:
    _, suspects = _steady_load(1, 40, straggler_windows=0)
    assert suspects == []


# ------------------------------------------------------------------ reads (§3.5)
def _read(client: int, *keys: str) -> Command:
    return Command(client_id=client, seq=0, op=b"get", keys=keys)


def test_one_turns_reads_ask_the_sequencer_once_for_the_union_of_their_keys() -> None:
    r1 = core(3, 1)
    first, second = _read(20, "b", "a"), _read(21, "a", "c")
    r1.read(first, 0)
    r1.read(second, 0)
    ready = drain(r1)
    assert msgs(ready.send, RRequest) == [
        (0, RRequest(src=1, view=0, read_id=1, keys=("a", "b", "c")))]
    assert ready.reads == []
    # the answer serves both once every slot through it has executed here
    r1.step(RReply(src=0, view=0, read_id=1, slot=0), 10)
    assert drain(r1).reads == []
    r1.step(caccept(2, 2, 0, (A,)), 20)
    r1.step(ccommit(2, 2, 0, (A,)), 20)
    r1.step(ocommit(0, (0, 2)), 20)
    ready = drain(r1)
    assert [e.command for e in ready.apply] == [A]
    assert ready.reads == [first, second]


def test_a_read_without_keys_asks_for_the_last_slot_overall() -> None:
    r1 = core(3, 1)
    r1.read(_read(20, "a"), 0)
    r1.read(_read(21), 0)
    assert msgs(drain(r1).send, RRequest) == [(0, RRequest(src=1, view=0, read_id=1, keys=()))]


@pytest.mark.parametrize("keyless_first", [True, False])
def test_a_batch_with_a_keyless_update_counts_as_updating_every_key(keyless_first: bool) -> None:
    """A command naming no keys may update any key, also when batched with commands that name
    theirs: a read of another key must wait for its slot (a union of the named keys alone
    answered an older slot, and the read missed the update)."""
    r0 = core(3, 0)
    r0.tick(0)
    r0.step(LeaseGrant(src=1, view=0, request=0), 10)
    drain(r0)
    keyed, keyless = cmd(7, 0, keys=("a",)), cmd(8, 0)
    batch = (keyless, keyed) if keyless_first else (keyed, keyless)
    r0.step(caccept(1, 1, 0, batch), 20)  # ordered in slot 0
    drain(r0)
    r0.step(RRequest(src=2, view=0, read_id=1, keys=("b",)), 30)
    assert msgs(drain(r0).send, RReply) == [(2, RReply(src=0, view=0, read_id=1, slot=0))]


def test_a_read_gets_the_last_slot_that_updated_one_of_its_keys() -> None:
    """The history table notes every key of every command of a batch, and a later slot moves
    only the keys its own batch names."""
    r0 = core(3, 0)
    r0.tick(0)
    r0.step(LeaseGrant(src=1, view=0, request=0), 10)
    drain(r0)
    r0.step(caccept(1, 1, 0, (cmd(7, 0, keys=("a", "b")), cmd(8, 0, keys=("c",)))), 20)  # slot 0
    r0.step(caccept(2, 2, 0, (cmd(9, 0, keys=("a",)),)), 20)  # slot 1
    drain(r0)
    for read_id, keys in enumerate((("b",), ("c",), ("a",), ("b", "c"), ("c", "a"), ("d",))):
        r0.step(RRequest(src=2, view=0, read_id=read_id, keys=keys), 30)
    slots = [reply.slot for _, reply in msgs(drain(r0).send, RReply)]
    assert slots == [0, 0, 1, 0, 1, -1]


def test_an_unanswered_read_request_is_sent_again_and_answers_only_count_once() -> None:
    r1 = core(3, 1)
    read = _read(20, "a")
    r1.read(read, 0)
    drain(r1)
    r1.tick(200_000)
    assert msgs(drain(r1).send, RRequest) == [
        (0, RRequest(src=1, view=0, read_id=1, keys=("a",)))]
    r1.step(RReply(src=0, view=0, read_id=1, slot=-1), 200_010)
    r1.step(RReply(src=0, view=0, read_id=1, slot=-1), 200_010)  # the retransmission's
    assert drain(r1).reads == [read]
    r1.step(RReply(src=0, view=0, read_id=1, slot=-1), 200_020)
    assert drain(r1).reads == []


def test_the_sequencers_own_reads_wait_for_a_lease_then_share_one_slot_per_turn() -> None:
    r0 = core(3, 0)
    r0.tick(0)
    drain(r0)
    # an update of "a" ordered in slot 0 (not executed yet: its C-instance is not here)
    r0.step(caccept(1, 1, 0, (A,)), 10)
    drain(r0)
    before_lease = _read(20, "a")
    r0.read(before_lease, 20)
    ready = drain(r0)
    assert ready.reads == [] and msgs(ready.send, RRequest) == []  # no lease: no answer
    r0.step(LeaseGrant(src=1, view=0, request=0), 30)
    r0.tick(40)
    assert drain(r0).reads == []  # leased now, but slot 0 has not executed
    first, second = _read(21, "b"), _read(22)
    r0.read(first, 50)
    r0.read(second, 50)  # no keys: the last slot overall (0) serves this turn's reads
    assert drain(r0).reads == []
    r0.step(ccommit(1, 1, 0, (A,)), 60)
    assert drain(r0).reads == []  # C[1][0] chosen, but r0 has not learnt that O[0] is
    r0.step(ocommit(1, (0, 1)), 70)
    ready = drain(r0)
    assert [e.command for e in ready.apply] == [A]
    assert sorted(c.client_id for c in ready.reads) == [20, 21, 22]


def test_own_proposals_a_peers_snapshot_covers_fail_indefinitely_instead_of_crashing() -> None:
    # a straggler proposes, falls behind, and catches up by installing a peer's snapshot that
    # already executed its instance: the outcome is in the snapshot, not here (a benchmark's
    # straggler replica crashed with KeyError on the next OCommit)
    r1 = core(3, 1)
    mine, theirs = cmd(20, 0), cmd(30, 0)
    r1.propose(mine, 0)
    drain(r1)
    records = r1.install_snapshot(SnapshotMeta(slot=2, exec_counts=(1, 1, 0)))
    assert records  # the rewritten log still holds the view and what is left
    ready = drain(r1)
    assert [(f.command, f.definite) for f in ready.failed] == [(mine, False)]
    # the protocol goes on: later orders, commits and timers find nothing stale
    r1.step(caccept(0, 0, 1, (theirs,)), 10)
    r1.step(ccommit(0, 0, 1, (theirs,)), 10)
    r1.step(ocommit(0, (2, 0)), 10)
    r1.tick(10_000_000)
    assert [e.command for e in drain(r1).apply] == [theirs]


# =========================================================================== compaction


def _compacted_at(me: int, owner: int) -> SDPaxosReplica:
    """A replica that executed ``owner``'s C[owner][0] in slot 0 and compacted it away."""
    r = core(3, me)
    r.step(caccept(owner, owner, 0, (A,)), 0)
    r.step(ccommit(owner, owner, 0, (A,)), 0)
    r.step(ocommit(0, (0, owner)), 0)
    assert [e.command for e in drain(r).apply] == [A]
    r.compact(r.snapshot_meta())
    drain(r)
    return r


def test_compacting_to_an_older_snapshot_keeps_executed_instances_for_peers_not_the_log() -> None:
    # The driver compacts to its previous snapshot, taking a new one at the execution frontier:
    # a restart begins at the new one, so the rewritten log holds nothing executed (rewriting
    # a whole interval of commands cost a loaded replica a fifth of its CPU), while a peer a
    # little behind still gets the executed instances from memory.
    r = core(3, 2)
    older = r.snapshot_meta()
    r.step(caccept(1, 1, 0, (A,)), 0)
    r.step(ccommit(1, 1, 0, (A,)), 0)
    r.step(ocommit(0, (0, 1)), 0)
    r.step(caccept(0, 0, 0, (C,)), 0)  # chosen, not yet ordered: the log must keep it
    assert [e.command for e in drain(r).apply] == [A]
    records = r.compact(older)
    assert [(x.owner, x.index) for x in records if isinstance(x, CAcceptedRecord)] == [(0, 0)]
    r.step(Catchup(src=0, view=0, slot=0), 1)
    sent = [m for _, m in all_out(drain(r)) if isinstance(m, CCommit)]
    assert [(m.owner, m.index, m.batch) for m in sent] == [(1, 0, (A,)), (0, 0, (C,))]
    # restarted from the new snapshot and those records, it is where it was
    again = SDPaxosReplica(r.config, 2, recovered=records, snapshot=r.snapshot_meta(),
                           rng=random.Random(0))
    assert again.executed_through() == r.executed_through()
    assert (0, 0) in again.c and (1, 0) not in again.c


def test_a_voter_that_compacted_what_the_candidate_asks_about_sends_its_snapshot() -> None:
    # a vote from slot 0 would report no value for slot 0, which is chosen: the candidate
    # could fill it with a no-op. The candidate gets the snapshot and asks again from there.
    r2 = _compacted_at(2, 1)
    later = 10 * r2.config.lease_us  # a restarted replica's vote is no longer held back
    r2.step(VRequest(src=1, view=1, from_slot=0), later)
    ready = drain(r2)
    assert all_out(ready) == []
    assert ready.snapshot_requests == [1]
    r2.step(VRequest(src=1, view=1, from_slot=1), later)
    (vote,) = [m for _, m in all_out(drain(r2)) if isinstance(m, Vote)]
    assert vote.executed == 1


def test_a_promise_never_hides_a_compacted_value_of_the_instances_it_covers() -> None:
    # C[1][0] was accepted and executed here, then compacted: promising from index 0 and
    # reporting nothing would let the recoverer choose a no-op over it
    r2 = _compacted_at(2, 1)
    r2.step(CPrepare(src=0, view=0, owner=1, from_index=0, ballot=ballot_of(1, 0)), 10)
    ready = drain(r2)
    assert all_out(ready) == [] and ready.persist == []
    assert ready.snapshot_requests == [0]
    r2.step(CPrepare(src=0, view=0, owner=1, from_index=1, ballot=ballot_of(1, 0)), 20)
    assert [type(m) for _, m in all_out(drain(r2))] == [CPromise]


def test_a_recovery_never_re_proposes_an_instance_executed_meanwhile() -> None:
    r2 = core(3, 2)
    r2.recovery.start_recovery(1, 0)  # C[1][0] looks stalled
    drain(r2)
    # meanwhile C[1][0] is decided and executed here, and compacted away
    r2.step(ccommit(1, 1, 0, (A,)), 1)
    r2.step(ocommit(0, (0, 1)), 1)
    assert [e.command for e in drain(r2).apply] == [A]
    r2.compact(r2.snapshot_meta())
    drain(r2)
    ballot = r2.recovery.recoveries[1].ballot
    r2.step(CPromise(src=0, view=0, owner=1, from_index=0, ballot=ballot, accepted=(),
                     high=0, through=EVERY_INDEX), 2)
    ready = drain(r2)
    assert msgs(ready.send, CAccept) + msgs(ready.send_after_persist, CAccept) == []
    assert not any(isinstance(r, CAcceptedRecord) for r in ready.persist)


def test_n5_acceptor_ignores_c_accepts_from_an_older_view() -> None:
    # With five replicas an owner's O-commit needs only the sequencer's OAccept. A voter of
    # view 1 that accepted the owner's view-0 proposal beyond the c_high it reported would let
    # the owner execute a slot view 1 gave to someone else.
    r3 = core(5, 3)
    r3.tick(0)
    r3.step(VRequest(src=1, view=1, from_slot=0), 10 * r3.config.lease_us)
    assert r3.view == 1
    drain(r3)
    r3.step(caccept(4, 4, 0, (A,), view=0), 1)
    assert drain(r3).is_empty()
    r3.step(caccept(4, 4, 0, (A,), view=1), 2)  # the owner caught up with view 1
    ack = CAck(src=3, view=1, owner=4, index=0, ballot=4)
    assert msgs(drain(r3).send_after_persist, CAck) == [(0, ack), (1, ack), (2, ack), (4, ack)]


def _n5_candidate_that_executed_two_slots(*, compact: bool) -> SDPaxosReplica:
    """Replica 1 of five executed slots 0 and 1 (replicas 2 and 3's first commands, ordered by
    view 0's sequencer), then stands for view 1 with one pre-vote from replica 2."""
    r1 = core(5, 1)
    r1.tick(0)
    for slot, (owner, command) in enumerate([(2, A), (3, C)]):
        r1.step(caccept(owner, owner, 0, (command,)), 0)
        r1.step(ccommit(owner, owner, 0, (command,)), 0)
        r1.step(ocommit(0, (slot, owner)), 0)
    assert [e.command for e in drain(r1).apply] == [A, C]
    if compact:
        r1.compact(r1.snapshot_meta())
        drain(r1)
    prevote, now = _silence_until_prevote(r1, 0)  # view 0's sequencer falls silent
    for src in (2, 3):
        r1.step(PreVoteReply(src=src, view=prevote.view, granted=True), now)
    (request,) = {m for _, m in all_out(drain(r1)) if isinstance(m, VRequest)}
    assert (request.view, request.from_slot) == (1, 2)
    return r1


def _vote_n5(src: int, executed: int) -> Vote:
    return Vote(src=src, view=1, accepted_view=0, accepted_from=0, executed=executed,
                entries=(), c_high=(-1, -1, 0, 0, -1))


def test_n5_new_view_re_proposes_what_the_candidate_executed_and_a_voter_did_not() -> None:
    # With five replicas slots 0-1 may be accepted by their owners and view 0's sequencer
    # only (committed on the OAccept alone). Replica 2 never executed them: unless the new
    # view makes a majority accept them, a later view elected without replicas 0 and 1 (and
    # without their owners) would hand them to someone else.
    r1 = _n5_candidate_that_executed_two_slots(compact=False)
    r1.step(_vote_n5(2, executed=0), 10_000_000)
    r1.step(_vote_n5(3, executed=2), 10_000_000)
    (new_view,) = {m for _, m in msgs(drain(r1).send_after_persist, NewView)}
    assert (new_view.start, new_view.owners[:2]) == (0, (2, 3))


def test_n5_new_view_gives_the_untraced_replica_no_more_slots_than_it_may_have_ready() -> None:
    """Figure 7 fills holes for the untraced replica m until it owns C[m] O-instances with no
    hole before the last: filling the hole in front of m's two slots from view 0 gave it a
    third, where its next proposal would land before every command ordered after the view
    change (N=5 seed 362: a read proposed after a write was acknowledged ran before it)."""
    r1 = _n5_candidate_that_executed_two_slots(compact=False)
    # voters 2 and 3 accepted m = 4's slots 3 and 4 from view 0; nobody has slot 2 (view 0's
    # sequencer, 0, gave it to someone and does not vote); m has two C-instances at most
    entries = (OVote(slot=3, owner=4, ballot=0), OVote(slot=4, owner=4, ballot=0))
    for src in (2, 3):
        r1.step(Vote(src=src, view=1, accepted_view=0, accepted_from=0, executed=2,
                     entries=entries, c_high=(-1, -1, 0, 0, 1)), 10_000_000)
    (new_view,) = {m for _, m in msgs(drain(r1).send_after_persist, NewView)}
    assert (new_view.start, new_view.owners) == (2, (4, 4, NO_CL))


def test_n5_candidate_sends_its_snapshot_to_a_voter_behind_its_compaction_point() -> None:
    r1 = _n5_candidate_that_executed_two_slots(compact=True)
    r1.step(_vote_n5(2, executed=0), 10_000_000)
    r1.step(_vote_n5(3, executed=2), 10_000_000)
    ready = drain(r1)
    assert msgs(ready.send_after_persist, NewView) == []
    assert ready.snapshot_requests == [2]
    r1.step(_vote_n5(4, executed=2), 10_000_000)  # a third vote from beyond it: elected
    (new_view,) = {m for _, m in msgs(drain(r1).send_after_persist, NewView)}
    assert new_view.start == 2


# =========================================================================== catch-up


def _executing_follower() -> SDPaxosReplica:
    r2 = core(3, 2)
    r2.tick(0)
    drain(r2)
    return r2


def _execute_slot(r: SDPaxosReplica, slot: int, now: int) -> None:
    command = cmd(40, slot)
    r.step(caccept(0, 0, slot, (command,)), now)
    r.step(ccommit(0, 0, slot, (command,)), now)
    r.step(ocommit(0, (slot, 0)), now)
    assert [e.command for e in drain(r).apply] == [command]


def _catchups(r: SDPaxosReplica, now: int) -> list[tuple[int, PeerMessage]]:
    r.tick(now)
    return [(to, m) for to, m in all_out(drain(r)) if isinstance(m, Catchup | CatchupMarkers)]


def test_a_replica_executing_a_little_behind_a_peer_does_not_ask_it_for_catch_up() -> None:
    # the normal state of a loaded cluster: asking re-fetched full batches already on their way
    r2 = _executing_follower()
    interval = r2.config.catchup_us // 10
    for slot in range(40):
        now = (slot + 1) * interval
        r2.step(Heartbeat(src=0, view=0, executed=slot + 5, lease_request=-1), now)
        _execute_slot(r2, slot, now)
        assert _catchups(r2, now) == [], slot


def test_a_replica_asks_when_far_behind_or_when_execution_stopped() -> None:
    r2 = _executing_follower()
    r2.step(Heartbeat(src=0, view=0, executed=CATCHUP_BATCH + 1, lease_request=-1), 1_000)
    assert _catchups(r2, 1_000) == [(0, CatchupMarkers(src=2, view=0, slot=0))]  # far behind
    r1 = _executing_follower()
    r1.step(Heartbeat(src=0, view=0, executed=3, lease_request=-1), 1_000)
    assert _catchups(r1, 1_000) == []
    stalled = 1_000 + r1.config.catchup_us
    assert _catchups(r1, stalled) == [(0, CatchupMarkers(src=2, view=0, slot=0))]  # stopped


def test_a_catch_up_answer_is_bounded_in_bytes() -> None:
    r0 = core(3, 0)
    op = b"x" * (64 << 10)
    for index in range(100):  # 6.4 MB of chosen, unexecuted C-instances of replica 1
        batch = (Command(client_id=41, seq=index, op=op),)
        r0.step(caccept(1, 1, index, batch), 0)
        r0.step(ccommit(1, 1, index, batch), 0)
    drain(r0)
    r0.step(Catchup(src=2, view=0, slot=0), 1)
    commits = [(to, m) for to, m in all_out(drain(r0)) if isinstance(m, CCommit)]
    assert 0 < len(commits) < 100
    assert sum(len(c.batch[0].op) for _, c in commits) <= CATCHUP_BYTES + len(op)


# =========================================================================== restart replay


def _restarted(r: SDPaxosReplica, records: list[Record]) -> tuple[SDPaxosReplica, Ready]:
    again = SDPaxosReplica(r.config, r.me, recovered=records, rng=random.Random(0))
    return again, drain(again)


def test_executing_writes_an_executed_record_that_needs_no_fsync() -> None:
    # Executed means chosen: the record lets a restart execute again from its own records.
    # It is written lazily (``Ready.log``): a turn that only executes costs no fsync.
    r = core(3, 2)
    r.step(caccept(1, 1, 0, (A,)), 0)
    accepted = drain(r).persist
    r.step(ccommit(1, 1, 0, None), 0)
    r.step(ocommit(0, (0, 1), (1, NO_CL)), 0)
    ready = drain(r)
    assert [e.command for e in ready.apply] == [A]
    assert ready.persist == []
    assert ready.log == [ExecutedRecord(start=0, owners=(1, NO_CL), ballots=(1, 0))]
    # restarted from those records it executes both slots again at once, with no peer
    again, first = _restarted(r, [*accepted, *ready.log])
    assert [(e.slot, e.command) for e in first.apply] == [(0, A)]
    assert again.executed_through() == 1 and again.committed_log() == r.committed_log()
    # and it never logs them twice
    assert first.log == []


def test_a_value_learned_from_a_commit_is_logged_before_its_executed_record() -> None:
    # C[1][0] reached us only in a commit (catch-up): our records lack it, so the executed
    # record alone could not be replayed. The value goes first, in the same lazy write.
    r = core(3, 2)
    r.step(ccommit(1, 1, 0, (A,)), 0)
    r.step(ocommit(0, (0, 1)), 0)
    ready = drain(r)
    assert ready.log == [
        CAcceptedRecord(owner=1, index=0, ballot=1, batch=(A,)),
        ExecutedRecord(start=0, owners=(1,), ballots=(1,)),
    ]
    _, first = _restarted(r, ready.log)
    assert [e.command for e in first.apply] == [A]


def test_replay_stops_where_the_records_lack_the_chosen_value() -> None:
    # A crash between two writes (or a value held at a lower ballot than the chosen one)
    # leaves a slot whose chosen value the records do not prove: execution stops there and
    # peers bring the rest, as without the record.
    r = core(3, 2)
    r.step(caccept(1, 1, 0, (A,)), 0)
    r.step(caccept(0, 0, 0, (B,)), 0)
    accepted = drain(r).persist
    r.step(ccommit(1, 1, 0, None), 0)
    r.step(ccommit(0, 0, 0, None), 0)
    r.step(ocommit(0, (0, 1), (1, 0)), 0)
    executed = drain(r).log
    assert [x for x in executed if isinstance(x, ExecutedRecord)] == [
        ExecutedRecord(start=0, owners=(1, 0), ballots=(1, 0))
    ]
    without_b = [x for x in accepted if not (isinstance(x, CAcceptedRecord) and x.owner == 0)]
    again, first = _restarted(r, [*without_b, *executed])
    assert [e.command for e in first.apply] == [A] and again.executed_through() == 0
    # a value accepted at a lower ballot than the chosen one proves nothing either
    chosen_higher = ExecutedRecord(start=0, owners=(1, 0), ballots=(1, ballot_of(1, 2)))
    again, first = _restarted(r, [*accepted, chosen_higher])
    assert [e.command for e in first.apply] == [A] and again.executed_through() == 0


def test_a_restarted_replica_votes_from_where_it_executed_not_from_its_snapshot() -> None:
    # The stall seen with real processes: restarted at its snapshot, a replica reported every
    # O-instance since in its vote (and a whole cluster restarted, every voter did). With
    # the replay its vote starts at what it executed before the crash.
    r = core(3, 2)
    records: list[Record] = []
    for index in range(50):
        r.step(caccept(1, 1, index, (cmd(1, index),)), 0)
        r.step(ccommit(1, 1, index, None), 0)
        r.step(ocommit(0, (index, 1)), 0)
        ready = drain(r)
        records += [*ready.persist, *ready.log]
    assert r.executed_through() == 49
    again, _ = _restarted(r, records)
    again.tick(0)
    later = 10 * r.config.lease_us  # a restarted replica's vote is no longer held back
    again.step(VRequest(src=1, view=1, from_slot=50), later)
    (vote,) = [m for _, m in all_out(drain(again)) if isinstance(m, Vote)]
    assert vote.executed == 50 and vote.entries == ()


# =========================================================================== paged promises


def test_a_promise_over_more_than_a_page_reports_on_a_page_and_says_how_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a promise reporting on every accepted instance was sized by the log: a restarted peer
    # decoded tens of thousands of votes (seconds on the event loop; past 65,536 none did)
    r2 = core(3, 2)
    batch = (cmd(1, 0),)
    per_vote = batch_size(batch)
    for index in range(10):
        r2.step(caccept(1, 1, index, batch), 0)
    drain(r2)
    monkeypatch.setattr(recovery_module, "PROMISE_PAGE_BYTES", 3 * per_vote)
    r2.step(CPrepare(src=0, view=0, owner=1, from_index=0, ballot=ballot_of(1, 0)), 1)
    (promise,) = [m for _, m in all_out(drain(r2)) if isinstance(m, CPromise)]
    assert [v.index for v in promise.accepted] == [0, 1, 2]
    assert (promise.through, promise.high) == (2, 9)
    r2.step(CPrepare(src=0, view=0, owner=1, from_index=8, ballot=ballot_of(1, 0)), 2)
    (rest,) = [m for _, m in all_out(drain(r2)) if isinstance(m, CPromise)]
    assert [v.index for v in rest.accepted] == [8, 9] and rest.through == EVERY_INDEX
    # one batch over the budget still goes, alone: a page always makes progress
    monkeypatch.setattr(recovery_module, "PROMISE_PAGE_BYTES", 1)
    r2.step(CPrepare(src=0, view=0, owner=1, from_index=4, ballot=ballot_of(1, 0)), 3)
    (single,) = [m for _, m in all_out(drain(r2)) if isinstance(m, CPromise)]
    assert [v.index for v in single.accepted] == [4] and single.through == 4


def test_a_recoverer_goes_no_further_than_the_shortest_page_then_asks_for_the_next() -> None:
    # Beyond a page an acceptor of the majority may hold a value (here C[1][3], which may be
    # chosen): a no-op there would be a second value. The recoverer proposes through the
    # page, then asks again from its end at the same ballot (the promises hold already).
    r0 = core(3, 0)
    r0.tick(0)
    r0.recovery.start_recovery(1, 0)
    (prepare,) = {m for _, m in all_out(drain(r0)) if isinstance(m, CPrepare)}
    batches = [(cmd(1, i),) for i in range(4)]
    page = CPromise(src=2, view=0, owner=1, from_index=0, ballot=prepare.ballot,
                    accepted=tuple(CVote(index=i, ballot=1, batch=batches[i]) for i in (0, 1)),
                    high=3, through=1)
    r0.step(page, 10)
    ready = drain(r0)
    proposed = {m.index: m.batch for _, m in msgs(ready.send_after_persist, CAccept)}
    assert proposed == {0: batches[0], 1: batches[1]}
    again = {m for _, m in all_out(ready) if isinstance(m, CPrepare)}
    assert again == {dataclasses.replace(prepare, from_index=2)}
    # a late answer to the first page counts for nothing on the second
    r0.step(dataclasses.replace(page, src=1), 11)
    assert msgs(drain(r0).send_after_persist, CAccept) == []
    rest = CPromise(src=2, view=0, owner=1, from_index=2, ballot=prepare.ballot,
                    accepted=(CVote(index=3, ballot=1, batch=batches[3]),), high=3,
                    through=EVERY_INDEX)
    r0.step(rest, 12)
    proposed = {m.index: m.batch for _, m in msgs(drain(r0).send_after_persist, CAccept)}
    assert proposed == {2: (), 3: batches[3]}


# =========================================================================== view-change span


def test_n5_candidate_leaves_out_a_voter_too_far_behind_and_waits_for_nearer_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Re-proposing from a voter thousands of slots behind made the NewView as big as the log
    # (past MAX_SLOTS no peer could decode it): such a voter catches up under the new view.
    monkeypatch.setattr(view_change_module, "VIEW_SPAN", 1)
    r1 = _n5_candidate_that_executed_two_slots(compact=False)
    r1.step(_vote_n5(2, executed=0), 10_000_000)  # two slots behind: over the span
    r1.step(_vote_n5(3, executed=2), 10_000_000)
    assert msgs(drain(r1).send_after_persist, NewView) == []
    r1.step(_vote_n5(4, executed=1), 10_000_000)  # one behind: within it
    (new_view,) = {m for _, m in msgs(drain(r1).send_after_persist, NewView)}
    assert (new_view.start, new_view.owners[:1]) == (1, (3,))


def test_a_voter_does_not_vote_for_a_candidate_far_behind_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(view_change_module, "VIEW_SPAN", 2)
    r2 = core(3, 2)
    r2.tick(0)
    for index in range(4):
        r2.step(caccept(1, 1, index, (cmd(1, index),)), 0)
        r2.step(ccommit(1, 1, index, None), 0)
        r2.step(ocommit(0, (index, 1)), 0)
    drain(r2)
    assert r2.executed_through() == 3
    later = 10 * r2.config.lease_us
    r2.step(VRequest(src=1, view=1, from_slot=1), later)  # three behind
    ready = drain(r2)
    assert all_out(ready) == [] and r2.view == 0
    r2.step(VRequest(src=1, view=1, from_slot=2), later)  # two behind: within the span
    (vote,) = [m for _, m in all_out(drain(r2)) if isinstance(m, Vote)]
    assert [e.slot for e in vote.entries] == [2, 3]


def _fill_for_reference(m: int, needed: int, before: int, owners: list[int | None]) -> None:
    """Figure 7's loop as first written (fill the first hole, count again): quadratic."""
    while True:
        count = before
        last_needed = -1
        for position, owner in enumerate(owners):
            if owner == m:
                count += 1
                if count == needed:
                    last_needed = position
        if count >= needed and None not in owners[: max(last_needed, 0)]:
            break
        if None in owners:
            owners[owners.index(None)] = m
        else:
            owners.append(m)
    for position in range(last_needed + 1, len(owners)):
        if owners[position] == m:
            owners[position] = None


@pytest.mark.parametrize("seed", range(300))
def test_hole_filling_in_one_pass_matches_figure_7s_loop(seed: int) -> None:
    rng = random.Random(seed)
    m = 4
    owners = [rng.choice([None, None, m, 0, 1, NO_CL]) for _ in range(rng.randrange(12))]
    needed, before = rng.randrange(8), rng.randrange(4)
    expected = list(owners)
    _fill_for_reference(m, needed, before, expected)
    fill_for(m, needed, before, owners)
    assert owners == expected


def test_hole_filling_is_linear() -> None:
    # a vote naming 200,000 instances of the untraced replica: the old loop took minutes
    owners: list[int | None] = [None, 1] * 100_000
    fill_for(4, 200_000, 0, owners)
    assert owners.count(4) == 200_000 and None not in owners


def test_a_candidate_whose_new_view_would_not_fit_a_message_sends_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the encoder refuses a NewView of more than MAX_SLOTS owners (the replica would stop):
    # the candidacy is given up instead, and the election times out
    monkeypatch.setattr(view_change_module, "MAX_SLOTS", 3)
    r1 = _n5_candidate_that_executed_two_slots(compact=False)
    entries = tuple(OVote(slot=s, owner=3, ballot=0) for s in range(2, 8))
    for src in (2, 3):
        r1.step(Vote(src=src, view=1, accepted_view=0, accepted_from=0, executed=2,
                     entries=entries, c_high=(-1, -1, 0, 5, -1)), 10_000_000)
    assert msgs(drain(r1).send_after_persist, NewView) == []
    assert r1.too_wide_views == 1 and r1.role is Role.CANDIDATE
