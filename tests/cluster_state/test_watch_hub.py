"""The watch hub under many watchers (issue 27 point 5), on one replica of a real 3-node cluster:
every watcher, fast or lagging, sees every event once in order; a watcher that stops reading
never holds more than its bound and is cut with ``EventsCompacted`` while the others go on; a
change after a quiet interval goes out at once, and fan-outs under load are an interval apart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

import pytest
from test_client import GPU, gang, start

from cluster_state.client import AllocationStore
from cluster_state.config import synthetic_config
from cluster_state.errors import EventsCompacted
from cluster_state.events import ChangeEvent
from cluster_state.store import ClusterStore
from cluster_state.watch_hub import Batch, WatchHub
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode

#: watchers on one hub, as many as one replica of a 3-replica cluster serves at 1,000 streams
MANY = 300
JOBS = 10  # 2 events each (placed, released)


async def _until(done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``done`` every 20 ms; fail after ``timeout_s`` (as tests/runtime/polling.py)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def _stop(store: AllocationStore, nodes: list[ReplicaNode]) -> None:
    await store.close()
    for node in nodes:
        await node.stop()


async def _read(watch: AsyncGenerator[list[Batch], None], n: int, pause_s: float,
                pages: list[int]) -> list[ChangeEvent]:
    """Take batches until ``n`` events, pausing ``pause_s`` after each take (a lagging
    reader takes several batches at once); ``pages`` gets how many batches each take held."""
    seen: list[ChangeEvent] = []
    async for batches in watch:
        pages.append(len(batches))
        seen.extend(e for b in batches for e in b.events)
        if len(seen) >= n:
            break
        await asyncio.sleep(pause_s)
    await watch.aclose()
    return seen


def test_hundreds_of_watchers_fast_and_lagging_see_every_event_once_in_order(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        hub = WatchHub(nodes[0])
        store = AllocationStore.embedded(nodes[0])
        try:
            pages: list[list[int]] = [[] for _ in range(MANY)]
            # a third read at once, the others pause 10 or 50 ms after each take
            readers = [asyncio.ensure_future(_read(hub.watch(-1), 2 * JOBS,
                                                   (0.0, 0.01, 0.05)[k % 3], pages[k]))
                       for k in range(MANY)]
            await _until(lambda: hub.watchers == MANY)
            for k in range(JOBS):
                await store.submit(gang(f"j{k}", "vc01", 100, (1, 1)))
                await store.release(f"j{k}")
            seen = await asyncio.wait_for(asyncio.gather(*readers), 30)
            truth = nodes[0].state_machine.events_since(-1)  # type: ignore[attr-defined]
            assert len(truth) == 2 * JOBS
            for events in seen:
                assert events == truth  # every event, once, in order
            # the lagging readers took what queued meanwhile in one go
            assert max(n for p in pages[2::3] for n in p) > 1
            assert hub.dropped == 0
            # fan-outs are shared: far fewer than one per watcher per event
            assert hub.batches_sent <= 2 * JOBS
            await _until(lambda: hub.watchers == 0)
        finally:
            await _stop(store, nodes)

    asyncio.run(asyncio.wait_for(run(), 60))


def test_watchers_that_stop_reading_stay_within_their_bound_and_are_cut(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        bound = 6
        hub = WatchHub(nodes[0], max_pending=bound)
        store = AllocationStore.embedded(nodes[0])
        stalled = [hub.watch(-1) for _ in range(MANY // 2)]
        readers: list[asyncio.Future[list[ChangeEvent]]] = []
        try:
            await store.submit(gang("first", "vc01", 100, (1, 1)))
            for watch in stalled:  # each takes its first page, then reads no more
                assert [e.subject for b in await anext(watch) for e in b.events] == ["first"]
            readers = [asyncio.ensure_future(_read(hub.watch(-1), 1 + 2 * JOBS, 0.0, []))
                       for _ in range(MANY // 2)]
            await _until(lambda: hub.watchers == MANY)
            held = []
            for k in range(JOBS):  # a job at a time: one or two events a fan-out
                await store.submit(gang(f"j{k}", "vc01", 100, (1, 1)))
                await store.release(f"j{k}")
                # what any watcher holds, at any time: its bound (batches are shared)
                held.append(max(w.pending for w in hub._watchers))
                assert held[-1] <= bound
            await _until(lambda: hub.dropped == MANY // 2)
            # the stalled ones hold nothing once cut, and hear why at their next read
            assert all(not w.batches for w in hub._watchers if w.compacted is not None)
            first = nodes[0].state_machine.events_since(-1)[0]  # type: ignore[attr-defined]
            for watch in stalled:
                with pytest.raises(EventsCompacted) as caught:
                    await anext(watch)
                assert caught.value.revision == first.revision  # what it took
            truth = nodes[0].state_machine.events_since(-1)  # type: ignore[attr-defined]
            for events in await asyncio.wait_for(asyncio.gather(*readers), 30):
                assert events == truth  # the readers did not notice
            await _until(lambda: hub.watchers == 0)
        finally:
            for future in readers:
                future.cancel()
            for watch in stalled:
                await watch.aclose()
            await _stop(store, nodes)

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_change_after_a_quiet_interval_goes_out_at_once_and_the_next_waits_an_interval(
    tmp_path: Path,
) -> None:
    interval = 2.0  # long, so that "at once" and "an interval later" cannot be confused

    async def run() -> None:
        nodes = await start(tmp_path)
        hub = WatchHub(nodes[0], fan_out_delay_s=interval)
        store = AllocationStore.embedded(nodes[0])
        watch = hub.watch(-1)
        try:
            taking = asyncio.ensure_future(anext(watch))
            await _until(lambda: hub.watchers == 1)
            await store.submit(gang("a", "vc01", 100, (1, 1)))
            applied = time.monotonic()  # the submit answers once node 0 applied it
            batches = await asyncio.wait_for(taking, interval / 2)  # not an interval later
            assert [e.subject for b in batches for e in b.events] == ["a"]
            fanned = time.monotonic()
            assert fanned - applied < interval / 2
            await store.release("a")  # within the interval: waits for the next fan-out
            batches = await asyncio.wait_for(anext(watch), 3 * interval)
            assert [e.kind for b in batches for e in b.events] == ["released"]
            assert time.monotonic() - applied >= interval * 0.99
            assert hub.batches_sent == 2
        finally:
            await watch.aclose()
            await _stop(store, nodes)

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_hub_refuses_impossible_settings(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        try:
            with pytest.raises(ValueError, match="max_pending"):
                WatchHub(nodes[0], max_pending=0)
            with pytest.raises(ValueError, match="fan_out_delay_s"):
                WatchHub(nodes[0], fan_out_delay_s=-1.0)
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 30))


def test_a_lagging_replica_that_installs_a_snapshot_keeps_the_watchers_it_can_serve(
    tmp_path: Path,
) -> None:
    # Replica 2 is cut off while the others run more commands than its store keeps events
    # for (and compact their logs). Back, it catches up (a snapshot or a turn longer than the
    # kept events): the hub cannot tell what it did not fan out, so each watcher is brought
    # up to date on its own: one that resumed here at a revision the cluster reached
    # meanwhile misses nothing, one still at the old position is told EventsCompacted.
    async def run() -> None:
        (tmp_path / "gpu.yaml").write_text(synthetic_config(**GPU).to_yaml())
        text = cluster_toml(3, free_base_port(), wan=False)
        (tmp_path / "cluster.toml").write_text(text)
        config = load_cluster_config(tmp_path / "cluster.toml")
        nodes = [ReplicaNode(config, i, ClusterStore(synthetic_config(**GPU), event_limit=8),
                             fsync=False, snapshot_every=20) for i in range(3)]
        for node in nodes:
            await node.start()
        store = AllocationStore.embedded(nodes[0])
        hub = WatchHub(nodes[2])
        try:
            await store.submit(gang("first", "vc01", 100, (1, 1)))
            await _until(lambda: nodes[2].executed_slot >= nodes[0].executed_slot)
            old = hub.watch(-1)
            took = [e for b in await anext(old) for e in b.events]
            assert [e.subject for e in took] == ["first"]
            for node in nodes[:2]:
                node.transport.drop_from = node.transport.drop_to = frozenset({2})
            nodes[2].transport.drop_from = nodes[2].transport.drop_to = frozenset({0, 1})
            for k in range(30):  # 60 events: far more than the 8 kept
                await store.submit(gang(f"j{k}", "vc01", 100, (1, 1)))
                await store.release(f"j{k}")
            resumed_at = nodes[0].state_machine.revision  # type: ignore[attr-defined]
            resumed = hub.watch(resumed_at)  # a watcher that saw it all at replica 0
            taking = asyncio.ensure_future(anext(resumed))
            await _until(lambda: hub.watchers == 2)
            for node in nodes:
                node.transport.drop_from = node.transport.drop_to = frozenset()
            await _until(lambda: nodes[2].executed_slot >= nodes[0].executed_slot, 30)
            await store.submit(gang("after", "vc01", 100, (1, 1)))
            batches = await asyncio.wait_for(taking, 30)
            assert [(e.kind, e.subject) for b in batches for e in b.events] == [
                ("placed", "after")]
            with pytest.raises(EventsCompacted) as caught:
                await anext(old)
            assert caught.value.revision == took[-1].revision  # what it took
            assert hub.dropped == 1
            await resumed.aclose()
        finally:
            await store.close()
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 120))

