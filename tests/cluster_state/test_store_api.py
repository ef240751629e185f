"""Issue 21 point 6 (the API) and issue 27 point 5 (a slow watcher): list-then-watch from the
revision a list carries misses and repeats nothing under concurrent writes (embedded and over
gRPC); a pushed-watch client that stops reading is cut with ``EventsCompacted`` end to end over
a real gRPC server, having been sent a bounded amount; ``NotFound`` and releasing twice; named
pods and event details; the standard health service and reflection; an embedded store's
``async with`` unhooks the watches it opened."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from test_client import gang, grpc_served, start, take

from cluster_state import (
    AllocationStore,
    ChangeEvent,
    NotFound,
    Placed,
    PlacedDetails,
    Pod,
)
from cluster_state.client import PushedWatch
from cluster_state.errors import EventsCompacted
from cluster_state.grpc_api import cluster_state_pb2 as pb
from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc
from cluster_state.grpc_api.service import SERVICE_NAME, serve_grpc
from cluster_state.store import ClusterStore
from cluster_state.watch_hub import ACK_WINDOW
from consensus.runtime.local_cluster import free_base_port

#: jobs the concurrent writer places and releases while the lists are read
CHURN_JOBS = 40


async def _churn(store: AllocationStore, jobs: int, prefix: str) -> None:
    """Place ``jobs`` groups, releasing every other one: the live set keeps changing."""
    for k in range(jobs):
        await store.submit(gang(f"{prefix}{k}", f"vc0{k % 2}", 100, (1, 1)))
        if k % 2:
            await store.release(f"{prefix}{k}")


def _replay(names: set[str], events: list[ChangeEvent]) -> set[str]:
    """The set of groups after ``events``, from ``names``; fails on an event that cannot
    follow what came before (a duplicate placement, a release of a group not there)."""
    live = set(names)
    for event in events:
        if event.kind == "placed":
            assert event.subject not in live, f"placed twice: {event}"
            live.add(event.subject)
        elif event.kind == "released":
            assert event.subject in live, f"released without being there: {event}"
            live.remove(event.subject)
    return live


async def _until_revision(watch: AsyncIterator[list[ChangeEvent]], last: int
                          ) -> list[ChangeEvent]:
    seen: list[ChangeEvent] = []
    async for page in watch:
        seen.extend(page)
        if seen[-1].revision >= last:
            return seen
    return seen


async def _list_then_watch(
    listing: Callable[[], Awaitable[tuple[int, set[str]]]],
    watch: Callable[[int], AsyncIterator[list[ChangeEvent]]],
    writer: AllocationStore, truth: ClusterStore, prefix: str,
) -> None:
    churning = asyncio.ensure_future(_churn(writer, CHURN_JOBS, prefix))
    # list while the writer runs: after a few of its changes, before it is done
    await _poll(lambda: len(truth.events.events) >= 6)
    revision, names = await listing()
    assert not churning.done()
    pages = watch(revision)
    try:
        await churning
        final = await writer.allocations()  # linearizable: after every write
        await _poll(lambda: truth.revision >= final.revision)  # this replica too
        seen = await _until_revision(pages, truth.events.events[-1].revision)
    finally:
        await pages.aclose()  # type: ignore[attr-defined]
    # exactly the events after the list, in order: none lost, none twice ...
    assert seen == truth.events_since(revision)
    # ... so the list plus them is the state now
    assert _replay(names, seen) == {g["name"] for g in final}


def test_list_then_watch_misses_and_repeats_nothing_embedded_and_over_grpc(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        truth = nodes[0].state_machine
        assert isinstance(truth, ClusterStore)
        async with grpc_served(nodes) as targets:
            writer = AllocationStore.embedded(nodes[1])
            embedded = AllocationStore.embedded(nodes[0])
            pushed = PushedWatch(targets)
            channel = grpc.aio.insecure_channel(targets[2])
            stub = pb_grpc.AllocationServiceStub(channel)  # type: ignore[no-untyped-call]
            try:
                async def embedded_list() -> tuple[int, set[str]]:
                    groups = await embedded.allocations()
                    return groups.revision, {g["name"] for g in groups}

                def embedded_watch(revision: int) -> AsyncIterator[list[ChangeEvent]]:
                    return _paged(embedded.watch(revision))

                await _list_then_watch(embedded_list, embedded_watch, writer, truth, "e")

                async def grpc_list() -> tuple[int, set[str]]:
                    reply = await stub.ListAllocations(pb.QueryRequest(typed=True), timeout=10)
                    assert not reply.json  # typed: no JSON copy
                    return reply.revision, {g.name for g in reply.groups}

                await _list_then_watch(grpc_list, lambda r: pushed.watch(r, first=1), writer,
                                       truth, "g")
            finally:
                await channel.close()
                await pushed.close()
                await writer.close()
                await embedded.close()
        for node in nodes:
            await node.stop()

    asyncio.run(asyncio.wait_for(run(), 20))


async def _paged(events: AsyncIterator[ChangeEvent]) -> AsyncIterator[list[ChangeEvent]]:
    async for event in events:
        yield [event]


def test_a_watcher_that_stops_reading_is_cut_with_events_compacted_over_grpc(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        port = free_base_port()
        server = await serve_grpc(nodes[0], "127.0.0.1", port, watch_max_pending=32)
        target = f"127.0.0.1:{port}"
        writer = AllocationStore.embedded(nodes[0])
        pushed = PushedWatch([target])
        try:
            watch = pushed.watch(-1)
            await writer.submit(gang("first", "vc00", 100, (1, 1)))
            first = await anext(watch)
            assert [e.subject for e in first] == ["first"]
            # It stops reading; the writer makes far more events than the replica may send
            # it unacknowledged (ACK_WINDOW / 2) plus what it may queue for it (32).
            async def job(name: str) -> None:  # two events
                await writer.submit(gang(name, "vc01", 100, (1, 1)))
                await writer.release(name)

            jobs = ACK_WINDOW // 2
            for k in range(0, jobs, 16):
                await asyncio.gather(*(job(f"s{j}") for j in range(k, min(k + 16, jobs))))
            # ... then reads again: what was sent, then the end of the stream
            received = len(first)
            with pytest.raises(EventsCompacted) as caught:
                async for page in watch:
                    received += len(page)
            # it was sent about half the window (and a message more), not the 1,024 events
            assert received <= ACK_WINDOW // 2 + 128
            assert caught.value.revision > 0 and caught.value.oldest >= caught.value.revision
            # and a new watch from where it got to resumes
            resumed = pushed.watch(caught.value.revision)
            assert (await anext(resumed))[0].revision > caught.value.revision
            await resumed.aclose()
        finally:
            await pushed.close()
            await server.stop(0)
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 20))


def test_a_watch_acked_stream_must_start_with_where_to_start(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        async with grpc_served(nodes[:1]) as (target,):
            channel = grpc.aio.insecure_channel(target)
            stub = pb_grpc.AllocationServiceStub(channel)  # type: ignore[no-untyped-call]
            try:
                call = stub.WatchAcked(iter([pb.WatchControl(ack=5)]))
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call.read()
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                # acks that are stale or not acks at all are ignored; the stream goes on
                writer = AllocationStore.embedded(nodes[0])
                await writer.submit(gang("after", "vc00", 100, (1, 1)))
                call = stub.WatchAcked(iter([pb.WatchControl(start=pb.WatchRequest(since=-1)),
                                             pb.WatchControl(ack=-7), pb.WatchControl()]))
                first = await call.read()
                assert [e.subject for e in first.events] == ["after"]
                call.cancel()
            finally:
                await channel.close()
        for node in nodes:
            await node.stop()

    asyncio.run(asyncio.wait_for(run(), 20))


def test_not_found_release_twice_and_named_fields(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        async with AllocationStore.embedded(nodes[0]) as store:
            placed = await store.submit(gang("a", "vc00", 100, (2, 1)))
            assert isinstance(placed, Placed)
            pod = placed.pods[0]
            assert isinstance(pod, Pod) and pod.leaves == 1 and pod.node
            leaves, host, devices = pod  # still a tuple
            assert (leaves, host, devices) == (pod.leaves, pod.node, pod.devices)
            status = await store.status("a")
            assert status is not None and status["pods"][0].node == pod.node
            first = await store.release("a")
            assert not first.already_released
            again = await store.release("a")
            assert again.already_released and again.promoted == ()
            for call in (store.release("never"), store.release_if("never", 1),
                         store.vc("nope"), store.allocations("nope")):
                with pytest.raises(NotFound):
                    await call
            assert await store.status("never") is None
            events = await take(store.watch(-1), 2)
            assert [e.kind for e in events] == ["placed", "released"]
            details = events[0].details
            assert isinstance(details, PlacedDetails) and details.pods[0] == pod
            assert details.token == placed.token and events[1].details is None
        for node in nodes:
            await node.stop()

    asyncio.run(asyncio.wait_for(run(), 20))


def test_an_embedded_store_in_async_with_unhooks_its_open_watches(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        hooks = len(nodes[0].on_apply)
        async with AllocationStore.embedded(nodes[0]) as store:
            await store.submit(gang("w", "vc00", 100, (1, 1)))
            watch = store.watch(-1)
            assert (await anext(watch)).subject == "w"  # left open, never closed
            assert len(nodes[0].on_apply) == hooks + 1
        assert len(nodes[0].on_apply) == hooks  # the store stopped what it started
        with pytest.raises(StopAsyncIteration):  # and the watch is over
            await anext(watch)
        for node in nodes:
            await node.stop()

    asyncio.run(asyncio.wait_for(run(), 20))


def test_grpc_health_follows_readiness(tmp_path: Path) -> None:
    """Issue 34: grpc.health.v1 said SERVING for as long as the server ran, while /readyz
    said 503 (a replica cut off from the majority)."""
    serving, not_serving = (health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING)

    async def run() -> None:
        nodes = await start(tmp_path)
        async with grpc_served(nodes[:1]) as (target,):
            channel = grpc.aio.insecure_channel(target)
            try:
                checks = health_pb2_grpc.HealthStub(channel)
                request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
                assert (await checks.Check(request, timeout=10)).status == serving
                watch = checks.Watch(request)
                assert (await anext(aiter(watch))).status == serving
                for node in nodes[1:]:  # the majority is gone: replica 0 is not ready
                    await node.stop()
                async with asyncio.timeout(10):  # pushed to the watcher as it changes
                    assert (await anext(aiter(watch))).status == not_serving
                assert (await checks.Check(request, timeout=10)).status == not_serving
                whole = health_pb2.HealthCheckRequest(service="")
                assert (await checks.Check(whole, timeout=10)).status == not_serving
                watch.cancel()
            finally:
                await channel.close()
        following = [t for t in asyncio.all_tasks() if t.get_name() == "grpc-health"]
        assert len(following) == 1
        await nodes[0].stop()
        # the refresher ends with the replica (before, a loop closed within a refresh period
        # of the stop destroyed it pending)
        assert following[0].done()

    asyncio.run(asyncio.wait_for(run(), 30))


def test_health_and_reflection_are_served_next_to_the_api(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        async with grpc_served(nodes[:1]) as (target,):
            channel = grpc.aio.insecure_channel(target)
            try:
                checks = health_pb2_grpc.HealthStub(channel)
                for name in ("", SERVICE_NAME):
                    reply = await checks.Check(health_pb2.HealthCheckRequest(service=name),
                                               timeout=10)
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await checks.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
                assert caught.value.code() == grpc.StatusCode.NOT_FOUND
                reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
                request = reflection_pb2.ServerReflectionRequest(list_services="")
                replies = [r async for r in reflection.ServerReflectionInfo(iter([request]))]
                names = {s.name for s in replies[0].list_services_response.service}
                assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names
                request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=
                                                                 "sdpaxos.cluster_state.v1.Group")
                replies = [r async for r in reflection.ServerReflectionInfo(iter([request]))]
                assert replies[0].file_descriptor_response.file_descriptor_proto
            finally:
                await channel.close()
        for node in nodes:
            await node.stop()

    asyncio.run(asyncio.wait_for(run(), 20))


async def _poll(done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``done`` every 10 ms; fail after ``timeout_s`` (as tests/runtime/polling.py)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)

