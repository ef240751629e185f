"""Multi-Paxos leader failover (``consensus.protocol.multipaxos``): phase-1 takeover that
recovers the log, stepping down, and leader leases for reads."""

from __future__ import annotations

import random

import pytest
from util import Flight, Net, cmd, config, msgs, records_of, turn

from consensus.messages import (
    Command,
    Heartbeat,
    LeaseGrant,
    PaxosAccept,
    PaxosCommit,
    PaxosForward,
    PaxosPrepare,
    PaxosPromise,
    PaxosPromiseRecord,
)
from consensus.protocol import multipaxos
from consensus.protocol.ballot import ballot_of
from consensus.protocol.multipaxos import MultiPaxosReplica

ELECTION_US = 300_000
LEASE_US = 250_000


def cluster(n: int = 3, **changes: object) -> Net:
    conf = config(n, election_timeout_us=ELECTION_US, lease_us=LEASE_US, **changes)
    return Net(conf, MultiPaxosReplica)


def replica(me: int, n: int = 3, **changes: object) -> MultiPaxosReplica:
    conf = config(n, election_timeout_us=ELECTION_US, lease_us=LEASE_US, **changes)
    return MultiPaxosReplica(conf, me, rng=random.Random(me))


def run_ticks(net: Net, start: int, stop: int, step: int = 25_000) -> int:
    now = start
    while now < stop:
        now += step
        net.tick_all(now)
    return now


def test_followers_elect_a_new_leader_that_keeps_what_may_have_been_chosen() -> None:
    net = cluster()
    net.propose(0, cmd(1, 1, keys=("k",)))
    # the Accept reaches replica 1 only, the commit nobody: slot 0 may have been chosen
    net.lose = lambda src, dst, msg: (src == 0 and (dst == 2 or isinstance(msg, PaxosCommit)))
    net.run()
    assert not net.executed[1] and not net.executed[2]
    net.lose = lambda src, dst, msg: 0 in (src, dst)  # the leader is gone
    now = run_ticks(net, 0, 4 * ELECTION_US)
    leaders = [r for r in (1, 2) if net.cores[r].is_leader]
    assert len(leaders) == 1
    new = net.cores[leaders[0]]
    assert new.ballot > ballot_of(0, 0) and new.ballot % 256 == leaders[0]
    # slot 0 keeps the command replica 1 accepted; both survivors executed it
    assert [e.command.seq for e in net.executed[1]] == [1]
    assert [e.command.seq for e in net.executed[2]] == [1]
    # new commands go after it, through the new leader (forwarded from the other survivor)
    other = 3 - leaders[0]
    net.propose(other, cmd(7, 2, keys=("k",)))
    run_ticks(net, now, now + 200_000)
    assert [(e.slot, e.command.seq) for e in net.executed[other]] == [(0, 1), (1, 2)]


def test_holes_the_old_leader_left_become_no_ops() -> None:
    candidate = replica(1)
    candidate.tick(0)
    candidate.advance(candidate.ready())
    candidate.tick(2 * ELECTION_US)  # nothing heard from replica 0: a candidacy
    ready = candidate.ready()
    candidate.advance(ready)
    prepares = msgs(ready.send_after_persist, PaxosPrepare)
    assert [to for to, _ in prepares] == [0, 2]
    ballot = prepares[0][1].ballot
    assert records_of(ready, PaxosPromiseRecord) == [PaxosPromiseRecord(ballot=ballot)]
    # replica 2 accepted slot 2 only (slots 0 and 1 never reached it)
    from consensus.messages import CVote

    promise = PaxosPromise(src=2, view=0, ballot=ballot, ok=True, from_slot=0, through=2,
                           complete=True,
                           accepted=(CVote(index=2, ballot=0, batch=(cmd(1, 5, keys=("k",)),)),))
    ready = turn(candidate, promise, now=2 * ELECTION_US)
    accepts = {m.slot: m.batch for _, m in msgs(ready.send_after_persist, PaxosAccept)}
    assert accepts == {0: (), 1: (), 2: (cmd(1, 5, keys=("k",)),)}
    assert candidate.is_leader and candidate.next_slot == 3


def test_a_page_limited_promise_is_completed_before_taking_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(multipaxos, "PROMISE_ENTRIES", 2)
    acceptor = replica(2)
    for slot in range(5):
        batch = (cmd(1, slot, keys=("k",)),)
        turn(acceptor, PaxosAccept(src=0, view=0, slot=slot, ballot=0, batch=batch))
    ballot = ballot_of(1, 1)
    later = 2 * ELECTION_US  # past the restart guard (a lease's length from boot)
    ready = turn(acceptor, PaxosPrepare(src=1, view=0, ballot=ballot, from_slot=0), now=later)
    [(_, page)] = msgs(ready.send_after_persist, PaxosPromise)
    assert not page.complete and [v.index for v in page.accepted] == [0, 1]
    assert page.through == 1
    ready = turn(acceptor, PaxosPrepare(src=1, view=0, ballot=ballot, from_slot=2), now=later)
    [(_, page)] = msgs(ready.send_after_persist, PaxosPromise)
    assert [v.index for v in page.accepted] == [2, 3] and not page.complete
    # the candidate asks for the next page instead of deciding on a partial report
    candidate = replica(1)
    candidate.tick(0)
    candidate.advance(candidate.ready())
    candidate.tick(2 * ELECTION_US)
    candidate.advance(candidate.ready())
    first = PaxosPromise(src=2, view=0, ballot=ballot, ok=True, from_slot=0, through=1,
                         complete=False, accepted=())
    ready = turn(candidate, first, now=2 * ELECTION_US)
    assert not candidate.is_leader
    assert [m.from_slot for _, m in msgs(ready.send_after_persist, PaxosPrepare)] == [2]


