"""The sequencer's history table alone (history.py, §3.5): the slot a read must wait for, later
than necessary at times, never earlier."""

from __future__ import annotations

from util import cmd

from consensus.messages import Command
from consensus.protocol.sdpaxos.history import PENDING_BATCHES, HistoryTable
from consensus.protocol.sdpaxos.instances import NO_SLOT

#: the last slot the sequencer assigned, what a read naming no key waits for
LAST = 50


def test_a_fresh_table_names_no_slot_for_a_keyed_read() -> None:
    assert HistoryTable().read_slot(("a",), LAST) == NO_SLOT


def test_a_read_waits_for_the_last_update_of_any_of_its_keys() -> None:
    table = HistoryTable()
    table.note_update(3, [cmd(1, 0, keys=("a", "b")), cmd(2, 0, keys=("c",))])
    table.note_update(7, [cmd(3, 0, keys=("a",))])
    assert table.read_slot(("a",), LAST) == 7
    assert table.read_slot(("b",), LAST) == 3
    assert table.read_slot(("b", "c"), LAST) == 3
    assert table.read_slot(("c", "a"), LAST) == 7
    assert table.read_slot(("d",), LAST) == NO_SLOT
    # a key seen in an earlier slot later does not move it back
    table.note_update(5, [cmd(4, 0, keys=("a",))])
    assert table.read_slot(("a",), LAST) == 7


def test_a_keyless_command_raises_the_floor_for_every_key() -> None:
    table = HistoryTable()
    table.note_update(2, [cmd(1, 0, keys=("a",))])
    table.note_update(4, [cmd(2, 0, keys=("b",)), cmd(3, 0), cmd(4, 0, keys=("c",))])
    assert table.floor == 4
    assert table.read_slot(("zzz",), LAST) == 4  # never named: still covered
    assert table.read_slot(("a",), LAST) == 4
    assert table.read_slot(("b",), LAST) == 4
    table.note_update(9, [cmd(5, 0, keys=("a",))])
    assert table.read_slot(("a",), LAST) == 9  # a later keyed update is later than the floor
    table.note_update(1, [cmd(6, 0)])  # an older keyless slot does not lower the floor
    assert table.floor == 4


def test_keys_named_by_a_request_count_at_their_slot() -> None:
    table = HistoryTable()
    table.note_keys(6, ("a", "b"))
    assert table.read_slot(("b",), LAST) == 6
    assert table.read_slot(("c",), LAST) == NO_SLOT


def test_an_instance_ordered_before_its_keys_were_known_counts_for_every_key() -> None:
    table = HistoryTable()
    table.note_update(2, [cmd(1, 0, keys=("a",))])
    table.note_unknown((1, 0), 5)
    table.note_unknown((2, 0), 3)
    assert table.read_slot(("a",), LAST) == 5
    assert table.read_slot(("never-named",), LAST) == 5
    table.learn_keys((1, 0), [cmd(1, 1, keys=("b",))])
    assert table.read_slot(("b",), LAST) == 5
    assert table.read_slot(("a",), LAST) == 3  # (2, 0) is still unknown
    table.learn_keys((2, 0), [cmd(2, 1, keys=("c",))])
    assert table.unknown == {}
    assert table.read_slot(("a",), LAST) == 2
    assert table.read_slot(("c",), LAST) == 3
    # learning the keys of an instance ordered with its keys known changes nothing
    table.learn_keys((3, 0), [cmd(3, 1, keys=("a",))])
    assert table.read_slot(("a",), LAST) == 2


def test_an_unknown_instance_learned_with_a_keyless_command_raises_the_floor() -> None:
    table = HistoryTable()
    table.note_unknown((1, 0), 8)
    table.learn_keys((1, 0), [cmd(1, 0)])
    assert table.floor == 8
    assert table.read_slot(("a",), LAST) == 8


def test_reset_forgets_the_history_and_sets_the_floor() -> None:
    table = HistoryTable()
    table.note_update(12, [cmd(1, 0, keys=("a",))])
    table.note_unknown((1, 0), 14)
    table.reset(10)  # a new sequencer: what it did not order counts as a write to every key
    assert (table.last, table.unknown, table.floor) == ({}, {}, 10)
    assert table.read_slot(("a",), LAST) == 10
    assert table.read_slot(("b",), LAST) == 10


def test_a_read_with_no_keys_waits_for_the_last_slot_assigned() -> None:
    table = HistoryTable()
    assert table.read_slot((), LAST) == LAST
    table.note_update(3, [cmd(1, 0, keys=("a",))])
    table.note_unknown((1, 0), 4)
    assert table.read_slot((), LAST) == LAST
    assert table.read_slot(iter(()), LAST) == LAST
    # keys may come as any iterable, read once
    assert table.read_slot(iter(["a"]), LAST) == 4


class _CountedBatch(list[Command]):
    """A batch that counts how often it is walked."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().__iter__()


def test_noted_batches_are_walked_once_and_only_when_a_read_asks() -> None:
    table = HistoryTable()
    _CountedBatch.walks = 0
    for slot in range(10):
        table.note_update(slot, _CountedBatch([cmd(1, slot, keys=(f"k{slot}",))]))
    assert _CountedBatch.walks == 0  # no read yet: nothing walked
    assert table.read_slot(("k3",), LAST) == 3
    assert table.read_slot(("k9",), LAST) == 9
    assert _CountedBatch.walks == 10  # each once, by the first read


def test_past_the_pending_bound_unwalked_slots_update_every_key() -> None:
    table = HistoryTable()
    table.note_update(0, [cmd(1, 0, keys=("a",))])
    assert table.read_slot(("a",), LAST) == 0
    for slot in range(1, PENDING_BATCHES + 2):  # one more than it holds
        table.note_update(slot, [cmd(1, slot, keys=("b",))])
    # forgotten: later than necessary for "a" and for a key never named, never earlier
    assert table.floor == PENDING_BATCHES + 1
    assert table.read_slot(("a",), LAST) == PENDING_BATCHES + 1
    assert table.read_slot(("never-named",), LAST) == PENDING_BATCHES + 1
