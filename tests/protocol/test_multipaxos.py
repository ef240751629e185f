"""Handler-level tests of the Multi-Paxos baseline (``consensus.protocol.multipaxos``)."""

from __future__ import annotations

import random

import pytest
from util import Net, cmd, config, msgs, records_of, tick, turn

from consensus.errors import ConfigError, LocalProtocolError
from consensus.messages import (
    Catchup,
    Command,
    Heartbeat,
    PaxosAccept,
    PaxosAck,
    PaxosCommit,
    PaxosForward,
    SlotAcceptedRecord,
)
from consensus.protocol.multipaxos import MultiPaxosReplica
from consensus.protocol.ready import Execution, SlotBatch
from consensus.protocol.slotlog import CATCHUP_BYTES


def replica(me: int = 0, n: int = 3, **changes: object) -> MultiPaxosReplica:
    return MultiPaxosReplica(config(n, **changes), me, rng=random.Random(me))


def accept(slot: int, *commands: int, src: int = 0) -> PaxosAccept:
    batch = tuple(cmd(1, c) for c in commands)
    return PaxosAccept(src=src, view=0, slot=slot, ballot=0, batch=batch)


# --------------------------------------------------------------------------- the leader


def test_leader_batches_a_turn_into_one_slot_and_persists_before_its_accepts_leave() -> None:
    leader = replica(0)
    ready = turn(leader, cmd(1, 1), cmd(1, 2), cmd(1, 3))
    assert records_of(ready, SlotAcceptedRecord) == [
        SlotAcceptedRecord(slot=0, ballot=0, batch=(cmd(1, 1), cmd(1, 2), cmd(1, 3)))
    ]
    accepts = msgs(ready.send_after_persist, PaxosAccept)
    assert [to for to, _ in accepts] == [1, 2]
    assert {m.slot for _, m in accepts} == {0} and len(accepts[0][1].batch) == 3
    assert ready.send == [] and ready.ready == [] and ready.executions() == []
    # the next turn takes the next slot: slots pipeline without waiting for a commit
    assert msgs(turn(leader, cmd(1, 4)).send_after_persist, PaxosAccept)[0][1].slot == 1


def test_a_slot_executes_as_runs_of_commands_led_here_and_not() -> None:
    # the leader's slot mixes its own clients' commands and ones forwarded to it: the
    # driver gets one SlotBatch per run of one kind, the offsets of the slot kept
    leader = replica(0)
    forwarded = (cmd(2, 1), cmd(2, 2))
    ready = turn(leader, cmd(1, 1), PaxosForward(src=2, view=0, commands=forwarded),
                 cmd(1, 2))
    [(_, sent)] = msgs(ready.send_after_persist, PaxosAccept)[:1]
    batch = sent.batch
    led = [command.client_id == 1 for command in batch]
    assert led.count(True) == 2 and led.count(False) == 2
    ready = turn(leader, PaxosAck(src=1, view=0, ballot=0, slots=(0,)))
    runs = [(offset, len(commands), led_here) for _, offset, commands, led_here in ready.apply]
    expected: list[tuple[int, int, bool]] = []
    for offset, led_here in enumerate(led):
        if expected and expected[-1][2] == led_here:
            expected[-1] = (expected[-1][0], expected[-1][1] + 1, led_here)
        else:
            expected.append((offset, 1, led_here))
    assert runs == expected
    assert ready.executions() == [Execution(0, offset, command, led[offset])
                                  for offset, command in enumerate(batch)]
    # a follower's slot: the batch itself, whole
    follower = replica(1)
    ready = turn(follower, PaxosAccept(src=0, view=0, slot=0, ballot=0, batch=batch),
                 PaxosCommit(src=0, view=0, slot=0, ballot=0, batch=None))
    assert ready.apply == [SlotBatch(0, 0, batch, False)]


def test_max_batch_splits_a_turn_into_several_slots() -> None:
    leader = replica(0, max_batch=2)
    ready = turn(leader, *(cmd(1, i) for i in range(5)))
    slots = sorted({m.slot for _, m in msgs(ready.send_after_persist, PaxosAccept)})
    assert slots == [0, 1, 2]
    assert [len(r.batch) for r in records_of(ready, SlotAcceptedRecord)] == [2, 2, 1]


