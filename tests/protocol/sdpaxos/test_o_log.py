"""The O-log (o_log.py), alone: assignments, what is chosen, the execution frontier, and the
invariants its header states.

Replica 1 of three throughout; view 0 unless a test says otherwise.
"""

from __future__ import annotations

import pytest

from consensus.errors import InvariantViolation
from consensus.messages import NO_CL, SEAL, OAcceptedRecord, OEntry
from consensus.protocol.sdpaxos.instances import NO_INDEX, NO_SLOT
from consensus.protocol.sdpaxos.o_log import OLog
from consensus.protocol.types import SnapshotMeta

ME = 1


def o_log(*, start_view: int = 0) -> OLog:
    return OLog(3, ME, start_view=start_view, checking=True)


def accepted(log: OLog, view: int, *owners: int) -> None:
    """Accept ``owners`` in slots 0, 1, ... at ``view`` and advance the prefix."""
    for slot, owner in enumerate(owners):
        log.accept(slot, owner, view)
    log.advance_prefix(view)


# =========================================================================== accepting


def test_accepting_raises_high_and_the_newest_view_accepted() -> None:
    log = o_log()
    log.accept(4, 2, 3)
    assert (log.high, log.accepted_view, log.accepted_from) == (5, 3, 4)
    log.accept(1, 0, 3)
    assert (log.high, log.accepted_view, log.accepted_from) == (5, 3, 4)
    log.check_all()


def test_the_prefix_counts_own_slots_accepted_in_the_current_view_only() -> None:
    log = o_log()
    accepted(log, 0, ME, 0, ME)
    log.accept(4, ME, 0)  # beyond a hole
    log.advance_prefix(0)
    assert (log.prefix, log.prefix_mine) == (3, 2)
    log.accept(3, 2, 0)
    log.advance_prefix(0)
    assert (log.prefix, log.prefix_mine) == (5, 3)
    log.check_all(view=0)


def test_an_entry_from_an_older_view_stops_the_prefix() -> None:
    log = o_log()
    log.accept(0, ME, 1)
    log.accept(1, ME, 0)
    log.advance_prefix(1)
    assert (log.prefix, log.prefix_mine) == (1, 1)


def test_one_value_per_slot_and_view() -> None:
    log = o_log()
    log.accept(0, ME, 0)
    log.accept(0, ME, 0)  # a duplicate: fine
    with pytest.raises(InvariantViolation, match="second owner in view 0"):
        log.accept(0, 2, 0)
    log.accept(0, 2, 1)  # a later view may replace it
    assert log.value[0] == 2


# =========================================================================== choosing


def test_a_commit_counts_once_and_never_for_an_executed_slot() -> None:
    log = o_log()
    accepted(log, 0, ME, 2)
    log.add_ack(0, 2)
    assert log.commit(0) and not log.commit(0)
    assert log.committed_mine == 1 and 0 not in log.acks
    log.execute(0, ME, 0, view=0)
    assert not log.commit(0) and log.committed_mine == 1 == log.exec_count[ME]
    log.check_all(view=0)


def test_a_learned_commit_is_not_an_acceptance() -> None:
    log = o_log()
    log.learn_commit(2, ME, view=0)
    assert log.value == {2: ME} and log.ballot == {} and log.high == 3
    assert log.committed == {2} and log.committed_mine == 1
    log.check_all()


def test_a_commit_replaces_a_value_of_an_older_view_never_one_of_the_current() -> None:
    log = o_log()
    log.accept(0, 2, 0)
    log.accept(1, 2, 1)
    log.learn_commit(0, ME, view=1)  # slot 0 was accepted in view 0: replaced
    log.learn_commit(1, ME, view=1)  # slot 1 in view 1: one proposer per view, kept
    assert log.value == {0: ME, 1: 2} and log.ballot == {1: 1}
    assert log.committed == {0}


# =========================================================================== views


def test_a_new_view_forgets_commits_and_the_prefix() -> None:
    log = o_log()
    accepted(log, 0, ME, ME)
    log.commit(0)
    log.forget_view()
    assert (log.committed, log.acks, log.committed_mine) == (set(), {}, 0)
    assert (log.prefix, log.prefix_mine) == (0, 0)


