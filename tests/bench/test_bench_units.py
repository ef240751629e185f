"""Unit tests of the benchmark machinery: workload generators, latency bounds, cgroup
detection, load splitting, the session's cleanup on failure, and the throughput table's
notes."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections import Counter
from pathlib import Path

import pytest
from bench_procs import processes_mentioning

from bench.bounds import majority_rtt_ms, read_bounds_ms, ready_bounds_ms, sites_for
from bench.cgroups import CpuLimiter
from bench.harness import BenchSession, _intersect, spread, summary_ms
from bench.loadgen import new_histogram
from bench.workload import PoissonArrivals, UniformKeys, ZipfKeys, key_name, make_put, zeta
from consensus.config import SITES

# ---------------------------------------------------------------------------- Poisson


def test_poisson_arrivals_have_the_rate_and_exponential_gaps() -> None:
    rate = 500.0
    times = PoissonArrivals(rate, random.Random(7), start=10.0).until(10.0 + 200.0)
    assert times[0] > 10.0 and times == sorted(times)
    assert len(times) == pytest.approx(rate * 200, rel=0.02)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / rate, rel=0.02)
    # exponential: standard deviation equals the mean, P(gap > mean) = 1/e
    assert statistics.pstdev(gaps) == pytest.approx(mean, rel=0.05)
    assert sum(g > mean for g in gaps) / len(gaps) == pytest.approx(math.exp(-1), abs=0.01)


def test_poisson_arrivals_are_reproducible_and_validate_the_rate() -> None:
    first = PoissonArrivals(20, random.Random(3)).until(5.0)
    assert first == PoissonArrivals(20, random.Random(3)).until(5.0)
    assert first != PoissonArrivals(20, random.Random(4)).until(5.0)
    process = PoissonArrivals(20, random.Random(3))
    assert process.peek() == process.pop() == first[0] and process.peek() == first[1]
    with pytest.raises(ValueError):
        PoissonArrivals(0, random.Random(1))


# ---------------------------------------------------------------------------- Zipf


def test_zeta_is_the_generalized_harmonic_number() -> None:
    assert zeta(1, 0.99) == 1.0
    assert zeta(3, 0.5) == pytest.approx(1 + 2**-0.5 + 3**-0.5)


def test_zipf_keys_follow_the_distribution() -> None:
    n, draws = 1000, 200_000
    zipf = ZipfKeys(n, 0.99, random.Random(11))
    counts = Counter(zipf.next() for _ in range(draws))
    assert min(counts) >= 0 and max(counts) < n
    # items 0 and 1 are drawn exactly by the method; the tail approximately
    for item in (0, 1):
        assert counts[item] / draws == pytest.approx(zipf.probability(item), rel=0.03)
    for lo, hi in ((2, 10), (10, 100), (100, 1000)):
        expected = sum(zipf.probability(i) for i in range(lo, hi))
        observed = sum(counts[i] for i in range(lo, hi)) / draws
        assert observed == pytest.approx(expected, rel=0.15)
    assert sum(zipf.probability(i) for i in range(n)) == pytest.approx(1.0)
    # skewed: the 1% most popular keys take a large share, unlike uniform keys
    top = sum(counts[i] for i in range(10)) / draws
    uniform = Counter(UniformKeys(n, random.Random(11)).next() for _ in range(draws))
    assert top > 0.3 > 10 * sum(uniform[i] for i in range(10)) / draws


def test_zipf_keys_are_reproducible_and_validate_arguments() -> None:
    a = [ZipfKeys(500, 0.99, random.Random(5)).next() for _ in range(1)]
    assert a == [ZipfKeys(500, 0.99, random.Random(5)).next()]
    for n, theta in ((1, 0.99), (10, 0.0), (10, 1.0)):
        with pytest.raises(ValueError):
            ZipfKeys(n, theta, random.Random(1))


def test_puts_have_the_exact_command_size() -> None:
    for size in (16, 64, 255, 256, 1024, 4096):
        assert len(make_put(key_name(123), size)) == size
    assert len(make_put(key_name(1), 1)) == len(make_put(key_name(1), 0))  # the smallest


# ---------------------------------------------------------------------------- bounds


def test_bounds_match_the_design_document() -> None:
    three, five = sites_for(3), sites_for(5)
    assert three == ("CA", "OR", "OH") and five == SITES
    assert ready_bounds_ms("sdpaxos", three) == [20, 20, 52]
    assert ready_bounds_ms("sdpaxos", five) == [52, 68, 68, 139, 146]
    assert ready_bounds_ms("multipaxos", three) == [20, 40, 72]
    assert ready_bounds_ms("mencius", five) == [majority_rtt_ms(five, i) for i in range(5)]
    assert majority_rtt_ms(five, 3) == 125  # IRE: OH (84), OR (125); SDPaxos pays 139 (CA)
    assert read_bounds_ms("sdpaxos", three) == [0, 20, 52]
    assert read_bounds_ms("multipaxos", three) == [20, 40, 72]


def test_bounds_follow_the_leader() -> None:
    assert ready_bounds_ms("sdpaxos", sites_for(3), leader=1) == [20, 20, 68]
    assert ready_bounds_ms("multipaxos", sites_for(3), leader=1) == [40, 20, 88]
    with pytest.raises(ValueError):
        ready_bounds_ms("raft", sites_for(3))  # (EPaxos has one now: test_bench_contention)


# ---------------------------------------------------------------------------- cgroups


def _fake_v1(tmp_path: Path) -> tuple[str, str]:
    mount = tmp_path / "cpu"
    (mount / "bench").mkdir(parents=True)
    (mount / "bench" / "cpu.cfs_quota_us").write_text("-1\n")
    return f"cgroup {mount} cgroup rw,relatime,cpu 0 0\n", "3:cpu,cpuacct:/bench\n0::/\n"


def test_cgroup_v1_limits_are_written_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mounts, own = _fake_v1(tmp_path)
    # a plain directory does not sprout control files as a cgroup does: give it one
    monkeypatch.setattr(Path, "mkdir", _mkdir_with(("cpu.cfs_quota_us",)))
    limiter = CpuLimiter.detect(mounts_text=mounts, cgroup_text=own, environ={})
    assert limiter.kind == "cgroup-v1" and limiter.base == tmp_path / "cpu" / "bench"
    assert limiter.limit(4242, 0.25, "r0")
    group = limiter.base / f"{limiter.prefix}-r0"
    assert (group / "cpu.cfs_period_us").read_text() == "10000"
    assert (group / "cpu.cfs_quota_us").read_text() == "2500"
    assert (group / "cgroup.procs").read_text() == "4242"
    assert limiter.limits == {"r0": 0.25}
    assert not limiter.limit(4243, 0, "r1")  # 0: unlimited
    assert limiter.limit(4244, 0.04, "r2")  # under 0.1 CPU: a longer period, 1 ms quota
    assert (limiter.base / f"{limiter.prefix}-r2" / "cpu.cfs_period_us").read_text() == "25000"
    assert (limiter.base / f"{limiter.prefix}-r2" / "cpu.cfs_quota_us").read_text() == "1000"
    assert CpuLimiter.quota_for(1.5) == (15_000, 10_000)
    for made in limiter.created:
        for child in made.iterdir():
            child.unlink()  # the kernel does this for real groups
    limiter.close()
    assert not group.exists() and limiter.created == []


def _mkdir_with(files: tuple[str, ...]):  # type: ignore[no-untyped-def]
    original = Path.mkdir

    def mkdir(self: Path, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        for name in files:
            (self / name).write_text("")

    return mkdir


def test_cgroup_v2_needs_the_cpu_controller(tmp_path: Path) -> None:
    mount = tmp_path / "unified"
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("memory pids\n")
    limiter = CpuLimiter.detect(
        mounts_text=f"cgroup2 {mount} cgroup2 rw 0 0\n", cgroup_text="0::/\n", environ={}
    )
    assert limiter.kind == "none" and not limiter.available
    assert "cpu controller is not available" in limiter.reason
    assert not limiter.limit(1, 0.5, "r0")
    limiter.close()


def test_no_cgroups_or_switched_off_means_unlimited_with_a_reason() -> None:
    nothing = CpuLimiter.detect(mounts_text="proc /proc proc rw 0 0\n", cgroup_text="", environ={})
    assert nothing.kind == "none" and "no cgroup file system" in nothing.reason
    off = CpuLimiter.detect(environ={"SDPAXOS_BENCH_CGROUP": "off"})
    assert off.kind == "none" and "SDPAXOS_BENCH_CGROUP" in off.reason


# ---------------------------------------------------------------------------- load plans


def test_connections_spread_over_replicas_and_processes() -> None:
    loads = spread([0, 1, 2], SITES, connections=7, outstanding=8, processes=2)
    assert sum(load.connections for load in loads) == 7
    assert {load.replica for load in loads} == {0, 1, 2}
    assert {load.process for load in loads} == {0, 1}
    assert all(load.site == SITES[load.replica] and load.outstanding == 8 for load in loads)
    leader_only = spread([0], SITES, connections=4, outstanding=1, processes=2)
    assert [(x.replica, x.process, x.connections) for x in leader_only] == [(0, 0, 2), (0, 1, 2)]


def test_a_site_stalls_only_while_all_its_generators_do() -> None:
    both = _intersect([(1.0, 0.5), (3.0, 1.0)], [(1.2, 1.0), (3.5, 0.2)])
    assert [start for start, _ in both] == [1.2, 3.5]
    assert [length for _, length in both] == pytest.approx([0.3, 0.2])
    assert _intersect([(1.0, 0.1)], [(2.0, 0.1)]) == []


def test_latency_summaries_come_from_the_hdr_histogram() -> None:
    histogram = new_histogram()
    for value_us in range(1000, 101_000, 1000):  # 1..100 ms
        histogram.record_value(value_us)
    summary = summary_ms(histogram)
    assert summary["count"] == 100
    assert summary["p50_ms"] == pytest.approx(50, rel=0.01)
    assert summary["p99_ms"] == pytest.approx(99, rel=0.01)
    assert summary["mean_ms"] == pytest.approx(50.5, rel=0.01)
    assert summary_ms(new_histogram())["p50_ms"] is None


# ---------------------------------------------------------------------------- session


@pytest.mark.timeout(60)
def test_the_session_stops_its_replicas_when_the_bench_fails(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    with pytest.raises(RuntimeError, match="bench failed"), BenchSession("t", str(workdir)) as s:
        cluster = s.start_cluster("sdpaxos", 3, "sdpaxos")
        assert len(processes_mentioning(str(workdir))) == 3
        assert cluster.processes
        raise RuntimeError("bench failed")
    assert processes_mentioning(str(workdir)) == []
    assert workdir.exists()  # a --workdir is kept (logs), a temporary one removed
    with BenchSession("t", None) as temporary:
        root = temporary.root
        assert root.exists()
    assert not root.exists()


def test_the_throughput_table_says_when_requests_erred_or_timed_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.throughput import show

    latency = {"count": 1, "p50_ms": 1.0, "mean_ms": 1.0, "p95_ms": 1.0, "p99_ms": 1.0,
               "max_ms": 1.0}

    def result(protocol: str, errors: int, timeouts: int) -> dict[str, object]:
        trial = {"cpu": {"replica-0": 0.1}, "errors": errors, "timeouts": timeouts,
                 "first_error": "boom" if errors else ""}
        return {"protocol": protocol, "replicas": 3, "size": 1024, "reads_pct": 0.0,
                "straggler": None, "throughput_per_s": 10, "throughput_min": 9,
                "throughput_max": 11, "loss_pct": None, "write_latency_ms": latency,
                "read_latency_ms": latency, "rounds": [trial, dict(trial)]}

    show({"settings": {"clients": 72, "outstanding": 32},
          "cpu_limit": {"per_replica_cpus": 0.15, "mechanism": "cgroup-v1"},
          "results": [result("sdpaxos", 0, 48), result("mencius", 2, 0),
                      result("multipaxos", 0, 0)]})
    out = capsys.readouterr().out
    assert "sdpaxos, 3 replicas, 1024 B: 96 requests timed out" in out
    assert "--outstanding" in out
    assert "mencius, 3 replicas, 1024 B: 4 requests answered with an error (first: boom)" in out
    assert out.count("timed out") == 1 and "multipaxos, 3 replicas, 1024 B:" not in out
