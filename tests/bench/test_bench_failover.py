"""``sdpaxos bench failover``: a smoke run that kills the sequencer and the Multi-Paxos leader
(no timing asserted)."""

from __future__ import annotations

import pytest
from bench_procs import BenchRunner

from bench.failover import stall_after


@pytest.mark.timeout(180)
def test_quick_run_kills_the_sequencer_and_reports_a_timeline_per_site(
    run_bench: BenchRunner,
) -> None:
    # the same kill for SDPaxos (its sequencer) and Multi-Paxos (its leader): both fail over
    report = run_bench("failover", "--quick", "--protocols", "sdpaxos,multipaxos")
    assert report["bench"] == "failover"
    runs = {run["protocol"]: run for run in report["runs"]}
    assert sorted(runs) == ["multipaxos", "sdpaxos"]
    assert runs["sdpaxos"]["new_sequencer"] in ("OR", "OH")
    for protocol, run in runs.items():
        assert run["killed_site"] == "CA"
        assert [s["site"] for s in run["sites"]] == ["CA", "OR", "OH"]
        bins = round((run["kill_at_s"] + report["settings"]["after_s"]) / run["bin_s"])
        for site in run["sites"]:
            assert len(site["timeline"]) == bins
            assert site["throughput_before_per_s"] > 0
            if not site["killed"]:
                assert site["stall_ms"] is not None and site["stall_ms"] > 0, protocol
                assert site["resumed_after_kill_ms"] is not None, protocol
                assert sum(site["timeline"][int(run["kill_at_s"] / run["bin_s"]) + 1 :]) > 0
        assert report["stall_ms"][protocol]["sites_measured"] == 2


def test_the_stall_is_the_longest_gap_that_spans_the_kill() -> None:
    gaps = [(1.0, 0.08), (2.95, 0.3), (3.5, 0.06), (9.0, 1.0)]
    assert stall_after(gaps, kill_at=3.0, horizon=2.0) == pytest.approx((0.3, 0.25))
    assert stall_after([(1.0, 0.08)], kill_at=3.0, horizon=2.0) == (None, None)
