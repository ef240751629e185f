"""Handler-level tests of the Mencius baseline (``consensus.protocol.mencius``)."""

from __future__ import annotations

import random

from util import Net, cmd, config, msgs, records_of, tick, turn

from consensus.messages import (
    Catchup,
    Command,
    MenciusAccept,
    MenciusAck,
    MenciusSkip,
    PaxosCommit,
    Record,
    SkipRecord,
    SlotAcceptedRecord,
)
from consensus.protocol.mencius import MAX_AHEAD, SKIP_RUN, MenciusReplica


def replica(me: int, n: int = 3, **changes: object) -> MenciusReplica:
    return MenciusReplica(config(n, **changes), me, rng=random.Random(me))


def accept(slot: int, *commands: int, skip: tuple[int, int] = (0, 0)) -> MenciusAccept:
    return MenciusAccept(
        src=slot % 3,
        view=0,
        slot=slot,
        ballot=slot % 3,
        batch=tuple(cmd(slot % 3, c) for c in commands),
        skip_start=skip[0],
        skip_stop=skip[1],
    )


# --------------------------------------------------------------------------- proposing


def test_each_replica_proposes_a_turn_s_commands_in_its_own_next_slot() -> None:
    r1 = replica(1)
    first = turn(r1, cmd(1, 1), cmd(1, 2))
    assert records_of(first, SlotAcceptedRecord) == [
        SlotAcceptedRecord(slot=1, ballot=1, batch=(cmd(1, 1), cmd(1, 2)))
    ]
    accepts = msgs(first.send_after_persist, MenciusAccept)
    assert [(to, m.slot, m.skip_start, m.skip_stop) for to, m in accepts] == [
        (0, 1, 0, 0),
        (2, 1, 0, 0),
    ]  # to every peer, not a bare majority: the skips need everyone's answer
    second = turn(r1, cmd(1, 3))
    assert [m.slot for _, m in msgs(second.send_after_persist, MenciusAccept)] == [4, 4]


def test_a_turn_of_large_commands_is_split_into_slots_by_bytes() -> None:
    r1 = replica(1, max_batch_bytes=2000)
    big = [Command(client_id=1, seq=s, op=b"x" * 1000) for s in range(3)]
    ready = turn(r1, *big)
    assert [(r.slot, r.batch) for r in records_of(ready, SlotAcceptedRecord)] == [
        (1, tuple(big[0:2])), (4, tuple(big[2:]))
    ]


def test_owner_commits_on_a_majority_but_is_ready_only_once_lower_slots_are_known() -> None:
    r2 = replica(2)
    turn(r2, cmd(1, 1))  # slot 2
    ready = turn(r2, MenciusAck(src=1, view=0, ballot=2, slots=(2,), skip_start=1, skip_stop=4))
    commits = dict(msgs(ready.send_after_persist, PaxosCommit))
    assert commits[1].batch is None and commits[0].batch is None  # both had the Accept
    # slot 2 is chosen, but replica 0 may still put a later command in slot 0
    assert ready.ready == [] and ready.executions() == []
    ready = turn(r2, MenciusSkip(src=0, view=0, skip_start=0, skip_stop=3))
    assert ready.ready == [cmd(1, 1)]
    assert [(e.slot, e.led_here) for e in ready.executions()] == [(2, True)]
    assert r2.committed_log() == {0: (), 1: (), 2: (cmd(1, 1),)}


# --------------------------------------------------------------------------- skipping


def test_a_higher_accept_makes_a_replica_skip_and_piggyback_the_skip_on_its_ack() -> None:
    r1 = replica(1)
    ready = turn(r1, accept(6, 1))
    assert records_of(ready, SkipRecord) == [SkipRecord(start=1, stop=7)]  # slots 1 and 4
    acks = msgs(ready.send_after_persist, MenciusAck)
    assert acks == [(0, MenciusAck(src=1, view=0, ballot=0, slots=(6,), skip_start=1, skip_stop=7))]
    # the replica that gets no ack this turn hears of the skip on its own
    assert msgs(ready.send_after_persist, MenciusSkip) == [
        (2, MenciusSkip(src=1, view=0, skip_start=1, skip_stop=7))
    ]
    # persist before the skip is announced: nothing about it leaves before the fsync
    assert msgs(ready.send, MenciusAck) == []
    assert msgs(ready.send, MenciusSkip) == []
    assert r1.committed_log() == {1: (), 4: ()}
    assert r1.next_own == 7


