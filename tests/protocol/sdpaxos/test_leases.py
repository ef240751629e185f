"""Read leases alone (leases.py, §3.5): the lease a follower grants binds its votes, and the
sequencer serves reads while it and the unexpired grants it holds make a majority."""

from __future__ import annotations

from consensus.protocol.sdpaxos.leases import Leases

LEASE = 250_000
DRIFT_PPM = 10_000
#: a grant counts for the lease shortened by twice the drift bound: 250 ms * (1 - 0.02)
HOLD = 245_000
QUORUM_OF_3 = 2
QUORUM_OF_5 = 3


def test_a_fresh_incarnation_votes_for_nobody_for_one_lease_period() -> None:
    leases = Leases(LEASE, DRIFT_PPM)
    leases.start(1_000)
    for candidate in (0, 1, 2):  # itself included: it may have granted a lease it forgot
        assert not leases.may_vote_for(candidate, 1_000)
        assert not leases.may_vote_for(candidate, 1_000 + LEASE - 1)
        assert leases.may_vote_for(candidate, 1_000 + LEASE)


def test_a_grant_binds_the_vote_to_the_grantee_until_it_expires() -> None:
    leases = Leases(LEASE, DRIFT_PPM)
    leases.grant(0, 10_000)
    assert (leases.granted_to, leases.granted_until) == (0, 10_000 + LEASE)
    assert leases.may_vote_for(0, 10_001)  # the grantee itself
    assert not leases.may_vote_for(2, 10_001)
    assert not leases.may_vote_for(2, 10_000 + LEASE - 1)
    assert leases.may_vote_for(2, 10_000 + LEASE)
    # a renewal moves the bound; a grant to another moves the binding
    leases.grant(0, 100_000)
    assert not leases.may_vote_for(2, 10_000 + LEASE)
    leases.grant(2, 200_000)
    assert leases.may_vote_for(2, 200_001) and not leases.may_vote_for(0, 200_001)


def test_votes_blocked_at_start_stay_blocked_even_for_the_grantee() -> None:
    leases = Leases(LEASE, DRIFT_PPM)
    leases.start(0)
    leases.grant(1, 0)
    assert not leases.may_vote_for(1, LEASE - 1)
    assert leases.may_vote_for(1, LEASE)


def test_the_sequencer_alone_holds_no_lease_with_three_replicas() -> None:
    leases = Leases(LEASE, DRIFT_PPM)
    assert not leases.valid(0, QUORUM_OF_3)
    assert leases.valid(0, 1)  # a cluster of one: itself is a majority


def test_a_grant_counts_from_when_it_was_asked_for_shortened_by_the_drift() -> None:
    leases = Leases(LEASE, DRIFT_PPM)
    leases.record_grant(1, asked_at=5_000)
    assert leases.valid(5_000 + HOLD - 1, QUORUM_OF_3)
    assert not leases.valid(5_000 + HOLD, QUORUM_OF_3)
    # with no drift bound the grant counts for the whole lease
    exact = Leases(LEASE, 0)
    exact.record_grant(1, asked_at=5_000)
    assert exact.valid(5_000 + LEASE - 1, QUORUM_OF_3)
    assert not exact.valid(5_000 + LEASE, QUORUM_OF_3)


def test_a_late_answer_to_an_older_request_does_not_shorten_a_grant() -> None:
    leases = Leases(LEASE, DRIFT_PPM)
    leases.record_grant(1, asked_at=50_000)
    leases.record_grant(1, asked_at=10_000)
    assert leases.valid(50_000 + HOLD - 1, QUORUM_OF_3)


def test_with_five_replicas_it_takes_two_unexpired_grants() -> None:
    leases = Leases(LEASE, DRIFT_PPM)
    leases.record_grant(1, asked_at=0)
    assert not leases.valid(1, QUORUM_OF_5)
    leases.record_grant(2, asked_at=100_000)
    assert leases.valid(HOLD - 1, QUORUM_OF_5)
    assert not leases.valid(HOLD, QUORUM_OF_5)  # replica 1's grant expired
    leases.record_grant(3, asked_at=HOLD)
    assert leases.valid(HOLD, QUORUM_OF_5)  # replicas 2 and 3
    assert not leases.valid(100_000 + HOLD, QUORUM_OF_5)


def test_grants_held_for_an_old_view_are_dropped() -> None:
    leases = Leases(LEASE, DRIFT_PPM)
    leases.record_grant(1, asked_at=0)
    leases.record_grant(2, asked_at=0)
    assert leases.valid(1, QUORUM_OF_5)
    leases.drop_held()
    assert not leases.valid(1, QUORUM_OF_5)
    assert not leases.valid(1, QUORUM_OF_3)
    leases.record_grant(4, asked_at=0)  # grants for the new view count again
    assert leases.valid(1, QUORUM_OF_3)