def test_batches_and_forwards_are_bounded_in_bytes_too() -> None:
    # so that no message outgrows a frame, however large the commands of one turn
    big = [Command(client_id=1, seq=s, op=b"x" * 1000) for s in range(5)]
    leader = replica(0, max_batch_bytes=2000)
    ready = turn(leader, *big)
    assert [r.batch for r in records_of(ready, SlotAcceptedRecord)] == [
        tuple(big[0:2]), tuple(big[2:4]), tuple(big[4:])
    ]
    follower = replica(2, max_batch_bytes=2000)
    forwards = msgs(turn(follower, *big).send, PaxosForward)
    assert [m.commands for _, m in forwards] == [tuple(big[0:2]), tuple(big[2:4]), tuple(big[4:])]


def test_a_catchup_answer_is_bounded_in_bytes() -> None:
    leader = replica(0)
    op = b"x" * (64 << 10)
    for seq in range(100):  # 6.4 MB of chosen slots
        turn(leader, Command(client_id=1, seq=seq, op=op))
        turn(leader, PaxosAck(src=1, view=0, ballot=0, slots=(seq,)))
    answer = msgs(turn(leader, Catchup(src=2, view=0, slot=0)).send_after_persist, PaxosCommit)
    assert [m.slot for _, m in answer] == list(range(len(answer)))
    assert 0 < len(answer) < 100
    assert sum(len(m.batch[0].op) for _, m in answer) <= CATCHUP_BYTES + len(op)


def test_leader_commits_on_a_majority_and_tells_everyone() -> None:
    leader = replica(0)
    turn(leader, cmd(1, 1))
    ready = turn(leader, PaxosAck(src=2, view=0, ballot=0, slots=(0,)))
    commits = dict(msgs(ready.send_after_persist, PaxosCommit))
    # every follower was sent the Accept first on the same connection: no value again
    assert commits[1].batch is None and commits[2].batch is None
    assert ready.ready == [cmd(1, 1)]  # arrived here from a client, chosen: ready
    assert [(e.slot, e.command, e.led_here) for e in ready.executions()] == [(0, cmd(1, 1), True)]
    # a late acknowledgement changes nothing
    late = turn(leader, PaxosAck(src=1, view=0, ballot=0, slots=(0,)))
    assert late.send_after_persist == [] and late.ready == []


def test_leader_drops_a_duplicate_forward_and_resends_the_commit_it_was_asked_again() -> None:
    leader = replica(0)
    turn(leader, cmd(1, 1))  # slot 0: not chosen yet, so slot 1 cannot execute
    forward = PaxosForward(src=1, view=0, commands=(cmd(1, 2),))
    first = turn(leader, forward, forward)  # duplicated by the network in one turn
    assert [m.slot for _, m in msgs(first.send_after_persist, PaxosAccept)] == [1, 1]
    assert turn(leader, forward).send_after_persist == []  # in flight: nothing new
    turn(leader, PaxosAck(src=2, view=0, ballot=0, slots=(1,)))
    again = turn(leader, forward)  # chosen, not executed: the forwarder missed the commit
    assert msgs(again.send_after_persist, PaxosCommit) == [
        (1, PaxosCommit(src=0, view=0, slot=1, ballot=0, batch=(cmd(1, 2),)))
    ]


def test_a_retried_command_that_already_executed_is_proposed_again() -> None:
    # (the state machine's session table answers it with the first result)
    leader = replica(0)
    turn(leader, cmd(1, 1))
    acked = turn(leader, PaxosAck(src=1, view=0, ballot=0, slots=(0,)))
    assert [e.slot for e in acked.executions()]
    retry = turn(leader, PaxosForward(src=2, view=0, commands=(cmd(1, 1),)))
    assert {m.slot for _, m in msgs(retry.send_after_persist, PaxosAccept)} == {1}