def test_the_next_accept_carries_the_skip_run_below_its_slot() -> None:
    r1 = replica(1)
    turn(r1, accept(6, 1))
    proposal = msgs(turn(r1, cmd(1, 9)).send_after_persist, MenciusAccept)
    assert {(m.slot, m.skip_start, m.skip_stop) for _, m in proposal} == {(7, 1, 7)}


def test_skips_are_learned_but_never_trigger_more_skips() -> None:
    r2 = replica(2)
    ready = turn(r2, MenciusSkip(src=0, view=0, skip_start=0, skip_stop=30))
    assert ready.persist == [] and ready.send_after_persist == []
    assert r2.next_own == 2
    assert set(r2.committed_log()) == set(range(0, 30, 3))


def test_a_commit_of_a_command_also_makes_a_replica_skip() -> None:
    r0 = replica(0)
    ready = turn(r0, PaxosCommit(src=2, view=0, slot=5, ballot=2, batch=(cmd(2, 1),)))
    assert records_of(ready, SkipRecord) == [SkipRecord(start=0, stop=6)]
    # a chosen no-op (a skip learned by catch-up) makes nobody skip
    r1 = replica(1)
    assert turn(r1, PaxosCommit(src=0, view=0, slot=9, ballot=0, batch=())).persist == []


def test_malformed_skips_and_accepts_are_ignored() -> None:
    r1 = replica(1)
    turn(r1, MenciusSkip(src=0, view=0, skip_start=1, skip_stop=4))  # not replica 0's slots
    turn(r1, MenciusSkip(src=0, view=0, skip_start=0, skip_stop=3 * SKIP_RUN + 3))  # too long
    assert r1.committed_log() == {}
    wrong_owner = MenciusAccept(
        src=2, view=0, slot=3, ballot=2, batch=(cmd(1, 1),), skip_start=0, skip_stop=0
    )
    assert turn(r1, wrong_owner).persist == []
    absurd = accept(3 * MAX_AHEAD, 1)  # would make us skip a million slots
    assert turn(r1, absurd).persist == [] and r1.next_own == 1


def test_catchup_makes_the_owner_give_up_the_slot_it_is_asked_for() -> None:
    r1 = replica(1)
    answer = turn(r1, Catchup(src=0, view=0, slot=1))
    assert records_of(answer, SkipRecord) == [SkipRecord(start=1, stop=4)]
    assert msgs(answer.send_after_persist, PaxosCommit) == [
        (0, PaxosCommit(src=1, view=0, slot=1, ballot=1, batch=()))
    ]


# --------------------------------------------------------------------------- together


def test_three_replicas_execute_the_same_order_with_no_ops_for_skipped_slots() -> None:
    net = Net(config(3), MenciusReplica)
    net.propose(2, cmd(2, 1))
    net.run()
    net.propose(0, cmd(0, 2))
    net.run()
    # replica 2's command in slot 2; 0 and 1 skip below it; then replica 0 uses slot 3
    for r in range(3):
        assert net.executed_ids(r) == [(2, 2, 1), (3, 0, 2)]
        assert net.cores[r].committed_log() == {
            0: (),
            1: (),
            2: (cmd(2, 1),),
            3: (cmd(0, 2),),
        }
    assert net.ready_cmds[2] == [cmd(2, 1)] and net.ready_cmds[0] == [cmd(0, 2)]
    assert [e.led_here for e in net.executed[2]] == [True, False]


def test_reads_are_ordered_in_the_reader_s_own_slot() -> None:
    net = Net(config(3), MenciusReplica)
    read = cmd(1, 5, blind=False)
    net.read(1, read)
    net.run()
    assert net.reads[1] == [read] and net.ready_cmds[1] == []
    assert net.executed_ids(0) == [(1, 1, 5)]


