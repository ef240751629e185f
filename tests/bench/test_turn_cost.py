"""``sdpaxos bench turn-cost`` measures what it says: the turns of three real replica nodes
and the CPU of their parts, and leaves ``TurnLoop`` as it found it."""

from __future__ import annotations

import asyncio

from bench.turn_cost import measure
from consensus.runtime.turns import TurnLoop


def test_turn_cost_counts_every_nodes_turns_and_restores_the_loop() -> None:
    feed, carry_out = TurnLoop._feed, TurnLoop._carry_out
    result = asyncio.run(measure(40, 1, fsync=False, warmup=5, profile=None))
    assert (TurnLoop._feed, TurnLoop._carry_out) == (feed, carry_out)
    # one write at a time: each takes turns at the three replicas (client request, C-phase,
    # O-phase), never fewer than one
    assert result["turns"] >= 40 and result["turns_per_write"] >= 1
    # the sequencer's Accept to each peer, and each peer's acknowledgement back
    assert result["peer_frames_per_write"] >= 4
    parts = result["turn_parts_us"]
    assert set(parts) == {"feed", "tick", "ready", "carry_out"}
    assert all(value >= 0 for value in parts.values()) and parts["carry_out"] > 0
    assert abs(sum(parts.values()) - result["turn_us"]) < 1.0  # (each part rounded)
    assert result["process_us_per_write"] >= result["turn_cpu_us_per_write"] > 0
