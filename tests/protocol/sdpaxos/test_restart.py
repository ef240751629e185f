"""Restart (restart.py): replaying the durable records, and what a restarted replica votes.
"""

from __future__ import annotations

from util import cmd, core, drain

from consensus.messages import CAcceptedRecord, ExecutedRecord, Record, Vote, VRequest
from consensus.protocol.ballot import ballot_of

from .builders import A, B, all_out, caccept, ccommit, ocommit, restarted

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
