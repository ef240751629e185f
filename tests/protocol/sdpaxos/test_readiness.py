"""The readiness rule (readiness.py, §3.2, Figure 5): when a command leader may acknowledge its
command, per replica count (``CountRule`` for N = 3 and N >= 7, ``FiveRule`` for N = 5), who
learns from an OAck, and the count rule's re-sending of the sequencer's own unchosen slots.
"""

from __future__ import annotations

import pytest
from util import Net, cmd, core, drain, msgs

from consensus.config import ProtocolConfig
from consensus.messages import (
    CCommit,
    OAccept,
    OAcceptedRecord,
    OAck,
    OCommit,
    OEntry,
    Vote,
    VRequest,
)
from consensus.protocol.ready import Execution
from consensus.protocol.sdpaxos.readiness import CountRule, FiveRule, ReadinessRule, rule_for

from .builders import A, B, caccept, cack, o_entries, oaccept, oack, ocommit

# =========================================================================== N = 3


def test_ready_n3_needs_commit_and_oaccept_cack_first() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 1)
    ready = drain(r1)
    assert ready.ready == []  # C chosen, not ordered
    r1.step(oaccept((0, 1)), 2)
    assert drain(r1).ready == []  # the sequencer's acceptance counts from its own OAck
    r1.step(oack(0, 0), 2)
    ready = drain(r1)
    assert ready.ready == [A]
    assert msgs(ready.send_after_persist, OCommit) == [
        (0, ocommit(1, (0, 1))),
        (2, ocommit(1, (0, 1))),
    ]
    assert ready.executions() == [Execution(0, 0, A, True)]


def test_ready_n3_needs_commit_and_oaccept_oaccept_first() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(oaccept((0, 1)), 1)
    r1.step(oack(0, 0), 1)
    ready = drain(r1)
    assert ready.ready == []  # ordered (O chosen: sequencer + us), C not chosen yet
    assert msgs(ready.send_after_persist, OCommit) == [
        (0, ocommit(1, (0, 1))),
        (2, ocommit(1, (0, 1))),
    ]
    assert ready.executions() == []
    r1.step(cack(0, 1, 0), 2)
    ready = drain(r1)
    assert ready.ready == [A]
    assert ready.executions() == [Execution(0, 0, A, True)]


def test_ready_n3_needs_i_plus_1_o_instances() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.propose(B, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 1)
    r1.step(cack(2, 1, 1), 1)
    r1.step(oaccept((0, 1)), 1)  # one O-instance for 1: only C[1][0] is placed
    r1.step(oack(0, 0), 1)
    assert drain(r1).ready == [A]
    r1.step(oaccept((1, 1)), 2)
    r1.step(oack(0, 1), 2)
    assert drain(r1).ready == [B]


# =========================================================================== N = 5


def test_ready_n5_non_sequencer_waits_for_gap_free_prefix() -> None:
    r1 = core(5, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 1)
    r1.step(cack(3, 1, 0), 1)
    assert drain(r1).ready == []  # C chosen
    r1.step(oaccept((1, 1)), 2)  # our slot, but slot 0 (for replica 2) is withheld
    ready = drain(r1)
    assert ready.ready == []
    # committed on the OAccept alone (line 29): OCommit broadcast, OAck to the sequencer
    assert msgs(ready.send_after_persist, OAck) == [(0, oack(1, 1))]
    assert len(msgs(ready.send_after_persist, OCommit)) == 4
    r1.step(oaccept((0, 2)), 3)
    ready = drain(r1)
    assert ready.ready == [A]
    assert ready.executions() == []  # slot 0's C-instance (replica 2's) is unknown here


