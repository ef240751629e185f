"""C-phase (c_phase.py, §3.2, Figure 5 lines 1-20): the command leader's proposals, batching,
thrifty quorums and commits; the acceptor's accept, reject and learn-without-the-leader rules;
C-phase messages across views; held proposals; retransmission and its adaptive timeout.
"""

from __future__ import annotations

import pytest
from util import Net, cmd, core, drain, msgs, records_of

from consensus.config import ProtocolConfig
from consensus.errors import LocalProtocolError
from consensus.messages import (
    EVERY_INDEX,
    CAccept,
    CAcceptedRecord,
    CAck,
    CCommit,
    CNack,
    Command,
    CPrepare,
    CPromise,
    CRequest,
    OAcceptedRecord,
    OAck,
    OEntry,
    ReserveRecord,
    VRequest,
)
from consensus.protocol.ballot import ballot_of
from consensus.protocol.ready import Execution

from .builders import (
    A,
    B,
    C,
    D,
    all_out,
    caccept,
    cack,
    ccommit,
    crequest,
    in_view_1,
    o_entries,
    oaccept,
    oack,
    ocommit,
)

# =========================================================================== leader


def test_proposal_at_non_sequencer_persists_then_sends_caccepts() -> None:
    # the first index is reserved by nothing durable yet: its CAccept waits for the fsync
    # that makes our record and the reservation of the next indexes durable
    r1 = core(3, 1)
    r1.propose(A, 0)
    ready = drain(r1)
    assert ready.persist == [CAcceptedRecord(owner=1, index=0, ballot=1, batch=(A,)),
                             ReserveRecord(below=3)]
    accept, ack = caccept(1, 1, 0, (A,)), cack(1, 1, 0)
    assert msgs(ready.send_after_persist) == [(0, accept), (0, ack), (2, accept), (2, ack)]
    assert ready.send == []  # the sequencer gets the CAccept: no CRequest (line 4)
    assert ready.ready == ready.executions() == ready.failed == []


def test_a_reserved_index_is_accepted_in_parallel_with_the_proposers_fsync() -> None:
    """Raft thesis §10.2.1: below a durable reservation the CAccept leaves before our own
    record is durable (``send``), and our own CAck once it is (``send_after_persist``): the
    acceptors count our acceptance from that only."""
    r1 = core(3, 1)
    r1.propose(A, 0)
    drain(r1)  # advanced: the reservation below 3 is durable
    r1.propose(B, 1)
    ready = drain(r1)
    assert ready.persist == [CAcceptedRecord(owner=1, index=1, ballot=1, batch=(B,))]
    accept = caccept(1, 1, 1, (B,))
    assert msgs(ready.send) == [(0, accept), (2, accept)]
    assert msgs(ready.send_after_persist) == [(0, cack(1, 1, 1)), (2, cack(1, 1, 1))]
    r1.propose(C, 2)
    ready = drain(r1)  # index 2 is the last reserved: the turn reserves ahead again
    assert ready.persist == [CAcceptedRecord(owner=1, index=2, ballot=1, batch=(C,)),
                             ReserveRecord(below=5)]
    assert msgs(ready.send, CAccept) == [(0, caccept(1, 1, 2, (C,))), (2, caccept(1, 1, 2, (C,)))]


def test_a_reservation_counts_once_the_turn_that_wrote_it_is_advanced() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    ready = r1.ready()  # handed out, not advanced: the reservation is not durable yet
    assert ReserveRecord(below=3) in ready.persist and r1.c_store.reserved_durable == 0
    with pytest.raises(LocalProtocolError, match="between ready"):
        r1.propose(B, 0)  # no input before advance
    r1.advance(ready)
    assert r1.c_store.reserved_durable == 3


def test_proposal_at_sequencer_starts_c_and_o_instance_together() -> None:
    r0 = core(3, 0)
    r0.propose(A, 0)
    ready = drain(r0)
    assert ready.persist == [
        CAcceptedRecord(owner=0, index=0, ballot=0, batch=(A,)),
        ReserveRecord(below=3),
        OAcceptedRecord(view=0, entries=(OEntry(slot=0, owner=0),)),
    ]
    accept, ack = caccept(0, 0, 0, (A,)), cack(0, 0, 0)
    order, own_oack = oaccept((0, 0)), oack(0, 0)
    assert msgs(ready.send_after_persist) == [
        (1, accept), (1, ack), (2, accept), (2, ack), (1, order), (1, own_oack), (2, order),
        (2, own_oack),
    ]
    assert ready.send == []  # nothing of ours was durable before this turn
    r0.propose(B, 1)
    ready = drain(r0)  # now both Accepts leave in parallel with our fsync, our acks after it
    assert msgs(ready.send) == [(1, caccept(0, 0, 1, (B,))), (2, caccept(0, 0, 1, (B,))),
                                (1, oaccept((1, 0))), (2, oaccept((1, 0)))]
    assert msgs(ready.send_after_persist) == [(1, cack(0, 0, 1)), (2, cack(0, 0, 1)),
                                              (1, oack(0, 1)), (2, oack(0, 1))]


