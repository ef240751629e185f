"""Mencius revocation of a suspected owner's slots (``consensus.protocol.mencius``)."""

from __future__ import annotations

import random

from util import Net, cmd, config, msgs, records_of, turn

from consensus.messages import (
    CVote,
    MenciusAccept,
    MenciusAck,
    MenciusPrepare,
    MenciusPromise,
    MenciusPromiseRecord,
    PaxosAccept,
    PaxosCommit,
)
from consensus.protocol.ballot import ballot_of
from consensus.protocol.mencius import REVOKE_AHEAD, REVOKE_SPAN, MenciusReplica
from consensus.protocol.ready import Ready

ELECTION_US = 300_000


def replica(me: int, n: int = 3, **changes: object) -> MenciusReplica:
    return MenciusReplica(config(n, election_timeout_us=ELECTION_US, **changes), me,
                          rng=random.Random(me))


def cluster(n: int = 3, **changes: object) -> Net:
    return Net(config(n, election_timeout_us=ELECTION_US, **changes), MenciusReplica)


def stuck_revoker() -> tuple[MenciusReplica, MenciusPrepare]:
    """Replica 1 knows of its own command in slot 1 and waits for owner 0's slot 0, while
    replica 0 stays silent: it revokes 0's slots."""
    r1 = replica(1)
    turn(r1, cmd(1, 1, keys=("k",)), now=0)
    now = 0
    prepares: list[MenciusPrepare] = []
    while not prepares:
        now += 50_000
        assert now < 10 * ELECTION_US, "no revocation"
        r1.tick(now)
        ready = r1.ready()
        r1.advance(ready)
        prepares = [m for _, m in msgs(ready.send_after_persist, MenciusPrepare)]
        if prepares:
            assert records_of(ready, MenciusPromiseRecord)[0].owner == 0
    return r1, prepares[0]


def test_a_replica_stuck_at_a_silent_owners_slot_revokes_its_slots() -> None:
    r1, prepare = stuck_revoker()
    assert prepare.owner == 0 and prepare.start == 0
    # REVOKE_SPAN of owner 0's slots beyond what the live replicas propose in (r1's next
    # own slot is 4: owner 0's slots from 6 on)
    assert prepare.stop == 6 + REVOKE_SPAN * 3 and prepare.ballot == ballot_of(1, 1)
    # replica 2 accepted 0's command in slot 3; nobody accepted anything in slot 0
    promise = MenciusPromise(src=2, view=0, owner=0, start=0, stop=prepare.stop,
                             ballot=prepare.ballot, ok=True,
                             accepted=(CVote(index=3, ballot=0, batch=(cmd(0, 7, keys=("k",)),)),))
    ready = turn(r1, promise, now=10 * ELECTION_US)
    accepts = {m.slot: m.batch for _, m in msgs(ready.send_after_persist, PaxosAccept)}
    assert accepts[0] == () and accepts[3] == (cmd(0, 7, keys=("k",)),)
    assert set(accepts) == set(range(0, prepare.stop, 3))
    # a majority acknowledges: the revoked slots are chosen, and the log runs again
    ack = MenciusAck(src=2, view=0, ballot=prepare.ballot, slots=(0, 3), skip_start=0,
                     skip_stop=0)
    ready = turn(r1, ack, now=10 * ELECTION_US)
    commits = {m.slot for _, m in msgs(ready.send_after_persist, PaxosCommit)}
    assert {0, 3} <= commits
    assert r1.slots[0].committed and r1.slots[0].batch == ()


