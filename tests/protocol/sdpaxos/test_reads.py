"""Linearizable reads through the sequencer (reads.py and the history table, §3.5).
"""

from __future__ import annotations

import pytest
from util import cmd, core, drain, msgs

from consensus.messages import Command, LeaseGrant, RReply, RRequest

from .builders import A, caccept, ccommit, ocommit

# =========================================================================== reads


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
    assert [e.command for e in ready.executions()] == [A]
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
    assert [e.command for e in ready.executions()] == [A]
    assert sorted(c.client_id for c in ready.reads) == [20, 21, 22]
