"""The pushed watch stream (issue 27 point 5): one ``WatchHub`` per replica feeds every watch
stream from one apply hook; watchers see every event once, in order, over gRPC
(``WatchPushed``, ``AllocationStore.connect(..., watch_targets=...)``) and resume at another
replica when theirs goes away; a watcher that stops reading is dropped with
``EventsCompacted`` and holds nothing meanwhile, and the others do not notice."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import grpc
import pytest
from test_client import gang, start

from cluster_state.client import AllocationStore, PushedWatch
from cluster_state.errors import EventsCompacted
from cluster_state.events import ChangeEvent
from cluster_state.grpc_api import cluster_state_pb2 as pb
from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc
from cluster_state.grpc_api.service import serve_grpc
from cluster_state.watch_hub import WatchHub
from consensus.runtime.node import ReplicaNode

WATCHERS = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _serve(nodes: list[ReplicaNode]) -> tuple[list[grpc.aio.Server], list[str]]:
    servers, targets = [], []
    for node in nodes:
        port = _free_port()
        servers.append(await serve_grpc(node, "127.0.0.1", port))
        targets.append(f"127.0.0.1:{port}")
    return servers, targets


async def _collect(events: AsyncIterator[Sequence[ChangeEvent]], n: int) -> list[ChangeEvent]:
    out: list[ChangeEvent] = []
    async for page in events:
        out.extend(page)
        if len(out) >= n:
            break
    return out


async def _churn(store: AllocationStore, jobs: int, prefix: str = "j") -> None:
    for k in range(jobs):
        await store.submit(gang(f"{prefix}{k}", "vc01", 100, (1, 1)))
        await store.release(f"{prefix}{k}")


def test_many_pushed_watchers_see_every_event_once_in_order(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        servers, targets = await _serve(nodes)
        addresses = [spec.client_address for spec in nodes[0].config.replicas]
        pushed = PushedWatch(targets)
        store = AllocationStore.connect(addresses, home=0, watch_targets=targets)
        hooks_before = [len(node.on_apply) for node in nodes]
        try:
            expected = 2 * 12  # placed + released per job
            watching = [
                asyncio.ensure_future(_collect(pushed.watch(-1, first=k), expected))
                for k in range(WATCHERS)
            ]
            # every replica hooks its node once, however many streams it serves
            await _until(lambda: all(len(n.on_apply) == b + 1
                                     for n, b in zip(nodes, hooks_before, strict=True)))
            await _churn(store, 12)
            truth = nodes[0].state_machine.events_since(-1)  # type: ignore[attr-defined]
            seen = await asyncio.wait_for(asyncio.gather(*watching), 30)
            for events in seen:
                assert events == truth
            # the client API over the same stream, resumed after the last revision seen
            resumed = []
            async for event in store.watch(truth[5].revision):
                resumed.append(event)
                if len(resumed) == len(truth) - 6:
                    break
            assert resumed == truth[6:]
        finally:
            await store.close()
            await pushed.close()
            for server in servers:
                await server.stop(0)
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 90))


def test_a_pushed_watch_resumes_at_another_replica_exactly_once(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        servers, targets = await _serve(nodes)
        addresses = [spec.client_address for spec in nodes[0].config.replicas]
        store = AllocationStore.connect(addresses, home=0, watch_targets=targets)
        try:
            watch = store.watch(-1)
            await _churn(store, 4, "a")
            first = [await anext(watch) for _ in range(8)]
            await servers[0].stop(0)  # its stream breaks: the watch goes on at replica 1
            await _churn(store, 4, "b")
            second = [await anext(watch) for _ in range(8)]
            await watch.aclose()
            truth = nodes[1].state_machine.events_since(-1)  # type: ignore[attr-defined]
            assert first + second == truth
        finally:
            await store.close()
            for server in servers:
                await server.stop(0)
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 90))


def test_a_watcher_that_stops_reading_is_dropped_and_the_others_are_not(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        hub = WatchHub(nodes[0], max_pending=6)
        store = AllocationStore.embedded(nodes[0])
        try:
            slow = hub.watch(-1)
            fast = hub.watch(-1)
            fast_seen: list[ChangeEvent] = []

            async def read_fast() -> None:
                async for batches in fast:
                    fast_seen.extend(e for b in batches for e in b.events)

            reader = asyncio.ensure_future(read_fast())
            await _churn(store, 1, "x")  # 2 events
            assert [e.kind for b in await anext(slow) for e in b.events] == ["placed", "released"]
            for k in range(5):  # 10 more, a job at a time: beyond the slow watcher's 6
                await _churn(store, 1, f"y{k}-")
                await _until(lambda k=k: len(fast_seen) == 4 + 2 * k)  # type: ignore[misc]
            assert hub.dropped == 1
            assert hub.watchers == 2
            slow_state = next(w for w in hub._watchers if w.compacted is not None)
            assert slow_state.pending == 0 and not slow_state.batches  # holds nothing
            with pytest.raises(EventsCompacted) as caught:
                await anext(slow)
            assert caught.value.revision == fast_seen[1].revision  # what it took: 2 events
            await _until(lambda: len(fast_seen) == 12)
            assert fast_seen == nodes[0].state_machine.events_since(-1)  # type: ignore[attr-defined]
            assert hub.watchers == 1  # the dropped stream is gone
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await _until(lambda: hub.watchers == 0)
        finally:
            await store.close()
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_pushed_watch_behind_the_kept_events_gets_compacted(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path, event_limit=4)
        servers, targets = await _serve(nodes)
        addresses = [spec.client_address for spec in nodes[0].config.replicas]
        store = AllocationStore.connect(addresses, home=1, watch_targets=targets)
        channel = grpc.aio.insecure_channel(targets[2])
        try:
            await _churn(store, 3, "c")  # 6 events, 4 kept
            with pytest.raises(EventsCompacted) as caught:
                await anext(store.watch(-1))
            assert caught.value.oldest >= 0
            kept = []
            async for event in store.watch(caught.value.oldest):
                kept.append(event)
                if len(kept) == 4:
                    break
            assert [e.subject for e in kept] == ["c1", "c1", "c2", "c2"]
            # on the wire: one last message saying so, then the call ends OK
            stub = pb_grpc.AllocationServiceStub(channel)  # type: ignore[no-untyped-call]
            replies = [r async for r in stub.WatchPushed(pb.WatchRequest(since=-1))]
            assert len(replies) == 1 and replies[0].compacted and not replies[0].events
            # the older one-event-per-message Watch still works, and still says OUT_OF_RANGE
            old = [e async for e in _old_watch(stub, kept[1].revision, 2)]
            assert [(e.revision, e.kind) for e in old] == [(kept[-2].revision, "placed"),
                                                          (kept[-1].revision, "released")]
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                [e async for e in stub.Watch(pb.WatchRequest(since=-1))]
            assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE
        finally:
            await channel.close()
            await store.close()
            for server in servers:
                await server.stop(0)
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


async def _old_watch(stub: pb_grpc.AllocationServiceStub, since: int,
                     n: int) -> AsyncIterator[pb.Event]:
    call = stub.Watch(pb.WatchRequest(since=since))
    k = 0
    async for event in call:
        yield event
        k += 1
        if k == n:
            call.cancel()
            return


async def _until(done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``done`` every 20 ms; fail after ``timeout_s`` (as tests/runtime/polling.py)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)