def test_an_acceptor_that_promised_refuses_the_owners_lower_ballot() -> None:
    r2 = replica(2)
    r2.tick(0)
    ready = turn(r2, MenciusPrepare(src=1, view=0, owner=0, start=0, stop=30,
                                    ballot=ballot_of(1, 1)))
    [(_, promise)] = msgs(ready.send_after_persist, MenciusPromise)
    assert promise.ok and promise.accepted == ()
    assert records_of(ready, MenciusPromiseRecord) == [
        MenciusPromiseRecord(owner=0, start=0, stop=30, ballot=ballot_of(1, 1))
    ]
    late = MenciusAccept(src=0, view=0, slot=6, ballot=0, batch=(cmd(0, 1, keys=("k",)),),
                         skip_start=0, skip_stop=0)
    ready = turn(r2, late)
    assert msgs(ready.send_after_persist, MenciusAck) == []
    # a lower ballot of another revoker is refused, naming the promise
    ready = turn(r2, MenciusPrepare(src=0, view=0, owner=0, start=0, stop=30,
                                    ballot=ballot_of(0, 0) + 256))
    [(_, refusal)] = msgs(ready.send_after_persist, MenciusPromise)
    assert not refusal.ok and refusal.ballot == ballot_of(1, 1)


def test_an_owner_whose_proposal_was_revoked_proposes_it_again() -> None:
    r0 = replica(0)
    turn(r0, cmd(0, 1, keys=("k",)))  # slot 0
    ballot = ballot_of(1, 1)
    ready = turn(r0, MenciusPrepare(src=1, view=0, owner=0, start=0, stop=30, ballot=ballot))
    assert msgs(ready.send_after_persist, MenciusPromise)[0][1].ok
    assert r0.next_own == 30  # its slots there are the revoker's now
    ready = turn(r0, PaxosCommit(src=1, view=0, slot=0, ballot=ballot, batch=()))
    again = msgs(ready.send_after_persist, MenciusAccept)
    assert [(to, m.slot, m.batch) for to, m in again] == [
        (peer, 30, (cmd(0, 1, keys=("k",)),)) for peer in (1, 2)
    ]


def test_the_cluster_runs_on_without_a_crashed_replica() -> None:
    net = cluster()
    net.lose = lambda src, dst, msg: 0 in (src, dst)  # replica 0 is gone
    net.propose(1, cmd(1, 1, keys=("k",)))
    net.propose(2, cmd(2, 1, keys=("k",)))
    now = 0
    while not (net.executed[1] and net.executed[2]) and now < 20 * ELECTION_US:
        now += 50_000
        net.tick_all(now)
    assert [e.command.client_id for e in net.executed[1]] == [1, 2]
    assert [e.command.client_id for e in net.executed[2]] == [1, 2]


def test_a_silent_owners_next_range_is_revoked_before_the_proposals_reach_it() -> None:
    r1, prepare = stuck_revoker()
    now = 10 * ELECTION_US
    turn(r1, MenciusPromise(src=2, view=0, owner=0, start=0, stop=prepare.stop,
                            ballot=prepare.ballot, ok=True, accepted=()), now=now)
    # the revocation completes (replica 2 acknowledges its no-ops, and replica 1's command)
    turn(r1, MenciusAck(src=2, view=0, ballot=prepare.ballot,
                        slots=tuple(range(0, prepare.stop, 3)), skip_start=0, skip_stop=0),
         MenciusAck(src=2, view=0, ballot=1, slots=(1,), skip_start=0, skip_stop=0), now=now)
    # replica 2 proposes on, up to within half a span of the revoked range's end; replica 0
    # stays silent: replica 1 (the first live replica after it) revokes the next range now,
    # before execution stops there again
    near_end = prepare.stop - REVOKE_AHEAD * 3 + 2  # one of replica 2's slots
    turn(r1, MenciusAccept(src=2, view=0, slot=near_end, ballot=2,
                           batch=(cmd(2, 1, keys=("j",)),), skip_start=2, skip_stop=near_end),
         now=now + 1)
    ready = tick_turn(r1, now + 2)
    [ahead] = {m for _, m in msgs(ready.send_after_persist, MenciusPrepare)}  # to each peer
    assert ahead.owner == 0 and ahead.start == prepare.stop
    assert ahead.stop >= near_end + REVOKE_SPAN * 3 and ahead.ballot > 0
    # while it still has half a span ahead, nothing more is revoked
    ready = tick_turn(r1, now + 3)
    assert not msgs(ready.send_after_persist, MenciusPrepare)


def tick_turn(core: MenciusReplica, now: int) -> Ready:
    core.tick(now)
    ready = core.ready()
    core.advance(ready)
    return ready