def test_proposals_in_one_turn_form_one_c_instance() -> None:
    r1 = core(3, 1)
    for command in (A, B, C):
        r1.propose(command, 0)
    ready = drain(r1)
    assert records_of(ready, CAcceptedRecord) == [
        CAcceptedRecord(owner=1, index=0, ballot=1, batch=(A, B, C))
    ]
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
        ReserveRecord(below=9),  # twice the turn's three indexes past the next one
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
    assert msgs(ready.send_after_persist, CAccept) == [(2, caccept(1, 1, 0, (A,)))]
    assert msgs(ready.send_after_persist, CAck) == [(2, cack(1, 1, 0))]  # the same peers
    # a CRequest promises nothing: it is in ``send``
    assert msgs(ready.send) == [(0, crequest(1, 0))]
    # N=5, replica 1: nearest are 2 and 3
    r1 = core(5, 1, thrifty=True)
    r1.propose(A, 0)
    ready = drain(r1)
    accept = caccept(1, 1, 0, (A,))
    assert msgs(ready.send_after_persist, CAccept) == [(2, accept), (3, accept)]
    assert msgs(ready.send) == [(0, crequest(1, 0))]


def test_thrifty_sends_no_crequest_when_sequencer_is_in_quorum() -> None:
    r2 = core(3, 2, thrifty=True)  # nearest of 2 by id distance: 0, the sequencer
    r2.propose(A, 0)
    ready = drain(r2)
    assert msgs(ready.send_after_persist, CAccept) == [(0, caccept(2, 2, 0, (A,)))]
    assert ready.send == []
    r4 = core(5, 4, thrifty=True)  # nearest of 4: 0 and 1
    r4.propose(A, 0)
    ready = drain(r4)
    assert [to for to, _ in msgs(ready.send_after_persist, CAccept)] == [0, 1]
    assert ready.send == []


def test_thrifty_follows_configured_preference() -> None:
    r1 = core(5, 1, thrifty=True, preference=((1, 2, 3, 4), (4, 0, 2, 3), (0, 1, 3, 4),
                                              (0, 1, 2, 4), (0, 1, 2, 3)))
    r1.propose(A, 0)
    ready = drain(r1)
    assert [to for to, _ in msgs(ready.send_after_persist, CAccept)] == [4, 0]
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


# =========================================================================== acceptor


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


def test_with_three_replicas_an_acceptor_learns_a_choice_from_the_proposers_own_ack() -> None:
    r2 = core(3, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)  # it may have left before 1's acceptance was durable
    r2.step(oaccept((0, 1)), 1)  # so may this one, before the sequencer's
    ready = drain(r2)
    assert list(ready.executions()) == []  # neither counts from its Accept
    assert (0, OAck(src=2, view=0, slots=(0,))) in msgs(ready.send_after_persist)
    r2.step(cack(1, 1, 0), 2)  # 1's acceptance is durable: with ours, a majority
    r2.step(oack(0, 0), 2)  # the sequencer's is: slot 0 is chosen too
    assert [e.command for e in drain(r2).executions()] == [A]  # no CCommit, no OCommit needed
    r2 = core(5, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)
    r2.step(oaccept((0, 1)), 1)
    r2.step(cack(1, 1, 0), 2)
    assert list(drain(r2).executions()) == []  # two of five: not yet


def test_with_five_replicas_a_replica_learns_a_choice_from_the_acceptors_acks() -> None:
    r2 = core(5, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)  # proposer 1 and we accepted: two of five
    r2.step(ocommit(0, (0, 1)), 1)
    r2.step(cack(1, 1, 0), 1)  # the proposer's acceptance is durable
    ready = drain(r2)
    assert list(ready.executions()) == []
    ack = cack(2, 1, 0)
    assert msgs(ready.send_after_persist, CAck) == [(0, ack), (1, ack), (3, ack), (4, ack)]
    r2.step(cack(3, 1, 0), 2)  # a third acceptance of ballot 1: chosen, no CCommit needed
    assert [e.command for e in drain(r2).executions()] == [A]


# =========================================== commits an acceptor does not need (three replicas)


def _commits(net: Net) -> list[str]:
    return [m for m in net.sent if m.endswith((" CCommit", " OCommit"))]


def _executed(net: Net, replica: int) -> list[Command]:
    return [e.command for e in net.executed[replica]]


