"""Message cost of reads and writes in the simulator (paper §3.5)."""

from __future__ import annotations

import pytest

from bench.msg_cost import measure


@pytest.mark.parametrize("replicas", [3, 5])
def test_a_read_away_from_the_sequencer_costs_two_messages(replicas: int) -> None:
    cost = measure(replicas, ops=120)
    assert cost["reads_remote"] > 30 and cost["reads_at_sequencer"] > 10
    # one RRequest and one RReply (a rare retransmission aside); local reads cost nothing
    assert 2.0 <= cost["per_read_remote"] < 2.1
    # a write's C-phase: an accept to every peer, the acknowledgements — the proposer's own to
    # every peer (its Accept leaves before its acceptance is durable), and the acceptors' to
    # the proposer with three replicas, to every replica with five — and the commits: to every
    # peer with five; with three only to the acceptor whose acknowledgement came after the
    # choice (the other learns it from the proposer's own; the WAN's delays never bring both
    # in one turn)
    peers = replicas - 1
    acks = peers + (peers if replicas == 3 else peers * peers)
    commits = peers - 1 if replicas == 3 else peers
    assert cost["per_write_c_phase"] == peers + acks + commits
    assert cost["per_write"] > 5 * cost["per_read_remote"]