def test_ready_n5_prefix_from_an_older_view_proves_nothing_after_joining_a_newer() -> None:
    # (found by the simulator: N=5 seed 54 with all faults) an O-instance accepted in view 0
    # may be replaced by view 2's rebuild if our vote is not among the majority it uses, so a
    # command chosen after we joined view 2 is not ready on the strength of it
    r1 = core(5, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(oaccept((0, 2), (1, 1)), 1)  # our slot 1 in view 0; slot 0's instance unknown
    drain(r1)
    later = 10_000_000  # past any lease r1 granted
    r1.step(VRequest(src=2, view=2, from_slot=0), later)  # replica 2 stands for view 2
    assert msgs(drain(r1).send_after_persist, Vote)
    r1.step(cack(2, 1, 0, view=2), later)
    r1.step(cack(3, 1, 0, view=2), later)  # C chosen now, in view 2
    ready = drain(r1)
    assert len(msgs(ready.send_after_persist, CCommit)) == 4
    assert ready.ready == []


def test_ready_n5_non_sequencer_not_before_c_chosen() -> None:
    r1 = core(5, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(oaccept((0, 1)), 1)
    r1.step(cack(2, 1, 0), 1)
    assert drain(r1).ready == []  # 2 of 5 accepted C[1][0]
    r1.step(cack(4, 1, 0), 2)
    assert drain(r1).ready == [A]


def test_ready_n5_sequencer_needs_majority_accepted_prefix() -> None:
    r0 = core(5, 0)
    r0.step(caccept(1, 1, 0, (B,)), 0)  # slot 0 => 1
    drain(r0)
    r0.propose(A, 0)  # slot 1 => 0
    ready = drain(r0)
    assert o_entries(ready) == [(1, 0)]
    r0.step(cack(1, 0, 0), 1)
    r0.step(cack(2, 0, 0), 1)
    assert drain(r0).ready == []  # C[0][0] chosen (3 of 5), O not
    r0.step(oack(1, 1), 2)
    r0.step(oack(2, 1), 2)
    ready = drain(r0)
    # O[1] is accepted by a majority (0, 1, 2): committed and broadcast (line 25) ...
    assert msgs(ready.send_after_persist, OCommit) == [
        (p, ocommit(0, (1, 0))) for p in (1, 2, 3, 4)
    ]
    # ... but not ready: slot 0, before ours, is not majority-accepted (line 26)
    assert ready.ready == []
    r0.step(oack(1, 0), 3)
    assert drain(r0).ready == []  # prefix [0, 2) accepted by 0 and 1 only
    r0.step(oack(3, 0), 3)
    assert drain(r0).ready == []  # replica 3 covers slot 0 but not slot 1
    r0.step(oack(2, 0), 4)
    ready = drain(r0)
    assert ready.ready == [A]  # 0, 1 and 2 accepted every slot through 1
    assert msgs(ready.send_after_persist, OCommit) == []  # O[1] was committed already


def test_ready_n5_sequencer_not_before_c_chosen() -> None:
    r0 = core(5, 0)
    r0.propose(A, 0)
    drain(r0)
    r0.step(oack(1, 0), 1)
    r0.step(oack(2, 0), 1)
    ready = drain(r0)
    assert ready.ready == []  # O chosen, C[0][0] only at 0
    assert len(msgs(ready.send_after_persist, OCommit)) == 4
    r0.step(cack(3, 0, 0), 2)
    assert drain(r0).ready == []
    r0.step(cack(4, 0, 0), 2)
    assert drain(r0).ready == [A]


# =========================================================================== N = 7


def test_ready_n7_non_sequencer_needs_oacks_from_a_majority() -> None:
    r1 = core(7, 1)
    r1.propose(A, 0)
    drain(r1)
    for src in (2, 3, 4):
        r1.step(cack(src, 1, 0), 1)
    assert drain(r1).ready == []  # C chosen (4 of 7)
    r1.step(oaccept((0, 1)), 2)
    r1.step(oack(0, 0), 2)
    ready = drain(r1)
    assert ready.ready == []  # the sequencer and us: 2 of 7
    assert msgs(ready.send_after_persist, OCommit) == []
    r1.step(oack(5, 0), 3)
    assert drain(r1).ready == []  # 3 of 7
    r1.step(oack(6, 0), 3)
    ready = drain(r1)
    assert ready.ready == [A]  # 4 of 7
    assert len(msgs(ready.send_after_persist, OCommit)) == 6


def test_ready_n7_oacks_before_oaccept_count() -> None:
    r1 = core(7, 1)
    r1.propose(A, 0)
    drain(r1)
    for src in (2, 3, 4):
        r1.step(cack(src, 1, 0), 1)
    r1.step(oack(5, 0), 2)
    r1.step(oack(6, 0), 2)
    r1.step(oack(0, 0), 2)
    assert drain(r1).ready == []  # slot 0's value is not known here yet
    r1.step(oaccept((0, 1)), 3)
    assert drain(r1).ready == [A]


def test_ready_n7_sequencer_needs_oacks_from_a_majority() -> None:
    r0 = core(7, 0)
    r0.propose(A, 0)
    drain(r0)
    for src in (1, 2, 3):
        r0.step(cack(src, 0, 0), 1)
    assert drain(r0).ready == []
    r0.step(oack(1, 0), 2)
    r0.step(oack(2, 0), 2)
    assert drain(r0).ready == []  # 3 of 7
    r0.step(oack(3, 0), 2)
    assert drain(r0).ready == [A]


# ========================================================================== who learns from an OAck


def test_oack_goes_to_learner_and_sequencer_n3_and_to_every_replica_n5() -> None:
    r2 = core(3, 2)
    r2.step(oaccept((0, 1)), 1)
    ready = drain(r2)
    assert ready.persist == [OAcceptedRecord(view=0, entries=(OEntry(slot=0, owner=1),))]
    assert sorted(msgs(ready.send_after_persist)) == [(0, oack(2, 0)), (1, oack(2, 0))]
    r1 = core(3, 1)  # the learner itself: its OCommit tells the sequencer
    r1.step(oaccept((0, 1)), 1)
    assert msgs(drain(r1).send_after_persist, OAck) == []
    r2 = core(5, 2)
    r2.step(oaccept((0, 1)), 1)
    ready = drain(r2)
    assert msgs(ready.send_after_persist) == [(0, oack(2, 0)), (1, oack(2, 0)), (3, oack(2, 0)),
                                              (4, oack(2, 0))]


# ============================================== the count rule: the sequencer's own unchosen slots


def test_n3_sequencer_resends_unchosen_own_oaccept() -> None:
    """With the count rule an own C-instance can be ready while its own O-instance is not
    chosen, so it is never late: the sequencer re-sends every own unchosen slot a
    retransmission period old (``CountRule.resend_unchosen``), or an O-instance lost to
    every peer would stop execution everywhere for good."""
    r0 = core(3, 0)
    r0.propose(A, 0)  # C[0][0] in slot 0
    drain(r0)
    r0.propose(B, 0)  # C[0][1] in slot 1
    drain(r0)
    # both C-instances chosen; the OAccepts for slot 0 were lost, slot 1 was accepted by 1
    r0.step(cack(1, 0, 0), 1)
    r0.step(cack(1, 0, 1), 1)
    r0.step(oack(1, 1), 1)
    ready = drain(r0)
    # Figure 5 line 21 counts O-instances: one is chosen (slot 1), so C[0][0] is ready
    assert ready.ready == [A]
    assert ready.executions() == []  # slot 0 is not chosen: nothing can execute anywhere
    r0.tick(200_000)
    ready = drain(r0)
    resent = {
        to
        for to, m in msgs(ready.send_after_persist, OAccept)
        if isinstance(m, OAccept) and OEntry(slot=0, owner=0) in m.entries
    }
    assert resent == {1, 2}


def test_n3_cluster_recovers_sequencer_slot_lost_to_every_peer() -> None:
    """The same loss in a whole cluster: the re-sent OAccept lets every replica execute both
    commands, and the second one becomes ready, within a few retransmission periods."""
    net = Net(ProtocolConfig(replicas=3))  # heartbeats flow: the sequencer is never suspected
    net.propose(0, A)
    net.propose(0, B)
    first = net.matching("0", "*", "OAccept")[:2]
    assert [f.message.entries for f in first] == [(OEntry(slot=0, owner=0),)] * 2
    for flight in first:
        net.drop(flight)
    net.deliver_all()
    assert net.ready_cmds[0] == [A]  # reported ready (blind writes are acknowledged now)
    for round_ in range(1, 16):  # three seconds of timers, with every message delivered
        for replica in range(3):
            net.tick(replica, at=round_ * 200_000)
        net.deliver_all()
    assert [[e.command for e in executed] for executed in net.executed] == [[A, B]] * 3
    assert net.ready_cmds[0] == [A, B]


@pytest.mark.parametrize("broken", [False, True])
def test_n3_an_owners_slot_it_lost_is_resent_to_it_with_the_third_replica_gone(
    broken: bool,
) -> None:
    """Replica 2 is gone for good (lost with its disk, its replacement not yet a voter), and
    the sequencer's OAccept of replica 1's first slot is lost to replica 1. Replica 1 keeps
    proposing (a replica with active sessions proposes a log-time command every step): each
    new instance is ordered and chosen within a retransmission period, and by the count rule
    makes the one before it ready, so replica 1 never has a late instance to ask for again.
    Only the sequencer can get slot 0 chosen, by sending it to its owner: it does once the
    slot stayed unchosen for a period (``sdpaxos sim --sessions --concurrency 6
    --snapshot-every 10``, WAN, seed 9092: every client stuck for the last 30 s). The broken
    variant sends it to the dead replica alone, and nothing executes anywhere."""
    config = ProtocolConfig(replicas=3,
                            unsafe=frozenset({"resend_skips_owner"} if broken else ()))
    lost_first_oaccept: list[OAccept] = []

    def lose(src: int, dst: int, message: object) -> bool:
        if 2 in (src, dst):
            return True
        if (isinstance(message, OAccept) and dst == 1 and not lost_first_oaccept
                and OEntry(slot=0, owner=1) in message.entries):
            lost_first_oaccept.append(message)
            return True
        return False

    net = Net(config, lose=lose)
    first = cmd(9, 0)
    for step in range(1, 41):  # two seconds, a command proposed at replica 1 every 50 ms
        net.propose(1, first if step == 1 else cmd(9, step))
        net.run()
        net.tick_all(step * 50_000)
    assert lost_first_oaccept
    assert first in net.ready_cmds[1]  # ready by the count rule, its slot unchosen
    executed = [[e.command for e in done] for done in net.executed[:2]]
    if broken:
        assert executed == [[], []]
    else:
        assert all(ran[:1] == [first] and len(ran) > 30 for ran in executed), executed
        assert executed[0] == executed[1]


# ================================================================ one rule per replica count


@pytest.mark.parametrize(("replicas", "rule"), [(3, CountRule), (5, FiveRule), (7, CountRule)])
def test_each_replica_count_gets_its_rule(replicas: int, rule: type[ReadinessRule]) -> None:
    for me in (0, 1):  # the sequencer of view 0 and a follower
        r = core(replicas, me)
        assert type(r.readiness) is rule
        assert type(rule_for(r)) is rule
    # only the five-replica rule commits an owner's O-instance on the sequencer's OAccept
    assert rule.commits_on_sequencer_accept is (replicas == 5)


def test_count_rule_with_three_replicas_acknowledges_to_the_owner_and_the_sequencer() -> None:
    follower = CountRule(core(3, 2))
    assert follower.oack_targets(1) == (1, 0)
    assert follower.oack_targets(0) == (0,)  # the sequencer's own slot: it is the learner
    # (the sequencer names itself too: ``OAcceptor`` leaves its own id out when sending)
    sequencer = CountRule(core(3, 0))
    assert sequencer.oack_targets(1) == (1, 0)


@pytest.mark.parametrize("replicas", [4, 7])
def test_count_rule_with_four_or_more_acknowledges_to_the_owner_and_the_sequencer(
    replicas: int,
) -> None:
    # the owner and the sequencer are no majority: the sequencer must know who accepted, to
    # send the OAccept again to an acceptor that lost it (nobody else can)
    rule = CountRule(core(replicas, 2))
    assert rule.oack_targets(1) == (1, 0)
    assert rule.oack_targets(0) == (0,)


def test_five_rule_acknowledges_to_every_replica_unless_thrifty() -> None:
    rule = FiveRule(core(5, 2))
    assert rule.oack_targets(1) == (0, 1, 3, 4)
    assert rule.oack_targets(0) == (0, 1, 3, 4)
    assert rule.oack_targets(2) == (0,)  # our own slot: only the sequencer needs to know
    thrifty = FiveRule(core(5, 2, thrifty=True))
    assert thrifty.oack_targets(1) == (0,)
    assert thrifty.oack_targets(2) == (0,)
