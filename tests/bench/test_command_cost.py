"""``sdpaxos bench command-cost`` runs each part it times on a real node: every request taken
in, every write acknowledged and applied (its own checks raise otherwise)."""

from __future__ import annotations

import asyncio

from bench.command_cost import measure


def test_command_cost_times_every_part_once_per_command() -> None:
    result = asyncio.run(measure(requests=500, turns=20, batch=50, puts=2_000, snapshots=2))
    assert result["batch"] == 50
    parts = ("intake_us", "feed_us", "acknowledge_us", "apply_follower_us", "apply_leader_us",
             "snapshot_ms")
    assert set(result) == {"batch", *parts}
    assert all(result[part] > 0 for part in parts), result