@pytest.mark.parametrize("replicas", [3, 5])
def test_with_three_replicas_no_commit_goes_to_an_acceptor_that_acknowledged(
    replicas: int,
) -> None:
    net = Net(ProtocolConfig(replicas=replicas))
    net.propose(0, A)  # at the sequencer: C[0][0] and slot 0 start together
    net.run()  # both acknowledgements reach 0 in one turn
    assert all(_executed(net, r) == [A] for r in range(replicas))
    if replicas == 3:
        # each acceptor learns both choices from 0's own CAck and OAck and its acceptances
        assert _commits(net) == []
    else:
        # with five an acceptor learns from acknowledgements on links 0 does not see
        assert _commits(net) == [f"0->{p} {kind}" for kind in ("CCommit", "OCommit")
                                 for p in range(1, 5)]


def test_commits_still_go_to_an_acceptor_whose_acks_came_after_the_choice() -> None:
    net = Net(ProtocolConfig(replicas=3))
    net.propose(0, A)  # at the sequencer: C[0][0] and slot 0
    net.deliver_together(net.matching("0", "1", "*"))
    net.deliver_together(net.matching("0", "2", "*"))
    late = net.matching("2", "0", "*")
    assert [type(f.message) for f in late] == [CAck, OAck]
    for flight in late:
        net.bag.remove(flight)  # 2's acknowledgements arrive after 1's chose both instances
    net.deliver_together(net.matching("1", "0", "*"))
    assert _commits(net) == ["0->2 CCommit", "0->2 OCommit"]
    net.bag.extend(late)
    net.run()
    assert _commits(net) == ["0->2 CCommit", "0->2 OCommit"]  # no more once 2's arrive
    assert all(_executed(net, r) == [A] for r in range(3))


def test_thrifty_three_replicas_commit_the_batch_to_the_peer_left_out_of_the_accept() -> None:
    r2 = core(3, 2, thrifty=True)
    r2.propose(A, 0)
    ready = drain(r2)
    (near,) = [to for to, _ in msgs(ready.send + ready.send_after_persist, CAccept)]
    (left_out,) = {0, 1} - {near}
    r2.step(cack(near, 2, 0), 1)
    # the acceptor learns from our own CAck; the other never heard of the instance
    assert msgs(drain(r2).send_after_persist, CCommit) == [(left_out, ccommit(2, 2, 0, (A,)))]


def test_a_learner_other_than_the_sequencer_commits_its_slot_to_everyone() -> None:
    # 1 learns its slot from the sequencer's OAck; 0's knowledge of it comes from 2's OAck
    # or 1's OCommit, on links 1 cannot tell apart: the OCommit goes to both
    net = Net(ProtocolConfig(replicas=3))
    net.propose(1, A)
    net.run()
    assert [m for m in _commits(net) if m.endswith("OCommit")] == [
        "1->0 OCommit", "1->2 OCommit"
    ]
    assert all(_executed(net, r) == [A] for r in range(3))


@pytest.mark.parametrize("how", ["lost", "restarted"])
def test_an_acceptor_that_missed_the_proposers_own_ack_learns_the_choice_by_catchup(
    how: str,
) -> None:
    # Liveness of the rule above: replica 1 accepted C[0][0] and slot 0 and acknowledged
    # both, so 0 commits neither to it; but 0's own CAck and OAck never reached 1 (lost, or
    # 1 restarted before they came, from its durable acceptances). 1 learns as when a commit
    # is lost: its execution stopped at slot 0, so after catchup_us it asks a peer for the
    # commit markers, and the answer (0's, or 2's: both executed slot 0) lets it execute.
    net = Net(ProtocolConfig(replicas=3))
    net.propose(0, A)
    own_acks = [f for f in net.matching("0", "1", "*") if isinstance(f.message, CAck | OAck)]
    assert len(own_acks) == 2
    for flight in own_acks:
        net.bag.remove(flight)
    net.run()
    assert _commits(net) == []
    assert _executed(net, 0) == _executed(net, 2) == [A]
    assert _executed(net, 1) == []  # it accepted both instances, and knows neither chosen
    if how == "restarted":
        net.restart(1)
        net.flush(1)
    asked = len(net.sent)
    # (restarted, it counts its stall from the first tick after the restart)
    periods = 2 if how == "restarted" else 1
    for period in range(1, periods + 1):
        net.tick_all(period * net.config.catchup_us)
    # markers suffice: it holds both values
    assert [m for m in net.sent[asked:] if "Catchup" in m] == ["1->0 CatchupMarkers"]
    assert _executed(net, 1) == [A]


