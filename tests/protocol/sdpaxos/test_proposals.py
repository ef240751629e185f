"""Our own proposals' lifecycle (proposals.py): every outcome a client is told, told once.

Replica 1 of three; each test drives the real core to the state it needs (its own C-instances
in the C-instance store) and asks ``OwnProposals`` directly, reading the turn's ``Ready``.
"""

from __future__ import annotations

import random

from util import drain

from consensus.config import ProtocolConfig
from consensus.protocol.ballot import ballot_of
from consensus.protocol.sdpaxos import SDPaxosReplica
from consensus.protocol.sdpaxos.instances import CInstance
from consensus.protocol.sdpaxos.proposals import COVERED_BY_SNAPSHOT, RECOVERED_WITHOUT

from .builders import A, B, C, D, cack, ccommit


def proposed(*batches: tuple, unsafe: frozenset[str] = frozenset()) -> SDPaxosReplica:
    """Replica 1 with one own instance per batch (indexes 0, 1, ...), nothing decided."""
    r = SDPaxosReplica(ProtocolConfig(replicas=3, unsafe=unsafe), 1, rng=random.Random(0))
    for batch in batches:
        for command in batch:
            r.propose(command, 0)
        drain(r)
    assert dict(r.proposals.pending) == dict(enumerate(batches))
    return r


def test_chosen_and_ordered_proposals_are_ready_in_order_and_once() -> None:
    r = proposed((A,), (B,), (C,))
    for index in (0, 2):  # chosen: 0 and 2, not 1
        r.step(cack(0, 1, index), 0)
    drain(r)
    r.proposals.ready_below(3)
    assert r.out.ready == [A, C] and dict(r.proposals.pending) == {1: (B,)}
    r.proposals.ready_below(3)
    assert r.out.ready == [A, C]  # told once


def test_nothing_beyond_the_ordered_prefix_is_ready() -> None:
    r = proposed((A,), (B,))
    for index in (0, 1):
        r.step(cack(0, 1, index), 0)
    drain(r)
    r.proposals.ready_below(1)
    assert r.out.ready == [A] and list(r.proposals.pending) == [1]


def test_an_executed_proposal_is_ready_whatever_the_ready_rule_waits_for() -> None:
    r = proposed((A, B))
    r.proposals.executed(0, (A, B))
    assert r.out.ready == [A, B] and not r.proposals.pending


def test_a_proposal_decided_with_another_value_fails_indefinitely() -> None:
    r = proposed((A, B))
    noop = CInstance(ballot_of(1, 2), (B,))  # a recoverer chose B only
    r.proposals.decided(0, noop)
    assert [(f.command, f.definite, f.reason) for f in r.out.failed] == [
        (A, False, RECOVERED_WITHOUT)
    ]
    assert not r.proposals.pending  # B is not told anything here: it executes and is answered


def test_decided_as_proposed_tells_nothing_yet() -> None:
    r = proposed((A,))
    r.proposals.decided(0, CInstance(1, (A,)))
    assert r.out.failed == [] and list(r.proposals.pending) == [0]


def test_the_broken_variant_reports_a_recovered_proposal_as_definitely_failed() -> None:
    # what every core did before issue 39 (a teeth test: interaction/test_scripts.py)
    r = proposed((A,), unsafe=frozenset({"definite_recovered"}))
    r.proposals.decided(0, CInstance(ballot_of(1, 2), ()))
    assert [(f.command, f.definite) for f in r.out.failed] == [(A, True)]


def test_proposals_a_snapshot_covers_fail_for_a_retry() -> None:
    r = proposed((A,), (B,), (C, D))
    r.proposals.covered_by_snapshot(2)
    assert [(f.command, f.definite, f.reason) for f in r.out.failed] == [
        (A, False, COVERED_BY_SNAPSHOT), (B, False, COVERED_BY_SNAPSHOT)
    ]
    assert r.proposals.carry_over() == [C, D]


def test_a_restart_reports_what_its_records_held_like_the_old_incarnation() -> None:
    r = proposed((A,), (B,))
    again = SDPaxosReplica(r.config, 1, recovered=r.durable_records(), rng=r.rng)
    assert not again.proposals.pending  # found, not driven yet: the peers may have decided them
    again.proposals.executed(0, (A,))  # executed as proposed: ready
    again.proposals.decided(1, CInstance(ballot_of(1, 0), ()))  # a no-op: failed
    assert again.out.ready == [A]
    assert [(f.command, f.definite) for f in again.out.failed] == [(B, False)]


def test_a_restart_drives_its_undecided_proposals_again_once_caught_up() -> None:
    r = proposed((A,), (B,))
    r.step(ccommit(0, 1, 0, (A,)), 0)  # decided (not yet ordered)
    drain(r)
    again = SDPaxosReplica(r.config, 1, recovered=r.durable_records(), rng=r.rng)
    again.proposals.resume_after_restart()
    assert dict(again.proposals.pending) == {0: (A,), 1: (B,)}
    assert again.c_store[(1, 1)].leading  # ours, at our own ballot: we lead it again