def test_leader_retransmits_unacknowledged_accepts_to_whoever_did_not_ack() -> None:
    leader = replica(0)
    turn(leader, cmd(1, 1), now=0)
    assert tick(leader, 50_000).send_after_persist == []  # not yet retransmit_us
    resent = msgs(tick(leader, 100_000).send_after_persist, PaxosAccept)
    assert [to for to, _ in resent] == [1, 2]
    leader.step(PaxosAck(src=1, view=0, ballot=0, slots=(0,)), 110_000)
    leader.advance(leader.ready())
    # chosen now: retransmission stops (a peer that missed it learns from the commit)
    assert msgs(tick(leader, 300_000).send_after_persist, PaxosAccept) == []


def test_a_cluster_of_one_commits_at_once() -> None:
    alone = replica(0, n=1)
    ready = turn(alone, cmd(1, 1))
    assert ready.ready == [cmd(1, 1)] and [e.slot for e in ready.executions()] == [0]


# --------------------------------------------------------------------------- followers


def test_follower_forwards_client_commands_to_the_leader_once_per_turn() -> None:
    follower = replica(2)
    ready = turn(follower, cmd(1, 1), cmd(1, 2))
    assert ready.persist == [] and ready.send_after_persist == []
    assert msgs(ready.send, PaxosForward) == [
        (0, PaxosForward(src=2, view=0, commands=(cmd(1, 1), cmd(1, 2))))
    ]


def test_the_leader_is_configurable() -> None:
    follower = replica(0, leader=2)
    assert msgs(turn(follower, cmd(1, 1)).send, PaxosForward)[0][0] == 2
    with pytest.raises(ConfigError, match="leader"):
        config(3, leader=3)


def test_acceptor_persists_then_acknowledges_and_acknowledges_duplicates_again() -> None:
    follower = replica(1)
    ready = turn(follower, accept(0, 1), accept(1, 2))
    assert [r.slot for r in records_of(ready, SlotAcceptedRecord)] == [0, 1]
    # one acknowledgement for the whole turn, released only after the records are durable
    assert msgs(ready.send_after_persist, PaxosAck) == [
        (0, PaxosAck(src=1, view=0, ballot=0, slots=(0, 1)))
    ]
    assert msgs(ready.send, PaxosAck) == []
    dup = turn(follower, accept(0, 1))
    assert dup.persist == []  # persisted once ...
    assert msgs(dup.send_after_persist, PaxosAck)[0][1].slots == (0,)  # ... acked again


def test_acceptor_refuses_a_second_value_for_a_slot_at_the_same_ballot() -> None:
    follower = replica(1)
    turn(follower, accept(0, 1))
    assert turn(follower, accept(0, 9)).send_after_persist == []


def test_only_the_leader_proposes() -> None:
    follower = replica(1)
    assert turn(follower, accept(0, 1, src=2)).persist == []


def test_lost_forward_is_sent_again_until_the_leader_is_seen_proposing_it() -> None:
    follower = replica(1)
    turn(follower, cmd(1, 1), now=0)
    assert msgs(tick(follower, 100_000).send, PaxosForward)[0][1].commands == (cmd(1, 1),)
    turn(follower, accept(3, 1), now=120_000)
    assert msgs(tick(follower, 400_000).send, PaxosForward) == []


def test_ready_at_the_forwarder_when_it_learns_the_commit() -> None:
    net = Net(config(3), MultiPaxosReplica)
    net.propose(1, cmd(1, 1))
    net.run()
    assert net.ready_cmds == [[], [cmd(1, 1)], []]
    # the forwarder answers the client: the command is led there, not at the leader
    assert [(e.slot, e.led_here) for e in net.executed[1]] == [(0, True)]
    assert [(e.slot, e.led_here) for e in net.executed[0]] == [(0, False)]
    assert net.sent[:4] == [
        "1->0 PaxosForward",
        "0->1 PaxosAccept",
        "0->2 PaxosAccept",
        "1->0 PaxosAck",
    ]


