"""Catch-up (catchup.py): a replica behind asks a peer for commit markers, then for the values it
lacks; what an answer carries and how big it may be; when a replica asks at all.
"""

from __future__ import annotations

from util import cmd, core, drain, msgs

from consensus.messages import (
    Catchup,
    CatchupMarkers,
    CCommit,
    Command,
    Heartbeat,
    OCommit,
    PeerMessage,
)
from consensus.protocol.batch import CATCHUP_BYTES
from consensus.protocol.sdpaxos import SDPaxosReplica
from consensus.protocol.sdpaxos.catchup import CATCHUP_BATCH

from .builders import A, B, C, all_out, caccept, cack, ccommit, oaccept, oack, ocommit

# =========================================================================== answers


def _executed_sequencer() -> SDPaxosReplica:
    """Replica 0 (N=3) that executed slot 0 => 1 (C[1][0] = [A]) and slot 1 => 0 ([B, C])."""
    r0 = core(3, 0)
    r0.step(caccept(1, 1, 0, (A,)), 0)
    r0.step(ccommit(1, 1, 0, None), 0)
    r0.step(ocommit(1, (0, 1)), 0)
    r0.propose(B, 0)
    r0.propose(C, 0)
    applied = list(drain(r0).executions())
    r0.step(cack(2, 0, 0), 1)
    r0.step(oack(2, 1), 1)
    applied += drain(r0).executions()
    assert [(e.slot, e.command) for e in applied] == [(0, A), (1, B), (1, C)]
    return r0


def test_catchup_answer_carries_ocommit_and_ccommits_with_batches() -> None:
    r0 = _executed_sequencer()
    r0.step(Catchup(src=2, view=0, slot=0), 2)
    ready = drain(r0)
    out = all_out(ready)
    assert (2, ocommit(0, (0, 1), (1, 0))) in out
    assert (2, ccommit(0, 1, 0, (A,))) in out
    assert (2, ccommit(0, 0, 0, (B, C), ballot=0)) in out
    assert all(to == 2 for to, _ in out)
    # a lagging replica that knew nothing executes both slots from the answer alone
    r2 = core(3, 2)
    for _, message in out:
        r2.step(message, 3)
    assert [(e.slot, e.offset, e.command, e.led_here) for e in drain(r2).executions()] == [
        (0, 0, A, False),
        (1, 0, B, False),
        (1, 1, C, False),
    ]


def test_catchup_from_a_later_slot() -> None:
    r0 = _executed_sequencer()
    r0.step(Catchup(src=1, view=0, slot=1), 2)
    out = all_out(drain(r0))
    assert (1, ocommit(0, (1, 0))) in out
    assert (1, ccommit(0, 0, 0, (B, C), ballot=0)) in out
    assert not any(isinstance(m, OCommit) and m.entries[0].slot == 0 for _, m in out)


def test_a_catch_up_answer_is_bounded_in_bytes() -> None:
    r0 = core(3, 0)
    op = b"x" * (64 << 10)
    for index in range(100):  # 6.4 MB of chosen, unexecuted C-instances of replica 1
        batch = (Command(client_id=41, seq=index, op=op),)
        r0.step(caccept(1, 1, index, batch), 0)
        r0.step(ccommit(1, 1, index, batch), 0)
    drain(r0)
    r0.step(Catchup(src=2, view=0, slot=0), 1)
    commits = [(to, m) for to, m in all_out(drain(r0)) if isinstance(m, CCommit)]
    assert 0 < len(commits) < 100
    assert sum(len(c.batch[0].op) for _, c in commits) <= CATCHUP_BYTES + len(op)


# =========================================================================== asking


