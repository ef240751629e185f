"""Ordering, the acceptors' and learners' side (o_acceptor.py, §3.2, Figure 5 lines 21-40):
learning a slot chosen from the acknowledgements, and O-phase messages of an older view.
"""

from __future__ import annotations

from util import core, drain

from consensus.messages import OAck

from .builders import A, B, caccept, cack, crequest, in_view_1, o_entries, oaccept, oack, ocommit

# =========================================================================== learning


def test_with_three_replicas_the_sequencer_learns_a_slot_from_one_acceptor() -> None:
    r0 = core(3, 0)
    r0.step(caccept(1, 1, 0, (A,)), 1)  # orders it: slot 0 => 1
    r0.step(cack(1, 1, 0), 1)  # 1's acceptance is durable: C[1][0] is chosen
    drain(r0)
    r0.step(OAck(src=2, view=0, slots=(0,)), 2)  # 2 accepted slot 0: with us, a majority
    assert [e.command for e in drain(r0).executions()] == [A]  # before the learner's OCommit


def test_with_five_replicas_a_replica_learns_a_slot_from_the_acceptors_oacks() -> None:
    r2 = core(5, 2)
    r2.step(caccept(1, 1, 0, (A,)), 1)
    r2.step(cack(1, 1, 0), 1)
    r2.step(cack(3, 1, 0), 1)  # C[1][0] chosen: 1, 2 and 3 accepted it
    r2.step(oack(3, 0), 1)  # an OAck overtaking the sequencer's OAccept: kept
    assert list(drain(r2).executions()) == []
    r2.step(oaccept((0, 1)), 2)  # the sequencer, we and 3 accepted slot 0: chosen
    assert [e.command for e in drain(r2).executions()] == [A]  # no OCommit from replica 1 needed
    r3 = core(5, 3)
    r3.step(caccept(1, 1, 0, (A,)), 1)
    r3.step(cack(1, 1, 0), 1)
    r3.step(cack(2, 1, 0), 1)
    r3.step(oaccept((0, 1)), 2)
    assert list(drain(r3).executions()) == []  # the sequencer and we: two of five
    r3.step(oack(4, 0), 3)
    assert [e.command for e in drain(r3).executions()] == [A]


# =========================================================================== views


def test_o_phase_messages_from_an_older_view_are_ignored() -> None:
    r2 = in_view_1(2)
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
