"""Contention in the bench (issue 26): the hot-key workload, EPaxos's latency bound, the
comparison with EPaxos, and the figures' shapes (no process started)."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import pytest

from bench import plots
from bench.bounds import fast_quorum_rtt_ms, ready_bounds_ms, sites_for
from bench.throughput import _ratios, add_arguments
from bench.workload import HotKeys, parse_key_dist


def test_hot_keys_put_the_given_share_on_one_key_and_spread_the_rest() -> None:
    keys = HotKeys(100_000, 25, random.Random(1))
    draws = [keys.next() for _ in range(20_000)]
    hot = draws.count(0) / len(draws)
    assert hot == pytest.approx(0.25, abs=0.015)
    rest = [d for d in draws if d != 0]
    assert min(rest) >= 1 and max(rest) < 100_000
    assert len(set(rest)) > 0.9 * len(rest)  # nearly all distinct
    assert all(HotKeys(10, 100, random.Random(2)).next() == 0 for _ in range(50))
    assert 0 not in {HotKeys(10, 0, random.Random(3)).next() for _ in range(200)}


def test_the_contention_distribution_is_named_hot_percent() -> None:
    chooser = parse_key_dist("hot:5", 1000, random.Random(1))
    assert isinstance(chooser, HotKeys) and chooser.share == pytest.approx(0.05)
    for bad in ("hot:x", "hot:101", "hot:-1"):
        with pytest.raises(ValueError):
            parse_key_dist(bad, 1000, random.Random(1))


def test_throughput_takes_contention_values_and_runs_all_four_protocols_by_default() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--contention", "0", "5", "25", "100"])
    assert args.contention == [0, 5, 25, 100]
    assert args.protocols == ["sdpaxos", "multipaxos", "mencius", "epaxos"]
    assert parser.parse_args([]).contention is None


def test_epaxos_bound_is_the_nearest_fast_quorum() -> None:
    # the optimized fast quorum F + floor((F+1)/2): 2 of 3 and 3 of 5, the nearest majority
    # both times (the basic 2F would be 4 of 5: 139 ms at CA)
    assert ready_bounds_ms("epaxos", sites_for(3)) == [20, 20, 52]
    assert ready_bounds_ms("epaxos", sites_for(5)) == [52, 68, 68, 125, 146]
    assert fast_quorum_rtt_ms(sites_for(5), 0) == 52  # CA: OR 20, OH 52


def result(protocol: str, contention: float | None, rate: int) -> dict[str, Any]:
    return {"protocol": protocol, "replicas": 3, "size": 16, "reads_pct": 0.0,
            "straggler": None, "contention_pct": contention, "throughput_per_s": rate,
            "throughput_min": rate - 5, "throughput_max": rate + 5}


def test_each_result_is_compared_with_epaxos_in_the_same_configuration() -> None:
    results = [result("sdpaxos", 5, 170), result("epaxos", 5, 100),
               result("sdpaxos", 25, 160), result("epaxos", 25, 80),
               result("mencius", None, 90)]
    _ratios(results)
    assert [r["vs_epaxos"] for r in results] == [1.7, 1.0, 2.0, 1.0, None]


def test_the_contention_figure_is_a_line_per_protocol(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[tuple[str, list[float]]] = []
    original = plots.contention_figure

    def spy(report: dict[str, Any], path: str) -> None:
        plt = plots._pyplot()
        real = plt.Axes.errorbar

        def errorbar(ax: Any, xs: list[float], ys: list[float], **kw: Any) -> Any:
            drawn.append((kw["label"], list(xs)))
            return real(ax, xs, ys, **kw)

        monkeypatch.setattr(plt.Axes, "errorbar", errorbar)
        original(report, path)

    monkeypatch.setattr(plots, "contention_figure", spy)
    report = {"cpu_limit": {"per_replica_cpus": 0.15}, "results": [
        result(p, c, 100) for p in ("sdpaxos", "epaxos") for c in (0, 5, 100)
    ]}
    path = tmp_path / "contention.png"
    plots.throughput_figure(report, str(path))
    assert path.stat().st_size > 0
    assert drawn == [("sdpaxos", [0, 5, 100]), ("epaxos", [0, 5, 100])]


def test_the_failover_figure_has_a_panel_per_protocol(tmp_path: Path) -> None:
    run = {"kill_at_s": 1.0, "bin_s": 0.5, "killed_site": "CA",
           "sites": [{"site": "OR", "timeline": [4, 4, 0, 3]}]}
    report = {"runs": [dict(run, protocol=p) for p in ("sdpaxos", "epaxos")]}
    path = tmp_path / "failover.png"
    plots.failover_figure(report, str(path))
    assert path.stat().st_size > 0


@pytest.mark.timeout(120)
def test_quick_contention_run_compares_sdpaxos_with_epaxos(run_bench: Any) -> None:
    report = run_bench(
        "throughput", "--quick", "--protocols", "sdpaxos,epaxos", "--contention", "5",
        "--clients", "4", "--outstanding", "8",
    )  # fmt: skip
    results = {r["protocol"]: r for r in report["results"]}
    assert sorted(results) == ["epaxos", "sdpaxos"]
    for r in results.values():
        assert r["contention_pct"] == 5 and r["throughput_per_s"] > 0
        (trial,) = r["rounds"]
        assert trial["errors"] == 0
    assert results["epaxos"]["vs_epaxos"] == 1.0
    ratio = results["sdpaxos"]["throughput_per_s"] / results["epaxos"]["throughput_per_s"]
    assert results["sdpaxos"]["vs_epaxos"] == pytest.approx(ratio, abs=0.006)
    assert "vs EPaxos" in report["_stdout"]
