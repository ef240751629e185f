"""``sdpaxos bench latency``: a smoke run on the emulated WAN (no performance asserted)."""

from __future__ import annotations

import pytest
from bench_procs import BenchRunner

from bench.bounds import ready_bounds_ms, sites_for

SUMMARY = {"count", "p50_ms", "mean_ms", "p95_ms", "p99_ms", "max_ms"}


@pytest.mark.timeout(120)
def test_quick_run_reports_both_latencies_per_site_beside_the_bound(
    run_bench: BenchRunner,
) -> None:
    report = run_bench("latency", "--quick", "--protocols", "sdpaxos,multipaxos", "--rate", "40")
    assert report["bench"] == "latency"
    rows = report["rows"]
    assert [(r["protocol"], r["site"]) for r in rows] == [
        ("sdpaxos", "CA"), ("sdpaxos", "OR"), ("sdpaxos", "OH"),
        ("multipaxos", "CA"), ("multipaxos", "OR"), ("multipaxos", "OH"),
    ]  # fmt: skip
    for row in rows:
        assert row["replicas"] == 3 and row["rate"] == 40
        assert set(row["ready"]) == SUMMARY and set(row["executed"]) == SUMMARY
        assert row["ready"]["count"] > 0 and row["executed"]["count"] > 0
        assert row["ready"]["p50_ms"] > 0 and row["executed"]["p99_ms"] > 0
        bounds = ready_bounds_ms(row["protocol"], sites_for(3))
        assert row["bound_ms"] == bounds[sites_for(3).index(row["site"])]
    assert "bound" in report["_stdout"] and "executed p50" in report["_stdout"]