def test_lost_accept_is_retransmitted_to_the_replica_that_did_not_ack() -> None:
    r1 = replica(1)
    turn(r1, cmd(1, 1), now=0)  # slot 1
    turn(r1, MenciusAck(src=2, view=0, ballot=1, slots=(1,), skip_start=0, skip_stop=0), now=1)
    assert tick(r1, 50_000).send_after_persist == []
    # chosen, but it cannot execute before replica 0 (whose accept was lost) answers
    resent = msgs(tick(r1, 100_000).send_after_persist, MenciusAccept)
    assert [(to, m.slot) for to, m in resent] == [(0, 1)]
    late = turn(r1, MenciusAck(src=0, view=0, ballot=1, slots=(1,), skip_start=0, skip_stop=3))
    assert [e.slot for e in late.executions()] == [1] and late.ready == [cmd(1, 1)]
    assert msgs(tick(r1, 300_000).send_after_persist, MenciusAccept) == []


def test_a_lost_ack_with_a_skip_is_repaired_by_the_retransmitted_accept() -> None:
    dropped = False

    def drop_first_ack(src: int, dst: int, msg: object) -> bool:
        nonlocal dropped
        if isinstance(msg, MenciusAck) and src == 1 and not dropped:
            dropped = True
            return True
        return False

    net = Net(config(3), MenciusReplica)
    net.lose = drop_first_ack
    net.propose(2, cmd(2, 1))
    net.run()
    assert net.executed_ids(2) == []  # replica 1's skip of slot 1 was lost with its ack
    net.tick_all(100_000)  # the accept goes to 1 again; its ack re-carries the skip run
    assert net.executed_ids(2) == [(2, 2, 1)]
    assert "1->2 MenciusAck" in net.sent


def test_a_stuck_replica_catches_up_from_the_owner_of_the_slot_it_waits_for() -> None:
    net = Net(config(3), MenciusReplica)
    net.lose = lambda src, dst, msg: src == 0 and dst == 2 and isinstance(msg, MenciusSkip)
    net.propose(1, cmd(1, 1))
    net.run()
    assert net.executed_ids(2) == []  # waits on replica 0's skip of slot 0
    net.lose = lambda src, dst, msg: False
    net.tick_all(10_000)
    net.tick_all(200_000)  # no progress for catchup_us: ask replica 0 for the commits
    assert "2->0 CatchupMarkers" in net.sent and "2->0 Catchup" not in net.sent
    assert net.executed_ids(2) == []  # slot 0's commit names a skip it never saw
    net.tick_all(210_000)  # so it asks for the values at once
    assert "2->0 Catchup" in net.sent
    assert net.executed_ids(2) == [(1, 1, 1)]


# --------------------------------------------------------------------------- recovery


def test_restart_recovers_the_next_own_slot_skips_and_unfinished_proposals() -> None:
    records: list[Record] = [
        SlotAcceptedRecord(slot=1, ballot=1, batch=(cmd(1, 1),)),
        SkipRecord(start=4, stop=10),
        SlotAcceptedRecord(slot=3, ballot=0, batch=(cmd(0, 2),)),
    ]
    r1 = MenciusReplica(config(3), 1, recovered=records, rng=random.Random(1))
    assert r1.next_own == 10
    assert r1.committed_log() == {4: (), 7: ()}
    resent = msgs(tick(r1, 1).send_after_persist, MenciusAccept)
    assert {(m.slot, m.skip_start, m.skip_stop) for _, m in resent} == {(1, 0, 0)}
    assert sorted(r1.durable_records(), key=repr) == sorted(records, key=repr)


def test_snapshot_install_moves_the_next_own_slot_past_it() -> None:
    r1 = replica(1)
    meta = r1.snapshot_meta().__class__(12, (0, 0, 0))
    assert r1.install_snapshot(meta) == []
    assert r1.executed_through() == 11 and r1.next_own == 13
    assert msgs(turn(r1, cmd(1, 1)).send_after_persist, MenciusAccept)[0][1].slot == 13