def test_acks_that_overtake_the_accept_count_once_it_arrives() -> None:
    r2 = core(5, 2)
    r2.step(ocommit(0, (0, 1)), 1)
    r2.step(cack(3, 1, 0), 1)  # from acceptors nearer than the proposer
    r2.step(cack(4, 1, 0), 1)
    assert list(drain(r2).executions()) == []  # we lack the value
    r2.step(caccept(1, 1, 0, (A,)), 2)
    assert [e.command for e in drain(r2).executions()] == [A]


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
    assert list(drain(r2).executions()) == []
    r2.step(caccept(0, 1, 0, (B,), ballot=high), 3)  # now we accept it too: 0, 2, 3, 4
    assert [e.command for e in drain(r2).executions()] == [B]


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
    assert list(drain(r1).executions()) == []
    r1.step(cack(4, 1, 0, ballot=high), 3)
    assert list(drain(r1).executions()) == []  # B's proposer may not have it durably yet
    r1.step(cack(0, 1, 0, ballot=high), 3)  # recoverer 0, we and 4 accepted B: chosen
    ready = drain(r1)
    assert [e.command for e in ready.executions()] == [B]
    # failed, not definitely: a client retry may carry A in another replica's instance
    assert [(f.command, f.definite) for f in ready.failed] == [(A, False)]


def test_with_three_replicas_an_acceptor_acknowledges_to_the_proposer_only() -> None:
    r2 = core(3, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)
    assert msgs(drain(r2).send_after_persist, CAck) == [(1, cack(2, 1, 0))]


# ======================================================================== commits without the value


def test_ccommit_without_batch_needs_matching_ballot() -> None:
    r2 = core(5, 2)  # with three replicas accepting from the proposer would have chosen it
    r2.step(caccept(1, 1, 0, (A,)), 1)  # accepted at ballot (0, 1)
    drain(r2)
    r2.step(ocommit(1, (0, 1)), 2)
    assert drain(r2).executions() == []
    other = ballot_of(1, 0)  # chosen at a recoverer's ballot, perhaps with another value
    r2.step(ccommit(0, 1, 0, None, ballot=other), 3)
    assert drain(r2).executions() == []  # not applied: our value may not be the chosen one
    r2.step(ccommit(0, 1, 0, (B,), ballot=other), 4)
    assert drain(r2).executions() == [Execution(0, 0, B, False)]


def test_ccommit_without_batch_at_matching_ballot_applies() -> None:
    r2 = core(5, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)
    r2.step(ocommit(1, (0, 1)), 2)
    assert drain(r2).executions() == []
    r2.step(ccommit(1, 1, 0, None), 3)
    assert drain(r2).executions() == [Execution(0, 0, A, False)]


def test_ccommit_without_batch_for_unknown_instance_is_ignored() -> None:
    r2 = core(3, 2)
    r2.step(ccommit(1, 1, 0, None), 1)
    r2.step(ocommit(1, (0, 1)), 2)
    assert drain(r2).executions() == []


# ============================================ views (C-instances are ordered by ballots, not views)


def test_c_phase_messages_count_in_any_view() -> None:
    # C-instances are ordered by ballots, not views: an acknowledgement or a recovery's
    # promise that crossed a view change still counts (dropping it stalled failover)
    r2 = in_view_1(2)
    r2.propose(B, 1)  # C[2][0]
    drain(r2)
    r2.step(CAck(src=0, view=0, owner=2, index=0, ballot=2), 2)
    # chosen; 0 acknowledged it and learns from our own CAck: the commit goes to 1 only
    assert [to for to, _ in msgs(drain(r2).send_after_persist, CCommit)] == [1]
    r2.step(caccept(0, 0, 0, (A,), view=0), 3)
    assert msgs(drain(r2).send_after_persist, CAck) == [
        (0, CAck(src=2, view=1, owner=0, index=0, ballot=0))
    ]


def test_older_view_ccommit_is_still_a_fact() -> None:
    r2 = in_view_1(2)
    r2.step(ccommit(0, 0, 0, (A,), view=0), 1)  # a chosen value is a fact in any view
    assert drain(r2).is_empty()
    r2.step(ocommit(1, (0, 0), view=1), 2)  # slot 0 => 0 committed in view 1
    assert drain(r2).executions() == [Execution(0, 0, A, False)]


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


# ==================================================================== proposals held for a recovery


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
        if (inst := replica.c_store.get((1, 0))) is not None and inst.committed
    }
    assert len(chosen) == 1
    # the command is chosen there (replica 2's no-op was not), and runs everywhere
    assert [b for _, b in chosen] == [(C,)]
    for r in range(3):
        net.tick(r, 10_000_000)
    net.deliver_all()
    assert [[e.command for e in executed] for executed in net.executed] == [[C]] * 3


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
    r1.step(oack(0, 0), 1)
    assert drain(r1).ready == [A]
    r1.tick(500_000)
    ready = drain(r1)
    assert msgs(ready.send_after_persist, CAccept) == []
    assert msgs(ready.send, CRequest) == []
