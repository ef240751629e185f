"""A learner that restarts goes on from what it had durably learned (issue 38 point 2).

A member that does not vote yet learns executed slots from a voter (``LearnReply``) and
applies them; it logs what it applied (``LearnedRecord``, with the configurations of the epochs
it started). Killed mid-learning and restarted from its records, it applies them again and
asks for the slots after them: it does not learn from slot 0 (or its last snapshot) again."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from consensus.config import ProtocolConfig
from consensus.messages import (
    Command,
    ConfigRecord,
    LearnedRecord,
    LearnedSlot,
    LearnReply,
    LearnRequest,
    Record,
)
from consensus.protocol.membership import MemberReplica
from consensus.protocol.membership.config import ADD, PROMOTE, REMOVE, Change, encode_change
from consensus.protocol.membership.replica import record_of
from consensus.protocol.ready import SlotBatch
from consensus.protocol.types import SnapshotMeta

CONFIG = ProtocolConfig(replicas=3)
LEARNER = 3


def learner(records: Sequence[Record] = (), snapshot: SnapshotMeta | None = None
            ) -> MemberReplica:
    return MemberReplica(CONFIG, LEARNER, recovered=records, rng=random.Random(7),
                         snapshot=snapshot, contacts=(0,))


def put(n: int) -> Command:
    return Command(client_id=1, seq=n, op=b"op-%d" % n, keys=("k",))


def reply(start: int, slots: list[LearnedSlot], executed: int) -> LearnReply:
    return LearnReply(src=0, view=0, start=start, executed=executed, slots=tuple(slots))


def plain(start: int, count: int) -> list[LearnedSlot]:
    return [LearnedSlot(seal=False, batch=(put(start + k),)) for k in range(count)]


def turn(member: MemberReplica, *messages: LearnReply, now: int = 0
         ) -> tuple[list[Command], list[Record], list[Any]]:
    """Step ``messages`` (and tick), take the Ready: (applied commands, persisted records,
    learn requests sent)."""
    for message in messages:
        member.step(message, now)
    member.tick(now)
    ready = member.ready()
    member.advance(ready)
    asked = [o.message for o in ready.send if isinstance(o.message, LearnRequest)]
    return [e.command for e in ready.executions()], list(ready.persist) + list(ready.log), asked


def test_a_restarted_learner_applies_its_records_and_asks_for_what_follows() -> None:
    member = learner()
    _, _, asked = turn(member, now=1)
    assert [r.slot for r in asked] == [0]  # a new learner starts at slot 0
    records: list[Record] = []
    applied, persisted, asked = turn(member, reply(0, plain(0, 256), 2000), now=2)
    assert applied == [put(k) for k in range(256)]
    assert persisted == [LearnedRecord(start=0, slots=tuple(plain(0, 256)))]
    assert [r.slot for r in asked] == [256]
    records += persisted
    _, persisted, _ = turn(member, reply(256, plain(256, 100), 2000), now=3)
    records += persisted

    # killed here (mid-learning: 356 of 2000 slots) and restarted from its records
    again = learner(records)
    applied, persisted, asked = turn(again, now=10**9)
    assert applied == [put(k) for k in range(356)]  # from its records, not from a voter
    assert persisted == []  # nothing logged twice
    assert [r.slot for r in asked] == [356] and again.exec_slot == 356


def test_a_restarted_learner_goes_on_from_its_snapshot_and_the_records_after_it() -> None:
    member = learner()
    turn(member, now=1)
    _, first, _ = turn(member, reply(0, plain(0, 100), 500), now=2)
    # a snapshot at slot 100 (the node rewrites the log: nothing of the learned slots stays)
    meta = member.snapshot_meta()
    assert meta.slot == 100 and member.durable_records() == []
    _, after, _ = turn(member, reply(100, plain(100, 50), 500), now=3)
    again = learner(after, snapshot=meta)
    applied, _, asked = turn(again, now=10**9)
    assert applied == [put(k) for k in range(100, 150)] and [r.slot for r in asked] == [150]
    # records the snapshot covers are skipped, if a log still holds them
    again = learner([*first, *after], snapshot=meta)
    applied, _, _ = turn(again, now=10**9)
    assert applied == [put(k) for k in range(100, 150)]


def change(kind: str, member: int) -> LearnedSlot:
    op = encode_change(Change(kind, member=member))
    return LearnedSlot(seal=False, batch=(Command(client_id=9, seq=member, op=op, keys=()),))


SEAL_SLOT = LearnedSlot(seal=True, batch=())


def test_a_learner_restarted_after_an_epoch_change_it_learned_resumes_in_the_next_epoch() -> None:
    # the log it learns: voter 2 removed (slot 5) and epoch 0 sealed (slot 6), then this
    # member added as a learner (slot 10)
    slots = [*plain(0, 5), change(REMOVE, 2), SEAL_SLOT, *plain(7, 3), change(ADD, LEARNER),
             *plain(11, 9)]
    member = learner()
    turn(member, now=1)
    records: list[Record] = []
    for start, batch in ((0, slots), (20, plain(20, 7))):
        _, persisted, _ = turn(member, reply(start, batch, 100), now=2 + start)
        records += persisted
    assert member.config.epoch == 1 and member.config.learners == (LEARNER,)
    assert member.exec_slot == 27
    # what it learned of epoch 0, then epoch 1's configuration, then what it learned after
    assert [type(r) for r in records] == [LearnedRecord, ConfigRecord, LearnedRecord]

    again = learner(records)
    applied, persisted, asked = turn(again, now=10**9)
    assert again.config == member.config and again.exec_slot == 27
    assert applied == [put(k) for k in (*range(5), *range(7, 10), *range(11, 27))]
    assert persisted == [] and [r.slot for r in asked] == [27]


def test_a_learner_killed_after_learning_its_promotion_resumes_as_the_new_voter() -> None:
    # it learns its own promotion and the SEAL: it votes from the next epoch on, once its
    # snapshot is durable; killed before it, the restart gets there from its records
    slots = [*plain(0, 3), change(ADD, LEARNER), *plain(4, 2), change(PROMOTE, LEARNER),
             SEAL_SLOT, *plain(8, 4)]
    member = learner()
    turn(member, now=1)
    ready_records: list[Record] = []
    member.step(reply(0, slots, 100), 2)
    ready = member.ready()
    member.advance(ready)
    ready_records += ready.persist
    assert ready.snapshot_now and member.exec_slot == 8  # the slots after the SEAL: the core's
    assert ready_records == [LearnedRecord(start=0, slots=tuple(slots[:8]))]

    again = learner(ready_records)
    ready = again.ready()
    again.advance(ready)
    assert ready.snapshot_now and again.exec_slot == 8 and not again.voting
    assert [e.command for e in ready.executions()] == [put(k) for k in (0, 1, 2, 4, 5)]
    assert again.durable_records()  # the snapshot taken: its core starts
    assert again.voting and again.config.voters == (0, 1, 2, LEARNER)


def test_a_change_inside_a_batch_leaves_the_runs_around_it_at_their_offsets() -> None:
    # the state machine gets the commands before and after the change (never the change
    # itself), each at its place in the slot
    [changed] = change(ADD, LEARNER).batch
    mixed = LearnedSlot(seal=False, batch=(put(0), put(1), changed, put(3)))
    member = learner()
    turn(member, now=1)
    member.step(reply(0, [mixed, *plain(1, 1)], 10), 2)
    ready = member.ready()
    member.advance(ready)
    assert ready.apply == [SlotBatch(0, 0, (put(0), put(1)), False),
                           SlotBatch(0, 3, (put(3),), False), SlotBatch(1, 0, (put(1),), False)]
    assert member.config.learners == (LEARNER,)


def _promoted_awaiting_its_core(unsafe: frozenset[str] = frozenset()) -> MemberReplica:
    """A learner that learned its own promotion and the SEAL: a voter of epoch 1 whose core
    starts once a snapshot of the epoch's base is durable (none taken yet)."""
    config = ProtocolConfig(replicas=3, unsafe=unsafe)
    member = MemberReplica(config, LEARNER, recovered=(), rng=random.Random(7), contacts=(0,))
    turn(member, now=1)
    slots = [*plain(0, 3), change(ADD, LEARNER), *plain(4, 2), change(PROMOTE, LEARNER),
             SEAL_SLOT, *plain(8, 4)]
    member.step(reply(0, slots, 100), 2)
    ready = member.ready()
    member.advance(ready)
    assert ready.snapshot_now and member.core is None  # awaiting its snapshot
    return member


def test_a_voters_core_started_from_a_peers_snapshot_is_not_started_again() -> None:
    # A peer's snapshot of epoch 1 arrives before the member took its own: its core starts
    # from it. The member's next snapshot must keep that core, with what it accepted since;
    # started again from nothing it forgot its votes and executed a slot a second time, with
    # another command (``stale_awaiting_core``, the broken variant: the simulator's sweeps
    # found it, LAN with snapshots every 10, N=3 seed 809 and N=5 seed 399 then; no seed of
    # 1-2,600 at three replicas or 1-800 at five catches it since a client sent on at the
    # heal counts its unanswered attempt, so this is its test).
    for unsafe, kept in ((frozenset(), True), (frozenset({"stale_awaiting_core"}), False)):
        member = _promoted_awaiting_its_core(unsafe)
        base = member.config.base
        meta = SnapshotMeta(base + 3, (0,) * len(member.config.voters), record_of(member.config))
        assert member.accepts_snapshot(meta)
        member.install_snapshot(meta)
        started = member.core
        assert started is not None and member.exec_slot == base + 3
        member.durable_records()  # the log rewritten at the member's own next snapshot
        assert (member.core is started) is kept
