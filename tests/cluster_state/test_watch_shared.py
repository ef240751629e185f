"""Watches that fan out cheaply (issue 37 point 4), over real gRPC servers on a 3-replica
cluster: the watchers of one process share one stream per replica (``PushedWatch``, and every
``AllocationStore`` connected to the same replicas), each from its own start revision, and
see every event once in order, across a replica's failure; a watcher that stops reading is
dropped in its own process while the others sharing its stream go on (the replica never cuts
the stream); a watch from now at a replica that lags starts after everything the cluster
acknowledged before it; a replica of an older build is told apart."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_client import gang, start, take
from test_watch_pushed import _collect, _until

from cluster_state.client import AllocationStore
from cluster_state.errors import EventsCompacted, OlderReplica
from cluster_state.events import ChangeEvent
from cluster_state.grpc_api import cluster_state_pb2 as pb
from cluster_state.grpc_api.service import AllocationServicer, _add_service
from cluster_state.pushed_watch import PushedWatch
from cluster_state.watch_hub import WatchHub
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode


class _Served:
    """Each node's gRPC service, with its servicer's hub (what streams a replica serves)."""

    def __init__(self) -> None:
        self.servers: list[grpc.aio.Server] = []
        self.targets: list[str] = []
        self.hubs: list[WatchHub] = []

    async def add(self, servicer: AllocationServicer) -> None:
        server = grpc.aio.server()
        _add_service(servicer, server)
        port = free_base_port()
        assert server.add_insecure_port(f"127.0.0.1:{port}") == port
        await server.start()
        self.servers.append(server)
        self.targets.append(f"127.0.0.1:{port}")
        self.hubs.append(servicer._hub)

    def streams(self) -> list[int]:
        return [hub.watchers for hub in self.hubs]


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path, servicer: type[AllocationServicer] = AllocationServicer,
                  ) -> AsyncIterator[tuple[list[ReplicaNode], _Served, AllocationStore]]:
    """Three replicas, each serving gRPC, and a store at replica 0 (watching over them)."""
    nodes = await start(tmp_path)
    found = _Served()
    try:
        for node in nodes:
            await found.add(servicer(node))
        addresses = [spec.client_address for spec in nodes[0].config.replicas]
        async with AllocationStore.connect(addresses, home=0,
                                           watch_targets=found.targets) as store:
            yield nodes, found, store
    finally:
        for server in found.servers:
            await server.stop(0)
        for node in nodes:
            await node.stop()


async def _churn(store: AllocationStore, jobs: int, prefix: str) -> None:
    for k in range(jobs):
        await store.submit(gang(f"{prefix}{k}", "vc01", 100, (1, 1)))
        await store.release(f"{prefix}{k}")


def _truth(node: ReplicaNode) -> list[ChangeEvent]:
    return node.state_machine.events_since(-1)  # type: ignore[attr-defined, no-any-return]


def test_the_watchers_of_a_process_share_one_stream_per_replica(tmp_path: Path) -> None:
    watchers = 30

    async def run() -> None:
        # the cluster's store, connected to the same replicas in this process, shares it
        async with cluster(tmp_path) as (nodes, grpc_, store), \
                PushedWatch.shared(grpc_.targets) as pushed:
            expected = 2 * 8
            pages = [asyncio.ensure_future(_collect(pushed.watch(-1, first=k), expected))
                     for k in range(watchers)]
            events = [asyncio.ensure_future(take(store.watch(-1), expected))
                      for _ in range(5)]
            # 35 watchers, 3 streams: one per replica, whoever opened them
            await _until(lambda: grpc_.streams() == [1, 1, 1])
            assert pushed.streams == 3
            await _churn(store, 4, "j")
            # replica 0's stream breaks: its watchers go on together at replica 1
            await grpc_.servers[0].stop(0)
            await _churn(store, 4, "k")
            truth = _truth(nodes[0])
            assert len(truth) == expected
            for seen in await asyncio.wait_for(asyncio.gather(*pages, *events), 30):
                assert seen == truth  # every event, once, in order
            assert pushed.streams == 0  # every watch ended: so did its stream
            await _until(lambda: grpc_.streams() == [0, 0, 0])

    asyncio.run(asyncio.wait_for(run(), 90))


def test_a_later_watcher_joins_the_stream_from_its_own_revision(tmp_path: Path) -> None:
    async def run() -> None:
        async with cluster(tmp_path) as (nodes, grpc_, store), \
                PushedWatch(grpc_.targets, max_pending=4) as pushed:
            seen: list[ChangeEvent] = []

            async def read() -> None:
                async for page in pushed.watch(-1):
                    seen.extend(page)

            reader = asyncio.ensure_future(read())
            try:
                await _until(lambda: grpc_.streams()[0] == 1)
                for k in range(3):  # a job a message: the stream keeps the last two
                    await _churn(store, 1, f"a{k}-")
                    await _until(lambda k=k: len(seen) == 2 * k + 2)  # type: ignore[misc]
                truth = _truth(nodes[0])
                assert seen == truth
                # from a revision the stream still keeps: it joins at once
                joined = pushed.watch(truth[3].revision)
                assert await anext(joined) == tuple(truth[4:])
                assert grpc_.streams()[0] == 1 and pushed.streams == 1
                # from before it: a stream of its own, folded into the shared one as soon as
                # the shared one can replay what it misses
                behind = pushed.watch(-1)
                assert await anext(behind) == tuple(truth)
                await _until(lambda: pushed.streams == 1)
                await _until(lambda: grpc_.streams()[0] == 1)
                await _churn(store, 2, "b")
                more = _truth(nodes[0])[6:]
                assert len(more) == 4
                for watch in (joined, behind):
                    assert await _collect(watch, 4) == more
                await _until(lambda: seen[6:] == more)
                for watch in (joined, behind):
                    await watch.aclose()
                reader.cancel()
                await _until(lambda: grpc_.streams()[0] == 0)
            finally:
                reader.cancel()

    asyncio.run(asyncio.wait_for(run(), 90))


def test_a_watcher_that_stops_reading_does_not_stall_the_others_on_its_stream(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        async with cluster(tmp_path) as (nodes, grpc_, store), \
                PushedWatch(grpc_.targets, max_pending=6) as pushed:
            fast_seen: list[list[ChangeEvent]] = [[] for _ in range(5)]

            async def read(k: int) -> None:
                async for page in pushed.watch(-1):
                    fast_seen[k].extend(page)

            readers = [asyncio.ensure_future(read(k)) for k in range(5)]
            slow = pushed.watch(-1)
            try:
                await _until(lambda: grpc_.streams()[0] == 1)
                await _churn(store, 1, "x")
                took = await anext(slow)  # its first page; then it reads no more
                assert took[0].subject == "x0"
                for k in range(8):  # 16 more events, a job at a time: beyond its 6
                    await _churn(store, 1, f"y{k}-")
                    # the others have every event of the job before the next one starts
                    await _until(lambda k=k: all(  # type: ignore[misc]
                        len(seen) == 4 + 2 * k for seen in fast_seen))
                assert pushed.dropped == 1  # dropped here, in its process ...
                assert grpc_.hubs[0].dropped == 0  # ... not by the replica: the stream went on
                with pytest.raises(EventsCompacted) as caught:
                    await anext(slow)
                assert caught.value.revision == took[-1].revision  # what it took
                truth = _truth(nodes[0])
                assert all(seen == truth for seen in fast_seen)
                assert grpc_.streams()[0] == 1
            finally:
                for reader in readers:
                    reader.cancel()
                await asyncio.gather(*readers, return_exceptions=True)
                await slow.aclose()

    asyncio.run(asyncio.wait_for(run(), 90))


def _isolate(node: ReplicaNode, peers: set[int]) -> None:
    node.transport.drop_from = node.transport.drop_to = frozenset(peers)


def test_a_watch_from_now_at_a_lagging_replica_starts_after_what_was_acknowledged(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        async with cluster(tmp_path) as (nodes, grpc_, store), \
                PushedWatch(grpc_.targets) as pushed:
            await _churn(store, 1, "old")
            await _until(lambda: nodes[2].executed_slot >= nodes[0].executed_slot)
            _isolate(nodes[2], {0, 1})
            await _churn(store, 3, "acked")  # acknowledged by 0 and 1; 2 hears nothing
            acked = _truth(nodes[0])[-1].revision  # the last release's
            # (not equal: a log-time command applied since moves the revision, no event)
            assert await store.revision() >= acked
            lagging = nodes[2].state_machine.revision  # type: ignore[attr-defined]
            assert lagging < nodes[0].state_machine.revision  # type: ignore[attr-defined]
            hooks = len(nodes[2].on_apply)
            remote = pushed.watch(first=2, from_now=True)
            local = AllocationStore.embedded(nodes[2]).watch(from_now=True)
            taking = [asyncio.ensure_future(_collect(remote, 4)),
                      asyncio.ensure_future(take(local, 4))]
            await asyncio.sleep(0.3)  # both wait for their read: 2 cannot answer yet
            assert grpc_.streams()[2] == 0 and len(nodes[2].on_apply) == hooks
            _isolate(nodes[2], set())
            # each read answered, and then it subscribed (the hub and the embedded watch
            # hook the node): what applies from now on is after where they start
            await _until(lambda: grpc_.streams()[2] == 1)
            await _until(lambda: len(nodes[2].on_apply) == hooks + 2)
            before = _truth(nodes[0])
            await _churn(store, 2, "new")
            after = _truth(nodes[0])[len(before):]
            assert [e.subject for e in after] == ["new0", "new0", "new1", "new1"]
            for seen in await asyncio.wait_for(asyncio.gather(*taking), 30):
                assert seen == after  # nothing acknowledged before, nothing missed

    asyncio.run(asyncio.wait_for(run(), 120))


class _OlderServicer(AllocationServicer):
    """A replica of a build that predates ``WatchRequest.from_now``: it ignores the field."""

    async def WatchAcked(self, requests: AsyncIterator[pb.WatchControl],
                         context: Any) -> AsyncIterator[Any]:
        async def without_from_now() -> AsyncIterator[pb.WatchControl]:
            async for control in requests:
                if control.WhichOneof("control") == "start":
                    control.start.from_now = False
                yield control

        async for reply in super().WatchAcked(without_from_now(), context):
            yield reply


def test_a_watch_from_now_at_an_older_replica_says_so(tmp_path: Path) -> None:
    async def run() -> None:
        async with cluster(tmp_path, _OlderServicer) as (_, grpc_, store), \
                PushedWatch(grpc_.targets) as pushed:
            await _churn(store, 1, "a")
            with pytest.raises(OlderReplica, match="from_now"):
                await anext(pushed.watch(from_now=True))
            with pytest.raises(ValueError, match="not both"):
                await anext(pushed.watch(3, from_now=True))

    asyncio.run(asyncio.wait_for(run(), 60))


def test_stores_sharing_a_stream_close_it_with_the_last_one(tmp_path: Path) -> None:
    async def run() -> None:
        async with cluster(tmp_path) as (nodes, grpc_, one):
            addresses = [spec.client_address for spec in nodes[0].config.replicas]
            async with AllocationStore.connect(addresses, watch_targets=grpc_.targets) as two:
                watch_one, watch_two = one.watch(-1), two.watch(-1)
                await _churn(one, 1, "a")
                assert (await anext(watch_one)).subject == "a0"
                assert (await anext(watch_two)).subject == "a0"
                assert grpc_.streams()[0] == 1
                await one.close()  # its watch ends after what it was given ...
                assert all([e.subject == "a0" async for e in watch_one])
                # ... and the other store's goes on over the same stream
                assert (await anext(watch_two)).kind == "released"
                await _churn(two, 1, "b")
                assert [(await anext(watch_two)).kind for _ in range(2)] == ["placed",
                                                                              "released"]
                assert grpc_.streams()[0] == 1
                await two.close()  # the last one: the stream ends
                with pytest.raises(StopAsyncIteration):
                    await anext(watch_two)
                await _until(lambda: grpc_.streams()[0] == 0)

    asyncio.run(asyncio.wait_for(run(), 60))
