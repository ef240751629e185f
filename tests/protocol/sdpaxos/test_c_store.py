"""The C-instance store (c_store.py), alone: its writers and the invariants its header states.

Replica 1 of three throughout (ballot ``b`` is replica ``b % BALLOT_STRIDE``'s).
"""

from __future__ import annotations

import pytest

from consensus.errors import InvariantViolation
from consensus.messages import CAcceptedRecord
from consensus.protocol.ballot import BALLOT_STRIDE, ballot_of
from consensus.protocol.sdpaxos.c_store import CStore
from consensus.protocol.sdpaxos.instances import NO_BALLOT, NO_INDEX

from .builders import A, B

ME = 1


def store(*, checking: bool = True) -> CStore:
    return CStore(3, ME, checking=checking)


# =========================================================================== own indexes


def test_fresh_indexes_count_up_and_never_come_back() -> None:
    s = store()
    assert [s.take_index() for _ in range(3)] == [0, 1, 2]
    s.used(2)  # below next_index: nothing moves
    assert s.next_index == 3
    s.used(7)
    assert s.take_index() == 7


def test_an_own_index_a_recoverer_used_or_decided_is_never_handed_out() -> None:
    s = store()
    s.accept(ME, 4, ballot_of(1, 2), ())  # a recoverer's no-op at our index 4
    assert s.next_index == 5
    inst = s.learn(ME, 6, ballot_of(1, 2), (A,))  # learned from a commit: not accepted ...
    assert s.next_index == 5 and s.high[ME] == 4
    s.choose(ME, 6, inst)  # ... decided: used
    assert s.take_index() == 7


def test_an_index_handed_out_while_held_is_a_violation() -> None:
    s = store()
    s.accept(ME, 0, ME, (A,))
    s.next_index = 0  # (white box: a broken writer)
    with pytest.raises(InvariantViolation, match="own index 0 handed out while held"):
        s.take_index()


def test_a_turn_that_took_indexes_reserves_twice_as_many_ahead() -> None:
    s = store()
    assert s.reserve() is None  # took nothing: no record
    s.take_index()
    assert s.reserve() == 3  # next index 1, plus twice the one taken
    assert not s.sendable_early(0) and not s.sendable_early(1)  # not durable yet
    s.handed_out()
    s.synced()
    assert s.reserved_durable == 3 and s.sendable_early(2) and not s.sendable_early(3)
    s.take_index()
    assert s.reserve() is None  # 1 taken, 3 > next index 2 + 1: enough left
    s.take_index()
    assert s.reserve() == 5  # next index 3, nothing spare: a record again
    for _ in range(3):
        s.take_index()
    assert s.reserve() == 12  # three in one turn: six ahead of the next index 6
    s.check()


def test_a_reservation_is_durable_only_once_the_turn_that_wrote_it_is() -> None:
    s = store()
    s.take_index()
    s.reserve()
    s.handed_out()  # the turn with the record was handed out ...
    s.take_index()
    s.reserve()  # ... (the next one writes another, not handed out yet)
    s.synced()  # ... and made durable: only the first reservation is
    assert (s.reserved_durable, s.reserved) == (3, 3)


def test_a_restart_starts_past_its_reservation_and_notes_the_gap() -> None:
    s = store()
    s.restore(CAcceptedRecord(owner=ME, index=0, ballot=ME, batch=(A,)))
    s.restore_reservation(5)
    assert s.next_index == 5 and s.reserved_durable == 5 and s.sendable_early(4)
    s.note_gap(1)  # the records hold index 0 only: 1..4 may have been named
    assert s.gap == (1, 5)
    s.end_gap()
    s.note_gap(5)
    assert s.gap is None
    s.check()


def test_a_durable_reservation_past_the_reservation_is_a_violation() -> None:
    s = store()
    s.reserved_durable = 4  # (white box: a broken writer)
    with pytest.raises(InvariantViolation, match="durable reservation 4 past"):
        s.check()


# =========================================================================== values


def test_accept_keeps_the_highest_index_per_owner() -> None:
    s = store()
    assert s.high == [NO_INDEX] * 3
    s.accept(2, 3, 2, (A,))
    s.accept(2, 1, 2, (B,))
    assert s.high == [NO_INDEX, NO_INDEX, 3]
    assert s[(2, 1)].batch == (B,) and (2, 2) not in s and len(s) == 2


def test_a_chosen_value_never_changes() -> None:
    s = store()
    inst = s.accept(2, 0, 2, (A,))
    s.choose(2, 0, inst)
    with pytest.raises(InvariantViolation, match="is chosen"):
        s.accept(2, 0, ballot_of(1, 0), ())
    with pytest.raises(InvariantViolation, match="is chosen"):
        s.learn(2, 0, 2, (B,))
    assert inst.batch == (A,) and inst.committed


def test_nothing_is_chosen_without_a_value() -> None:
    s = store()
    held = s.hold(s.take_index(), now=5)
    with pytest.raises(InvariantViolation, match="chosen without a value"):
        s.choose(ME, 0, held)