def test_reads_go_through_the_log_and_are_served_after_their_slot_executes() -> None:
    net = Net(config(3), MultiPaxosReplica)
    net.propose(0, cmd(1, 1))
    net.read(2, cmd(1, 2, blind=False))
    net.run()
    assert net.reads[2] == [cmd(1, 2, blind=False)]
    assert net.ready_cmds[2] == []  # a read is answered through Ready.reads only
    assert [e.command.seq for e in net.executed[2]] == [1, 2]


# --------------------------------------------------------------------------- execution


def test_execution_is_in_slot_order() -> None:
    follower = replica(2)
    ready = turn(follower, PaxosCommit(src=0, view=0, slot=1, ballot=0, batch=(cmd(1, 2),)))
    assert ready.executions() == []  # slot 0 unknown yet
    ready = turn(follower, PaxosCommit(src=0, view=0, slot=0, ballot=0, batch=(cmd(1, 1),)))
    assert [(e.slot, e.command.seq) for e in ready.executions()] == [(0, 1), (1, 2)]
    assert follower.executed_through() == 1
    assert follower.committed_log() == {0: (cmd(1, 1),), 1: (cmd(1, 2),)}


def test_a_commit_without_the_value_waits_for_catch_up() -> None:
    follower = replica(2)
    committed = turn(follower, PaxosCommit(src=0, view=0, slot=0, ballot=0, batch=None))
    assert committed.executions() == []
    assert follower.committed_log() == {}


def test_a_replica_that_missed_commits_catches_up_from_the_peer_ahead() -> None:
    def drop(src: int, dst: int, msg: object) -> bool:
        return dst == 2 and isinstance(msg, PaxosCommit | PaxosAccept)

    net = Net(config(3), MultiPaxosReplica)
    net.lose = drop
    net.propose(0, cmd(1, 1))
    net.run()
    net.propose(0, cmd(1, 2))
    net.run()
    assert net.executed_ids(0) == [(0, 1, 1), (1, 1, 2)] and net.executed_ids(2) == []
    net.lose = lambda src, dst, msg: False
    net.tick_all(10_000)  # heartbeats: replica 2 learns the leader executed through slot 1
    assert net.executed_ids(2) == []  # not before catchup_us without progress
    net.tick_all(200_000)
    assert "2->0 CatchupMarkers" in net.sent and "2->0 Catchup" not in net.sent
    assert net.executed_ids(2) == []  # the commits name values it never received
    net.tick_all(210_000)  # so it asks for the values at once
    assert "2->0 Catchup" in net.sent
    assert net.executed_ids(2) == [(0, 1, 1), (1, 1, 2)]


def test_a_replica_that_holds_the_values_catches_up_from_commit_markers_alone() -> None:
    net = Net(config(3), MultiPaxosReplica)
    net.lose = lambda src, dst, msg: dst == 2 and isinstance(msg, PaxosCommit)
    net.propose(0, cmd(1, 1))
    net.run()
    assert net.executed_ids(2) == []
    net.lose = lambda src, dst, msg: False
    net.tick_all(10_000)
    net.tick_all(200_000)
    assert "2->0 CatchupMarkers" in net.sent
    assert net.executed_ids(2) == [(0, 1, 1)]
    net.tick_all(400_000)
    assert "2->0 Catchup" not in net.sent  # no value was ever re-sent


def test_catchup_answer_carries_values() -> None:
    leader = replica(0)
    turn(leader, cmd(1, 1))
    turn(leader, PaxosAck(src=1, view=0, ballot=0, slots=(0,)))
    answer = turn(leader, Catchup(src=2, view=0, slot=0))
    assert msgs(answer.send_after_persist, PaxosCommit) == [
        (2, PaxosCommit(src=0, view=0, slot=0, ballot=0, batch=(cmd(1, 1),)))
    ]
    beats = msgs(tick(leader, 1).send, Heartbeat)
    assert [(to, m.executed) for to, m in beats] == [(1, 1), (2, 1)]


# --------------------------------------------------------------------------- recovery


