"""``sdpaxos bench reads``: smoke runs on the LAN and the emulated WAN (no performance
asserted)."""

from __future__ import annotations

import argparse

import pytest
from bench_procs import BenchRunner

from bench.reads import parse_workload


@pytest.mark.timeout(120)
def test_quick_run_measures_reads_and_writes_per_workload(run_bench: BenchRunner) -> None:
    report = run_bench("reads", "--quick", "--workloads", "uniform-1:1", "zipf-9:1",
                       "--keys", "10000")  # fmt: skip
    assert report["bench"] == "reads"
    assert [r["workload"] for r in report["rows"]] == ["uniform-1:1", "zipf-9:1"]
    for row in report["rows"]:
        assert row["protocol"] == "sdpaxos" and row["site"] is None
        assert row["read_throughput_per_s"] > 0 and row["write_throughput_per_s"] > 0
        assert row["read_latency_ms"]["count"] > 0 and row["write_latency_ms"]["count"] > 0
    zipf = report["rows"][1]
    assert zipf["read_throughput_per_s"] > zipf["write_throughput_per_s"]  # 9:1 mix, not speed


@pytest.mark.timeout(120)
def test_quick_wan_run_reports_read_latency_per_site_beside_the_bound(
    run_bench: BenchRunner,
) -> None:
    report = run_bench("reads", "--quick", "--wan", "--workloads", "zipf-1:1", "--rate", "30",
                       "--keys", "10000")  # fmt: skip
    rows = report["rows"]
    assert [r["site"] for r in rows] == ["CA", "OR", "OH"]
    assert [r["read_bound_ms"] for r in rows] == [0.0, 20.0, 52.0]
    assert all(r["read_latency_ms"]["count"] > 0 for r in rows)


def test_workloads_parse_to_a_key_distribution_and_a_read_share() -> None:
    assert parse_workload("zipf-9:1") == ("zipf", 0.9)
    assert parse_workload("uniform-1:1") == ("uniform", 0.5)
    assert parse_workload("uniform-1:0") == ("uniform", 1.0)
    for bad in ("zipf", "normal-1:1", "zipf-a:b", "zipf-0:0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_workload(bad)