def test_a_new_view_log_replaces_what_is_not_executed() -> None:
    log = o_log()
    accepted(log, 0, ME, 2, 0, 2)
    log.learn_commit(5, ME, view=0)
    log.execute(0, ME, 0, view=0)
    # NewView of view 3 from slot 1: [noop, 0]; slots 3 and 5 (older views) go
    log.install_new_view(3, 1, (NO_CL, 0), current_view=3)
    assert log.value == {0: ME, 1: NO_CL, 2: 0}
    assert log.ballot == {0: 0, 1: 3, 2: 3}
    assert (log.committed, log.high, log.accepted_view, log.accepted_from) == (set(), 3, 3, 1)
    assert (log.prefix, log.prefix_mine) == (3, 1)
    # a replay of the same view never lowers where it started
    log.install_new_view(3, 0, (), current_view=3)
    assert log.accepted_from == 1
    log.commit_new_view(1, 3, view=3)
    assert log.committed == {1, 2}


# =========================================================================== executing


def test_execution_is_in_order_and_a_seal_ends_the_log() -> None:
    log = o_log()
    with pytest.raises(InvariantViolation, match="slot 1 executed at frontier 0"):
        log.execute(1, ME, 0, view=0)
    log.execute(0, NO_CL, NO_INDEX, view=0)
    log.execute(1, 2, 0, view=0)
    log.execute(2, SEAL, NO_INDEX, view=0)
    assert log.executed == {0: (NO_CL, NO_INDEX), 1: (2, 0), 2: (SEAL, NO_INDEX)}
    assert (log.exec_slot, log.exec_count, log.sealed_at) == (3, {0: 0, 1: 0, 2: 1}, 2)
    assert log.prefix == 3
    with pytest.raises(InvariantViolation, match="slot 1 accepted after it executed"):
        log.accept(1, ME, 0)
    log.check_all(view=0)


def test_a_broken_variant_may_end_the_log_without_a_seal() -> None:
    log = o_log()
    assert log.sealed_at == NO_SLOT
    log.end_at(7)
    assert log.sealed_at == 7


# =========================================================================== restart, snapshots


def test_a_restart_keeps_the_value_of_the_highest_view() -> None:
    log = o_log()
    log.restore_accepted(OAcceptedRecord(view=2, entries=(OEntry(slot=0, owner=2),)))
    log.restore_accepted(OAcceptedRecord(view=1, entries=(OEntry(slot=0, owner=0),
                                                          OEntry(slot=1, owner=ME))))
    assert log.value == {0: 2, 1: ME} and log.ballot == {0: 2, 1: 1}
    assert log.accepted_view == 2
    log.recount(view=2)
    assert (log.high, log.prefix, log.prefix_mine) == (2, 1, 0)


def test_compaction_forgets_below_the_snapshot_and_a_snapshot_moves_the_frontier() -> None:
    log = o_log()
    accepted(log, 0, ME, 2, 0)
    for slot in range(3):
        log.commit(slot)
    log.execute(0, ME, 0, view=0)
    log.execute(1, 2, 0, view=0)
    dropped = log.compact(SnapshotMeta(1, (0, 1, 0)))
    assert dropped == {0: (ME, 0)} and log.executed == {1: (2, 0)}
    assert (log.compacted, log.base_counts) == (1, {0: 0, 1: 1, 2: 0})
    log.check_all(view=0)
    # a peer's snapshot far ahead
    log.install_base(SnapshotMeta(10, (3, 4, 3)))
    dropped = log.compact(SnapshotMeta(10, (3, 4, 3)))
    assert dropped == {1: (2, 0)} and log.executed == {} and log.committed == set()
    assert (log.exec_slot, log.exec_count, log.prefix, log.high) == (10, {0: 3, 1: 4, 2: 3},
                                                                    10, 10)
    log.recount(view=0)
    log.check_all(view=0)


def test_the_whole_log_check_finds_a_broken_state() -> None:
    log = o_log()
    accepted(log, 0, ME)
    log.commit(0)
    log.committed_mine = 0  # (white box: a broken writer)
    with pytest.raises(InvariantViolation, match="committed_mine 0, counted 1"):
        log.check_all(view=0)