def test_an_accepted_ballot_never_goes_down() -> None:
    s = store()
    s.accept(2, 0, ballot_of(2, 0), (A,))
    with pytest.raises(InvariantViolation, match="accepted at ballot"):
        s.accept(2, 0, ballot_of(1, 0), (B,))


def test_learning_the_chosen_ballot_may_lower_it() -> None:
    # we accepted the chosen value again at a higher ballot; the commit names the chosen one
    s = store()
    s.accept(2, 0, ballot_of(2, 0), (A,))
    inst = s.learn(2, 0, 2, (A,))
    assert inst.ballot == 2 and s.values_to_log == {(2, 0)}
    assert s.take_value_to_log((2, 0)) and not s.take_value_to_log((2, 0))


def test_a_held_index_accepts_its_recovery_proposal() -> None:
    s = store()
    index = s.take_index()
    held = s.hold(index, now=5)
    assert held.held and (held.ballot, held.batch, held.overtaken_at) == (NO_BALLOT, None, 5)
    assert s.high[ME] == NO_INDEX  # nothing accepted yet
    with pytest.raises(InvariantViolation, match="held while it holds a value"):
        s.hold(index, now=6)
    s.accept(ME, index, ballot_of(1, ME), (A,))
    assert s[(ME, index)] is held and held.batch == (A,) and s.high[ME] == index
    assert not held.held


# =========================================================================== ballots, promises


def test_a_recovery_ballot_is_ours_and_above_every_ballot_seen() -> None:
    s = store()
    s.see_ballot(ballot_of(3, 2))
    s.see_ballot(ballot_of(1, 0))  # lower: nothing moves
    ballot = s.new_ballot()
    assert ballot == ballot_of(4, ME) and s.ballot_seen == ballot


def test_promises_cover_from_their_index_and_never_go_down() -> None:
    s = store()
    assert s.promised_ballot(2, 5) == NO_BALLOT
    s.promise(2, ballot_of(1, 0), 3)
    assert s.promised_ballot(2, 2) == NO_BALLOT and s.promised_ballot(2, 3) == ballot_of(1, 0)
    s.promise(2, ballot_of(1, 0), 1)  # the same ballot over more indexes
    assert s.promised_ballot(2, 1) == ballot_of(1, 0)
    with pytest.raises(InvariantViolation, match="promise for 2 lowered"):
        s.promise(2, ballot_of(0, 0), 1)


def test_our_ballot_only_grows_and_stays_ours() -> None:
    s = store()
    assert s.own_ballot == ME
    s.raise_own_ballot(ballot_of(2, ME))
    s.raise_own_ballot(ballot_of(1, ME))
    assert s.own_ballot == ballot_of(2, ME)
    with pytest.raises(InvariantViolation, match="is not replica 1's"):
        s.raise_own_ballot(ballot_of(3, 2))


# =========================================================================== restart, compaction


def test_a_restart_keeps_the_highest_ballot_and_never_reuses_an_index() -> None:
    s = store()
    s.restore(CAcceptedRecord(owner=ME, index=2, ballot=ballot_of(1, 0), batch=()))
    s.restore(CAcceptedRecord(owner=ME, index=2, ballot=ME, batch=(A,)))  # older
    s.restore(CAcceptedRecord(owner=ME, index=0, ballot=ballot_of(2, ME), batch=(B,)))
    s.restore_promise(2, ballot_of(5, 0), 0)
    assert s[(ME, 2)].batch == () and s.next_index == 3
    assert s.own_ballot == ballot_of(2, ME)  # a recoverer's ballot is not ours
    assert s.ballot_seen == ballot_of(5, 0) and s.high[ME] == 2
    s.check()


def test_compaction_forgets_what_the_snapshot_covers() -> None:
    s = store()
    for owner, index in [(0, 0), (0, 1), (2, 0), (2, 5)]:
        s.learn(owner, index, owner, (A,))
    # slots 0 and 1 placed C[0][0] and C[2][0]: the counts at slot 2 are (1, 0, 1)
    s.compact({0: (0, 0), 1: (2, 0)}, counts=(1, 0, 1))
    assert sorted(s) == [(0, 1), (2, 5)]
    assert s.values_to_log == {(0, 1), (2, 5)}
    s.check()


# =========================================================================== the switch


def test_without_checks_a_broken_writer_goes_unnoticed() -> None:
    # a replica process: the checks cost one test of a flag, and catch nothing
    s = store(checking=False)
    inst = s.accept(2, 0, 2, (A,))
    s.choose(2, 0, inst)
    s.accept(2, 0, BALLOT_STRIDE, (B,))
    assert inst.batch == (B,)


def test_the_whole_store_check_finds_a_broken_state() -> None:
    s = store()
    s.accept(ME, 3, ME, (A,))
    s.check()
    s.next_index = 2  # (white box)
    with pytest.raises(InvariantViolation, match="at or past next_index"):
        s.check()
