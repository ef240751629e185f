"""``sdpaxos bench extender-filter`` runs small: both variants make every filter (each placing
its probe pod), the listing variant lists the pods once per filter and the cache none (what
it measures; the timings themselves are for a quiet machine)."""

from __future__ import annotations

import argparse

from bench.extender_filter import add_arguments, measure


async def test_both_variants_filter_and_only_listing_lists() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--pods", "40", "--nodes", "64", "--vcs", "4", "--rounds", "2",
                              "--batch", "3"])
    result = await measure(args)
    cache, listing = result["variants"]["cache"], result["variants"]["listing"]
    assert cache["filters"] == listing["filters"] == 6
    assert (cache["pod_lists"], listing["pod_lists"]) == (0, 6)
    assert all(row["p50_ms"] <= row["p99_ms"] <= row["max_ms"] for row in (cache, listing))