def test_a_granted_lease_keeps_a_follower_from_promising_another_candidate() -> None:
    follower = replica(2)
    follower.tick(0)
    follower.advance(follower.ready())
    beat = Heartbeat(src=0, view=0, executed=0, lease_request=10)
    later = 2 * LEASE_US  # the restart guard (a lease's length from boot) has passed
    ready = turn(follower, beat, now=later)
    assert msgs(ready.send, LeaseGrant) == [(0, LeaseGrant(src=2, view=0, request=10))]
    ready = turn(follower, PaxosPrepare(src=1, view=0, ballot=ballot_of(1, 1), from_slot=0),
                 now=later + LEASE_US // 2)
    assert ready.send_after_persist == [] and follower.promised == 0
    ready = turn(follower, PaxosPrepare(src=1, view=0, ballot=ballot_of(1, 1), from_slot=0),
                 now=later + 2 * LEASE_US)
    assert msgs(ready.send_after_persist, PaxosPromise)[0][1].ok
    assert follower.promised == ballot_of(1, 1)


def test_lease_reads_are_local_at_a_leader_holding_a_majority_lease() -> None:
    net = cluster()
    net.propose(0, cmd(1, 1, keys=("k",)))
    net.run()
    leader = net.cores[0]
    read = Command(client_id=9, seq=1, op=b"get", keys=("k",))
    leader.read(read, 0)
    # a turn to carry the read (no lease yet, so it goes through the log)
    net.propose(0, cmd(1, 2, keys=("k",)))
    net.run()
    assert read in net.reads[0] and (9, 1) in [e[1:] for e in net.executed_ids(0)]
    run_ticks(net, 0, 2 * LEASE_US)  # heartbeats ask for a lease, followers grant it
    before = len(net.executed[0])
    second = Command(client_id=9, seq=2, op=b"get", keys=("k",))
    leader.read(second, net.now)
    net.bag.append(Flight(1, 0, PaxosForward(src=1, view=0, commands=())))
    net.run()
    assert second in net.reads[0] and len(net.executed[0]) == before  # served locally


@pytest.mark.parametrize("unsafe", [False, True])
def test_a_deposed_leader_without_lease_does_not_serve_stale_reads(unsafe: bool) -> None:
    net = cluster(unsafe=frozenset({"no_lease_check"}) if unsafe else frozenset())
    net.propose(0, cmd(1, 1, keys=("k",)))
    net.run()
    net.lose = lambda src, dst, msg: 0 in (src, dst)  # the old leader is cut off
    now = run_ticks(net, 0, 4 * ELECTION_US)
    new = next(r for r in (1, 2) if net.cores[r].is_leader)
    net.propose(new, cmd(3, 2, keys=("k",)))  # a write the old leader never hears of
    now = run_ticks(net, now, now + 100_000)
    old = net.cores[0]
    assert old.is_leader  # it has not heard of the new leader
    read = Command(client_id=9, seq=1, op=b"get", keys=("k",))
    old.read(read, now)
    ready = old.ready()
    old.advance(ready)
    # the unsafe variant answers from a state that misses the acknowledged write
    assert (read in ready.reads) == unsafe


def test_a_leader_that_learns_a_higher_ballot_forwards_its_clients_commands() -> None:
    old = replica(0)
    turn(old, cmd(1, 1, keys=("k",)))  # proposed in slot 0, not chosen
    ballot = ballot_of(1, 2)
    ready = turn(old, Heartbeat(src=2, view=ballot, executed=0, lease_request=5), now=1)
    assert not old.is_leader and old.leader == 2
    forwards = msgs(ready.send, PaxosForward)
    assert forwards and forwards[0][0] == 2 and forwards[0][1].commands == (cmd(1, 1, keys=("k",)),)


def test_a_restarted_replica_remembers_its_promise_and_does_not_lead() -> None:
    follower = replica(1)
    follower.tick(0)
    follower.advance(follower.ready())
    ready = turn(follower, PaxosPrepare(src=2, view=0, ballot=ballot_of(1, 2), from_slot=0),
                 now=2 * LEASE_US)
    again = MultiPaxosReplica(follower.config, 1, recovered=ready.persist,
                              rng=random.Random(1))
    assert again.promised == ballot_of(1, 2) and again.leader == 2 and not again.is_leader
    batch = (cmd(1, 1, keys=("k",)),)
    ready = turn(again, PaxosAccept(src=0, view=0, slot=0, ballot=0, batch=batch))
    [(_, refusal)] = msgs(ready.send_after_persist, PaxosPromise)
    assert not refusal.ok and refusal.ballot == ballot_of(1, 2)
