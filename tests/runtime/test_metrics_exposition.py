"""``/metrics`` as Prometheus reads it: parsed with prometheus_client's own parser after real
traffic through a 3-replica cluster (HELP text, peer / message-kind labels, histogram counts),
and a scrape that stays cheap however many commands ran."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from consensus.messages import Command
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.histogram import DURATION_BUCKETS_S, Histogram
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.metrics import render, serve_metrics
from consensus.runtime.node import ReplicaNode
from consensus.runtime.node_stats import STALL_BUCKETS_S
from consensus.statemachine import KVStore, kv_put

from .polling import wait_until

WRITES = 40
#: samples past the million the old list kept (it then froze)
MANY_SAMPLES = 1_200_000
#: a scrape's budget: the old one walked every sample, 0.25 s for a million
SCRAPE_BUDGET_S = 0.05


def families(text: str) -> dict[str, Metric]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(family: Metric, suffix: str = "", **labels: str) -> float:
    (found,) = [s.value for s in family.samples
                if s.name == family.name + suffix and s.labels == labels]
    return float(found)


def histogram_count(family: Metric, bounds: tuple[float, ...] = DURATION_BUCKETS_S,
                    **labels: str) -> float:
    """The +Inf bucket, checked against ``_count`` and for cumulative buckets."""
    buckets = [(s.labels["le"], s.value) for s in family.samples if s.name.endswith("_bucket")
               and {k: v for k, v in s.labels.items() if k != "le"} == labels]
    assert [le for le, _ in buckets] == [*map(repr, bounds), "+Inf"]
    assert buckets[-1][0] == "+Inf"
    counts = [count for _, count in buckets]
    assert counts == sorted(counts), "buckets are cumulative"
    assert counts[-1] == value(family, "_count", **labels)
    return counts[-1]


async def traffic(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    config = load_cluster_config(path)
    nodes = [ReplicaNode(config, i, KVStore(), fsync=False) for i in range(3)]
    host, port = config.replica(0).metrics_address or ("", 0)
    server = await serve_metrics(nodes[0], host, port)
    for node in nodes:
        await node.start()
    try:
        leader = nodes[0]
        await asyncio.gather(*(
            leader.submit(Command(client_id=1, seq=i, op=kv_put(f"k{i}", "v"), keys=(f"k{i}",)))
            for i in range(1, WRITES + 1)
        ))
        await leader.submit(Command(client_id=2, seq=1, op=kv_put("blind", "v"),
                                    keys=("blind",), blind=True))
        await wait_until(lambda: len({n.executed_slot for n in nodes}) == 1, "converged")
        # what a scraper gets over HTTP
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        response = await reader.read()
        writer.close()
        head, _, body = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200 OK")
        assert b"text/plain; version=0.0.4" in head
        scraped = families(body.decode())
        stats, transport = leader.stats, leader.transport.stats
        gc.collect()  # one full pass at least, whatever thresholds other tests left behind
        text = render(leader)
        # what the text says, before the traffic below moves the counters on
        totals = {"sdpaxos_frames_sent": transport.frames_sent,
                  "sdpaxos_frames_received": transport.frames_received,
                  "sdpaxos_peer_bytes_sent": transport.bytes_sent,
                  "sdpaxos_peer_bytes_received": transport.bytes_received}
        fsyncs, turns = stats.fsyncs, stats.turns
        follower = nodes[1]

        def granted_to() -> float:
            return value(families(render(follower))["sdpaxos_lease_granted_to"])

        # a follower grants the sequencer its read lease (heartbeats ask for it)
        await wait_until(lambda: granted_to() == 0, "lease granted to the sequencer")

        def peer_positions() -> dict[str, float]:
            family = families(render(follower))["sdpaxos_peer_executed_slots"]
            return {s.labels["peer"]: s.value for s in family.samples}

        # ... and hears from the heartbeats how far the others executed
        everyone = leader.executed_slot
        await wait_until(lambda: peer_positions() == {"0": everyone, "2": everyone},
                         "the peers' positions")
        # the sequencer goes: the survivors move to a new view, and count it
        await leader.stop()
        await wait_until(lambda: follower.stats.view_changes > 0, "a view change", 10)
        after = families(render(follower))
        assert value(after["sdpaxos_view_changes"], "_total") == follower.stats.view_changes
        assert value(after["sdpaxos_view"]) == follower.core.view > 0
    finally:
        server.close()
        for node in nodes:
            await node.stop()

    # every family has its HELP text
    assert all(family.documentation for family in scraped.values()), [
        name for name, family in scraped.items() if not family.documentation]
    got = families(text)
    assert set(got) == set(scraped)

    # per peer: the leader sent CAccepts to both peers and heard back from both
    for name, total in totals.items():
        per_peer = {s.labels["peer"]: s.value for s in got[name].samples}
        assert set(per_peer) == {"1", "2"}, (name, per_peer)
        assert all(v > 0 for v in per_peer.values()), (name, per_peer)
        assert sum(per_peer.values()) == total
    # per message kind: the leader's C-instances went out, their acknowledgements came in
    sent = {s.labels["kind"]: s.value for s in got["sdpaxos_messages_sent"].samples}
    received = {s.labels["kind"]: s.value for s in got["sdpaxos_messages_received"].samples}
    assert sent["CAccept"] >= 2 and received["CAck"] >= 1, (sent, received)

    # the histograms count every event: the executed writes, the blind one, each fsync ...
    commit = got["sdpaxos_commit_latency_seconds"]
    assert histogram_count(commit, answer="executed") == WRITES
    assert histogram_count(commit, answer="ready") == 1
    assert 0 < value(commit, "_sum", answer="executed") < WRITES * 10
    assert histogram_count(got["sdpaxos_fsync_duration_seconds"]) == fsyncs > 0
    assert 0 < histogram_count(got["sdpaxos_apply_duration_seconds"]) <= turns
    assert 0 < histogram_count(got["sdpaxos_loop_turn_duration_seconds"]) <= turns
    # the collector's passes, per generation (the node timed them while it ran)
    passes = got["sdpaxos_gc_pause_seconds"]
    assert {s.labels["generation"] for s in passes.samples} == {"0", "1", "2"}
    assert histogram_count(passes, generation="2") >= 1
    # the lag probe's every measure, the longest since start among them
    stalls = got["sdpaxos_loop_stall_seconds"]
    assert histogram_count(stalls, STALL_BUCKETS_S) > 0
    assert value(stalls, "_sum") <= histogram_count(stalls, STALL_BUCKETS_S) * value(
        got["sdpaxos_loop_stall_longest_seconds"])
    # ... and the rest: the view, no view change, the kind's own gauge
    assert value(got["sdpaxos_view"]) == 0
    assert value(got["sdpaxos_view_changes"], "_total") == 0
    assert value(got["sdpaxos_commands_applied"], "_total") == WRITES + 1
    assert value(got["sdpaxos_kv_keys"]) == WRITES + 1
    assert value(got["sdpaxos_is_sequencer"]) == 1  # replica 0 is view 0's sequencer
    assert value(got["sdpaxos_lease_granted_to"]) == -1  # a sequencer grants none


def test_exposition_after_real_traffic(tmp_path: Path) -> None:
    asyncio.run(asyncio.wait_for(traffic(tmp_path), 60))


def test_a_scrape_stays_cheap_and_counts_past_a_million(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    node = ReplicaNode(load_cluster_config(path), 0, KVStore(), fsync=False)
    started = time.perf_counter()
    render(node)
    empty = time.perf_counter() - started
    latency = node.stats.executed_latency
    for i in range(MANY_SAMPLES):
        latency.observe((i % 1000) * 1e-4)  # 0 .. 99.9 ms
    started = time.perf_counter()
    text = render(node)
    full = time.perf_counter() - started
    assert full < SCRAPE_BUDGET_S, (empty, full)
    commit = families(text)["sdpaxos_commit_latency_seconds"]
    assert histogram_count(commit, answer="executed") == MANY_SAMPLES  # nothing capped
    # the sum is exact: mean of 0 .. 99.9 ms
    assert abs(value(commit, "_sum", answer="executed") / MANY_SAMPLES - 0.04995) < 1e-6


def test_histogram_buckets_and_quantiles() -> None:
    histogram = Histogram((0.001, 0.01, 0.1))
    for sample in (0.0005, 0.001, 0.002, 0.05, 5.0):
        histogram.observe(sample)
    # a sample equal to a bound is in that bound's bucket (Prometheus' "le")
    assert histogram.cumulative() == [(0.001, 2), (0.01, 3), (0.1, 4), (float("inf"), 5)]
    assert histogram.count == 5 and abs(histogram.sum - 5.0535) < 1e-9
    assert histogram.quantile(0.4) == 0.001  # the second sample: the first bucket's top
    assert 0.001 < histogram.quantile(0.5) < 0.01
    assert histogram.quantile(1.0) == 0.1  # in +Inf: the last finite bound
    assert Histogram().quantile(0.5) == 0.0
    for bad in ((), (0.1, 0.01), (0.1, 0.1)):
        try:
            Histogram(bad)
        except ValueError:
            continue
        raise AssertionError(f"bounds {bad} accepted")


def test_observing_a_value_many_times_at_once_counts_as_observing_it_each_time() -> None:
    at_once, one_by_one = Histogram((0.001, 0.01, 0.1)), Histogram((0.001, 0.01, 0.1))
    for sample, times in ((0.0005, 3), (0.001, 1), (0.05, 40), (5.0, 2), (0.05, 1)):
        at_once.observe_many(sample, times)
        for _ in range(times):
            one_by_one.observe(sample)
    assert at_once.cumulative() == one_by_one.cumulative()
    assert at_once.count == one_by_one.count == 47
    assert abs(at_once.sum - one_by_one.sum) < 1e-12


async def test_the_metrics_port_answers_exact_paths_with_head_404_and_405(
    tmp_path: Path,
) -> None:
    """Issue 34: a readline() parser matched by prefix: GET /livezzz was 200, /metricsXYZ
    served metrics, HEAD /metrics was 404."""
    import aiohttp

    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    config = load_cluster_config(path)
    node = ReplicaNode(config, 0, KVStore(), fsync=False)
    host, port = config.replica(0).metrics_address or ("", 0)
    server = await serve_metrics(node, host, port)
    await node.start()
    base = f"http://{host}:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            async def status(method: str, target: str) -> tuple[int, bytes]:
                async with session.request(method, base + target) as response:
                    return response.status, await response.read()

            code, body = await status("GET", "/metrics")
            assert code == 200 and b"sdpaxos_view" in body
            assert await status("HEAD", "/metrics") == (200, b"")
            assert (await status("GET", "/livez"))[0] == 200
            assert (await status("HEAD", "/livez"))[0] == 200
            assert (await status("GET", "/readyz"))[0] == 503  # alone: no majority heard
            for wrong in ("/livezzz", "/metricsXYZ", "/readyz/x", "/", "/metric"):
                assert (await status("GET", wrong))[0] == 404, wrong
            for method in ("POST", "PUT", "DELETE"):
                assert (await status(method, "/metrics"))[0] == 405, method
    finally:
        await server.stop()
        await node.stop()
