"""Acknowledgement prefixes alone (tracker.py): per replica the gap-free prefix of slots it
acknowledged, and the prefix a majority acknowledged (the five-replica sequencer's rule)."""

from __future__ import annotations

from consensus.protocol.sdpaxos.tracker import AckPrefixes


def test_out_of_order_acknowledgements_fill_the_prefix_once_the_gap_closes() -> None:
    acks = AckPrefixes({0: 0, 1: 0, 2: 0})
    acks.record(1, 2)
    acks.record(1, 1)
    assert acks.prefix(1) == 0  # slot 0 is missing
    acks.record(1, 0)
    assert acks.prefix(1) == 3
    acks.record(1, 5)
    assert acks.prefix(1) == 3
    acks.record(1, 3)
    assert acks.prefix(1) == 4  # slot 4 is still missing
    acks.record(1, 4)
    assert acks.prefix(1) == 6
    assert (acks.prefix(0), acks.prefix(2)) == (0, 0)  # replicas are tracked apart


def test_duplicate_and_old_acknowledgements_change_nothing() -> None:
    acks = AckPrefixes({1: 0})
    for slot in (0, 1, 1, 0, 3, 3):
        acks.record(1, slot)
    assert acks.prefix(1) == 2
    acks.record(1, 0)  # below the prefix
    acks.record(1, 3)  # a duplicate beyond it
    assert acks.prefix(1) == 2
    acks.record(1, 2)
    assert acks.prefix(1) == 4


def test_prefixes_start_where_they_are_given() -> None:
    # a new sequencer starts from what the NewView's acceptors already hold
    acks = AckPrefixes({0: 10, 1: 7})
    acks.record(1, 3)  # old: ignored
    assert acks.prefix(1) == 7
    acks.record(1, 7)
    assert acks.prefix(1) == 8


def test_majority_prefix_of_three_counts_the_sequencer_as_having_everything() -> None:
    acks = AckPrefixes({0: 0, 1: 0, 2: 0})
    assert acks.majority_prefix(me=0, proposed=5, quorum=2) == 0
    for slot in range(3):
        acks.record(1, slot)
    assert acks.majority_prefix(me=0, proposed=5, quorum=2) == 3  # the sequencer and 1
    for slot in range(4):
        acks.record(2, slot)
    assert acks.majority_prefix(me=0, proposed=5, quorum=2) == 4  # the sequencer and 2


def test_the_sequencer_counts_what_it_proposed_not_what_it_acknowledged() -> None:
    acks = AckPrefixes({0: 0, 1: 0, 2: 0})
    for slot in range(6):
        acks.record(0, slot)
    for slot in range(3):
        acks.record(1, slot)
    acks.record(2, 0)
    assert acks.prefix(0) == 6
    # prefixes 0 (proposed), 3 and 1: two replicas acknowledged one slot
    assert acks.majority_prefix(me=0, proposed=0, quorum=2) == 1
    assert acks.majority_prefix(me=0, proposed=6, quorum=2) == 3


def test_majority_prefix_of_five_is_the_third_longest() -> None:
    acks = AckPrefixes({0: 0, 1: 2, 2: 7, 3: 4, 4: 0})
    # prefixes 10 (the sequencer), 7, 4, 2, 0: three replicas acknowledged 4 slots
    assert acks.majority_prefix(me=0, proposed=10, quorum=3) == 4
    acks.record(1, 2)
    acks.record(1, 3)
    acks.record(1, 4)
    assert acks.majority_prefix(me=0, proposed=10, quorum=3) == 5  # 10, 7, 5
    # the sequencer's prefix is what it proposed, however little
    assert acks.majority_prefix(me=0, proposed=1, quorum=3) == 4  # 7, 5, 4