def test_stuck_replica_asks_for_markers_then_for_the_values_it_lacks() -> None:
    r0 = core(3, 0)
    r0.step(caccept(1, 1, 0, (A,)), 0)
    r0.step(ccommit(1, 1, 0, None), 0)
    drain(r0)
    r2 = core(3, 2)
    r2.step(oaccept((0, 1)), 0)  # knows slot 0's owner, never hears of C[1][0]
    drain(r2)
    r2.tick(299_999)
    assert msgs(drain(r2).send) == []
    r2.tick(300_000)
    assert msgs(drain(r2).send) == [(0, CatchupMarkers(src=2, view=0, slot=0))]
    r0.step(CatchupMarkers(src=2, view=0, slot=0), 1)
    answer = all_out(drain(r0))
    assert (2, ccommit(0, 1, 0, None)) in answer  # no value: r2 may hold it
    for _, message in answer:
        r2.step(message, 300_001)
    assert list(drain(r2).executions()) == []  # it did not
    r2.tick(300_002)  # the marker it could not use: values at once, not a timeout later
    assert msgs(drain(r2).send) == [(1, Catchup(src=2, view=0, slot=0))]
    r0.step(Catchup(src=2, view=0, slot=0), 2)
    for _, message in all_out(drain(r0)):
        r2.step(message, 300_003)
    assert [e.command for e in drain(r2).executions()] == [A]


def test_markers_alone_unblock_a_replica_that_holds_the_values() -> None:
    # an overloaded cluster: the commits are late, the values arrived long ago (five
    # replicas: with three, accepting from the proposer is learning the choice)
    r0 = core(5, 0)
    r0.step(caccept(1, 1, 0, (A,)), 0)  # the sequencer orders it: slot 0
    r0.step(ccommit(1, 1, 0, None), 0)
    r0.step(ocommit(1, (0, 1)), 0)
    assert [e.command for e in drain(r0).executions()] == [A]
    r2 = core(5, 2)
    r2.step(caccept(1, 1, 0, (A,)), 0)
    r2.step(oaccept((0, 1)), 0)
    drain(r2)
    r2.tick(300_000)
    (ask,) = msgs(drain(r2).send, CatchupMarkers)
    assert ask[1] == CatchupMarkers(src=2, view=0, slot=0)
    r0.step(ask[1], 1)
    answer = all_out(drain(r0))
    assert (2, ccommit(0, 1, 0, None)) in answer
    for _, message in answer:
        r2.step(message, 300_001)
    assert [e.command for e in drain(r2).executions()] == [A]
    r2.tick(600_001)
    assert msgs(drain(r2).send, Catchup) == []  # no values were ever needed


def _executing_follower() -> SDPaxosReplica:
    r2 = core(3, 2)
    r2.tick(0)
    drain(r2)
    return r2


def _execute_slot(r: SDPaxosReplica, slot: int, now: int) -> None:
    command = cmd(40, slot)
    r.step(caccept(0, 0, slot, (command,)), now)
    r.step(ccommit(0, 0, slot, (command,)), now)
    r.step(ocommit(0, (slot, 0)), now)
    assert [e.command for e in drain(r).executions()] == [command]


def _catchups(r: SDPaxosReplica, now: int) -> list[tuple[int, PeerMessage]]:
    r.tick(now)
    return [(to, m) for to, m in all_out(drain(r)) if isinstance(m, Catchup | CatchupMarkers)]


def test_a_replica_executing_a_little_behind_a_peer_does_not_ask_it_for_catch_up() -> None:
    # the normal state of a loaded cluster: asking re-fetched full batches already on their way
    r2 = _executing_follower()
    interval = r2.config.catchup_us // 10
    for slot in range(40):
        now = (slot + 1) * interval
        r2.step(Heartbeat(src=0, view=0, executed=slot + 5, lease_request=-1), now)
        _execute_slot(r2, slot, now)
        assert _catchups(r2, now) == [], slot


def test_a_replica_asks_when_far_behind_or_when_execution_stopped() -> None:
    r2 = _executing_follower()
    r2.step(Heartbeat(src=0, view=0, executed=CATCHUP_BATCH + 1, lease_request=-1), 1_000)
    assert _catchups(r2, 1_000) == [(0, CatchupMarkers(src=2, view=0, slot=0))]  # far behind
    r1 = _executing_follower()
    r1.step(Heartbeat(src=0, view=0, executed=3, lease_request=-1), 1_000)
    assert _catchups(r1, 1_000) == []
    stalled = 1_000 + r1.config.catchup_us
    assert _catchups(r1, stalled) == [(0, CatchupMarkers(src=2, view=0, slot=0))]  # stopped