def test_restarted_leader_re_drives_its_slots_and_fills_a_hole_with_a_no_op() -> None:
    records = [
        SlotAcceptedRecord(slot=0, ballot=0, batch=(cmd(1, 1),)),
        SlotAcceptedRecord(slot=2, ballot=0, batch=(cmd(1, 3),)),
    ]
    leader = MultiPaxosReplica(config(3), 0, recovered=records, rng=random.Random(0))
    first = leader.ready()
    leader.advance(first)
    assert records_of(first, SlotAcceptedRecord) == [SlotAcceptedRecord(slot=1, ballot=0, batch=())]
    resent = msgs(tick(leader, 1).send_after_persist, PaxosAccept)
    assert sorted({m.slot for _, m in resent}) == [0, 1, 2]
    assert msgs(turn(leader, cmd(1, 9)).send_after_persist, PaxosAccept)[0][1].slot == 3


def test_core_contract() -> None:
    leader = replica(0)
    ready = leader.ready()
    with pytest.raises(LocalProtocolError):
        leader.ready()
    leader.advance(ready)
    with pytest.raises(LocalProtocolError):
        leader.advance(ready)
    with pytest.raises(LocalProtocolError, match="op"):
        leader.propose(cmd(1, 1).__class__(client_id=1, seq=1, op=b"x" * (2 << 20)), 0)
    with pytest.raises(ConfigError, match="unsafe"):
        replica(0, unsafe=frozenset({"go_ready_rule"}))


def test_compacting_to_an_older_snapshot_rewrites_nothing_executed() -> None:
    # The driver compacts to its previous snapshot after taking one at the execution
    # frontier: a restart starts there, so executed slots stay in memory (for peers a little
    # behind) but not in the rewritten log.
    net = Net(config(3), MultiPaxosReplica)
    leader = net.cores[0]
    older = leader.snapshot_meta()
    for i in range(3):
        net.propose(0, cmd(1, i))
        net.run()
    assert leader.executed_through() == 2
    assert leader.compact(older) == []
    answer = turn(leader, Catchup(src=2, view=0, slot=0))
    assert answer.snapshot_requests == []
    commits = msgs(answer.send + answer.send_after_persist, PaxosCommit)
    assert [m.slot for _, m in commits] == [0, 1, 2]


def test_compaction_and_snapshot_install() -> None:
    net = Net(config(3), MultiPaxosReplica)
    for i in range(5):
        net.propose(0, cmd(1, i))
        net.run()
    leader = net.cores[0]
    meta = leader.snapshot_meta()
    assert (meta.slot, meta.exec_counts) == (5, (0, 0, 0))
    assert leader.compact(meta) == [] and leader.committed_log() == {}
    # a peer that needs compacted slots gets our snapshot (from the driver)
    assert turn(leader, Catchup(src=2, view=0, slot=0)).snapshot_requests == [2]
    fresh = replica(2)
    assert fresh.install_snapshot(meta) == []
    assert fresh.executed_through() == 4
    ready = turn(fresh, PaxosCommit(src=0, view=0, slot=5, ballot=0, batch=(cmd(1, 9),)))
    assert [e.slot for e in ready.executions()] == [5]
    # the leader goes on after the compaction point
    assert msgs(turn(leader, cmd(1, 10)).send_after_persist, PaxosAccept)[0][1].slot == 5


def test_thrifty_leader_sends_accepts_to_a_bare_majority_first() -> None:
    leader = replica(0, n=5, thrifty=True, preference=((3, 1, 2, 4), (0, 2, 3, 4), (0, 1, 3, 4),
                                                       (0, 1, 2, 4), (0, 1, 2, 3)))  # fmt: skip
    first = msgs(turn(leader, cmd(1, 1), now=0).send_after_persist, PaxosAccept)
    assert [to for to, _ in first] == [3, 1]
    leader.step(PaxosAck(src=3, view=0, ballot=0, slots=(0,)), 1)
    leader.advance(leader.ready())
    resent = msgs(tick(leader, 100_000).send_after_persist, PaxosAccept)
    assert [to for to, _ in resent] == [1, 2, 4]  # aggressively, to everyone else
