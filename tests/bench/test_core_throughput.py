"""``sdpaxos bench core`` runs the protocol cores and the key-value store to the end: every
replica applies every command (slot batches through the store's batch applier)."""

from __future__ import annotations

from bench.core_throughput import measure


def test_bench_core_applies_every_command_at_every_replica() -> None:
    for codec in (False, True):
        result = measure(3, 200, 8, codec)
        assert result["commands"] >= 200 and result["commands_per_s"] > 0
