"""Restart (restart.py): replaying the durable records, and what a restarted replica votes.
"""

from __future__ import annotations

from util import cmd, core, drain

from consensus.messages import (
    EVERY_INDEX,
    CAccept,
    CAcceptedRecord,
    CPrepare,
    CPromise,
    CVote,
    ExecutedRecord,
    Record,
    ReserveRecord,
    Vote,
    VRequest,
)
from consensus.protocol.ballot import ballot_of

from .builders import A, B, C, all_out, caccept, ccommit, ocommit, restarted

# =========================================================================== replay


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
    again, first = restarted(r, [*without_b, *executed])
    assert [e.command for e in first.executions()] == [A] and again.executed_through() == 0
    # a value accepted at a lower ballot than the chosen one proves nothing either
    chosen_higher = ExecutedRecord(start=0, owners=(1, 0), ballots=(1, ballot_of(1, 2)))
    again, first = restarted(r, [*accepted, chosen_higher])
    assert [e.command for e in first.executions()] == [A] and again.executed_through() == 0


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
    again, _ = restarted(r, records)
    again.tick(0)
    later = 10 * r.config.lease_us  # a restarted replica's vote is no longer held back
    again.step(VRequest(src=1, view=1, from_slot=50), later)
    (vote,) = [m for _, m in all_out(drain(again)) if isinstance(m, Vote)]
    assert vote.executed == 50 and vote.entries == ()


# =========================================================================== reservations


def test_a_restart_never_proposes_at_an_index_its_early_accept_may_have_named() -> None:
    """Replica 1's CAccept for index 1 left before its record of it was durable (reserved
    ahead), and it crashed before the fsync: restarted from what was durable, it proposes past
    the reservation, and its own recovery decides the indexes its records lack — with the
    value the accept left where an acceptor reports it, a no-op where nobody does."""
    r = core(3, 1)
    r.propose(A, 0)
    first = drain(r)  # index 0, after its fsync; reserves below 3
    assert ReserveRecord(below=3) in first.persist
    r.propose(B, 0)
    second = drain(r)  # index 1: its CAccept leaves at once ...
    early = [m for _, m in all_out(second) if isinstance(m, CAccept)]
    assert {(m.index, m.batch) for m in early} == {(1, (B,))}
    assert [o.message for o in second.send if isinstance(o.message, CAccept)] == early[:2]
    # ... and the crash loses the turn's record of it
    again, _ = restarted(r, list(first.persist))
    assert again.c_store.next_index == 3 and again.c_store.gap == (1, 3)
    again.propose(C, 1)
    proposed = [x for x in drain(again).persist if isinstance(x, CAcceptedRecord)]
    assert [(x.index, x.batch) for x in proposed] == [(3, (C,))]  # never 1 or 2
    # caught up: our own recovery covers the gap (and what we proposed since)
    again.tick(2)
    (prepare,) = {m for _, m in all_out(drain(again)) if isinstance(m, CPrepare)}
    assert (prepare.owner, prepare.from_index) == (1, 1)
    again.step(CPromise(src=0, view=0, owner=1, from_index=1, ballot=prepare.ballot,
                        accepted=(CVote(index=1, ballot=1, batch=(B,)),), high=1,
                        through=EVERY_INDEX), 3)
    recovered = {(m.index, m.batch) for _, m in all_out(drain(again)) if isinstance(m, CAccept)}
    assert recovered == {(1, (B,)), (2, ()), (3, (C,))}
    assert again.c_store.gap is None
