"""``AllocationStore`` against three in-process replicas serving a ``ClusterStore``: embedded
and remote calls, linearizable queries, the watch stream (resumed across replicas, pushed by
the apply hook, compacted, cancelled), idempotent retries, bind, clear errors for bad
requests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cluster_state.client import AllocationStore, InvalidRequest
from cluster_state.config import synthetic_config
from cluster_state.errors import EventsCompacted
from cluster_state.events import ChangeEvent
from cluster_state.ops import Conflict, GroupSpec, Member, Placed, PodPlacement
from cluster_state.plugin import gpu_config_path
from cluster_state.store import ClusterStore
from consensus.errors import IndefiniteFailure
from consensus.messages import Command
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.statemachine import KVStore

GPU: dict[str, Any] = dict(nodes=16, gpus_per_node=8, nodes_per_rack=4, vcs=2, pinned=1)


def gang(name: str, vc: str = "vc00", priority: int = 100, *sizes: tuple[int, int]) -> GroupSpec:
    return GroupSpec(name=name, vc=vc, priority=priority,
                     members=tuple(Member(p, g) for p, g in (sizes or ((1, 8),))))


async def start(tmp_path: Path, event_limit: int = 4096) -> list[ReplicaNode]:
    (tmp_path / "gpu.yaml").write_text(synthetic_config(**GPU).to_yaml())
    text = cluster_toml(3, free_base_port(), wan=False)
    text += '\n[state_machine]\nkind = "cluster_state"\ngpu_config = "gpu.yaml"\n'
    (tmp_path / "cluster.toml").write_text(text)
    config = load_cluster_config(tmp_path / "cluster.toml")
    assert gpu_config_path(config) == tmp_path / "gpu.yaml"
    nodes = [
        ReplicaNode(config, i, ClusterStore(synthetic_config(**GPU), event_limit=event_limit),
                    fsync=False)
        for i in range(3)
    ]
    for node in nodes:
        await node.start()
    return nodes


@contextlib.asynccontextmanager
async def grpc_served(nodes: list[ReplicaNode]) -> AsyncIterator[list[str]]:
    """Each node's gRPC service (where remote watches are pushed from); yields the targets."""
    from cluster_state.grpc_api.service import serve_grpc

    servers, targets = [], []
    for node in nodes:
        port = free_base_port()
        servers.append(await serve_grpc(node, "127.0.0.1", port))
        targets.append(f"127.0.0.1:{port}")
    try:
        yield targets
    finally:
        for server in servers:
            await server.stop(0)


async def take(events: AsyncIterator[ChangeEvent], n: int) -> list[ChangeEvent]:
    out = []
    async for event in events:
        out.append(event)
        if len(out) == n:
            return out
    return out


def test_embedded_and_remote_schedulers_share_one_store(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        addresses = [spec.client_address for spec in nodes[0].config.replicas]
        embedded = AllocationStore.embedded(nodes[1], client_id=1)
        remote = AllocationStore.connect(addresses, client_id=2, home=2)
        try:
            first = await embedded.submit(gang("a", "vc00", 100, (2, 8)))
            assert isinstance(first, Placed) and len(first.pods) == 2
            second = await remote.submit(gang("b", "vc00", 100, (1, 4), (2, 2)))
            assert isinstance(second, Placed) and second.token > first.token
            gpus = [(node, d) for _, node, ds in first.pods + second.pods for d in ds]
            assert len(gpus) == len(set(gpus)) == 24
            # linearizable reads see both, wherever they are asked
            assert (await remote.status("a"))["token"] == first.token  # type: ignore[index]
            assert {g["name"] for g in await embedded.allocations()} == {"a", "b"}
            assert (await remote.vc("vc00"))["leaves"]["used"] == 24
            released = await remote.release("a")
            assert released.group == "a"
            assert await embedded.status("a") is None
        finally:
            await embedded.close()
            await remote.close()
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_watch_delivers_every_event_once_in_order_across_a_reconnect(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        addresses = [spec.client_address for spec in nodes[0].config.replicas]
        served = grpc_served(nodes)
        targets = await served.__aenter__()
        store = AllocationStore.connect(addresses, client_id=3, home=0, watch_targets=targets)
        try:
            for k in range(5):
                await store.submit(gang(f"g{k}", "vc01", 100, (1, 2)))
            await store.release("g1")
            seen = await take(store.watch(-1), 3)
            resumed = await take(store.watch(seen[-1].revision), 3)  # a new watch, later on
            events = seen + resumed
            assert [(e.kind, e.subject) for e in events] == [
                ("placed", "g0"), ("placed", "g1"), ("placed", "g2"),
                ("placed", "g3"), ("placed", "g4"), ("released", "g1"),
            ]
            assert [e.revision for e in events] == sorted({e.revision for e in events})
            # a new event reaches a waiting watcher
            waiting = asyncio.ensure_future(take(store.watch(events[-1].revision), 1))
            await asyncio.sleep(0.2)
            await store.release("g2")
            (late,) = await asyncio.wait_for(waiting, 10)
            assert (late.kind, late.subject) == ("released", "g2")
        finally:
            await store.close()
            await served.__aexit__(None, None, None)
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_invalid_requests_raise_clear_errors_and_change_nothing(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        store = AllocationStore.embedded(nodes[0], client_id=4)
        try:
            before = await store.allocations()
            cases = [
                (gang("x", "nope"), "unknown virtual cluster"),
                (gang("x", "vc00", 1001), "priority"),
                (GroupSpec(name="x", vc="vc00", priority=-1, members=(Member(1, 8),),
                           pinned="vc00-PIN"), "pinned"),
                (gang("x", "vc00", 100, (1, 9)), "does not fit in one node"),
                (gang("x", "vc00", 100, (0, 8)), "pod_number >= 1"),
            ]
            for spec, words in cases:
                with pytest.raises(InvalidRequest, match=words):
                    await store.submit(spec)
            with pytest.raises(InvalidRequest, match="unknown virtual cluster"):
                await store.vc("nope")
            assert await store.allocations() == before
        finally:
            await store.close()
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_watch_resumes_at_other_replicas_exactly_once_while_updates_run(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        addresses = [spec.client_address for spec in nodes[0].config.replicas]
        writer = AllocationStore.connect(addresses, home=1)
        expected = []
        for k in range(20):
            expected.append(("placed", f"c{k}"))
            if k % 3 == 0:
                expected.append(("released", f"c{k}"))

        async def churn() -> None:
            for k in range(20):
                await writer.submit(gang(f"c{k}", f"vc0{k % 2}", 100, (1, 2)))
                if k % 3 == 0:
                    await writer.release(f"c{k}")

        served = grpc_served(nodes)
        targets = await served.__aenter__()
        churning = asyncio.ensure_future(churn())
        try:
            first = AllocationStore.connect(addresses, home=0, watch_targets=targets)
            part1 = await take(first.watch(-1), 8)
            await first.close()  # the watcher's connection is gone ...
            # ... it resumes elsewhere
            second = AllocationStore.connect(addresses, home=2, watch_targets=targets)
            part2 = await take(second.watch(part1[-1].revision), 8)
            await second.close()
            await churning
            embedded = AllocationStore.embedded(nodes[1])  # ... and at a replica in-process
            part3 = await take(embedded.watch(part2[-1].revision), len(expected) - 16)
            everything = await take(AllocationStore.embedded(nodes[2]).watch(-1), len(expected))
            assert part1 + part2 + part3 == everything
            assert [(e.kind, e.subject) for e in everything] == expected
            assert [e.revision for e in everything] == sorted({e.revision for e in everything})
            with pytest.raises(TimeoutError):  # and nothing more
                await asyncio.wait_for(take(embedded.watch(everything[-1].revision), 1), 0.3)
        finally:
            await writer.close()
            await served.__aexit__(None, None, None)
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_the_embedded_watch_is_woken_by_the_apply_hook_and_unhooks(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        hooks = len(nodes[2].on_apply)
        try:
            watcher = AllocationStore.embedded(nodes[2]).watch(-1)
            waiting = asyncio.ensure_future(anext(watcher))
            await asyncio.sleep(0.2)
            assert len(nodes[2].on_apply) == hooks + 1
            began = time.monotonic()
            await AllocationStore.embedded(nodes[0]).submit(gang("pushed"))
            event = await asyncio.wait_for(waiting, 5)
            # not the one-second fallback look: the apply at replica 2 woke it
            assert time.monotonic() - began < 0.6
            assert (event.kind, event.subject) == ("placed", "pushed")
            await watcher.aclose()
            assert len(nodes[2].on_apply) == hooks
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_an_embedded_watch_cancelled_as_an_apply_wakes_it_is_cancelled(tmp_path: Path) -> None:
    """The wake-up and the cancel in one loop turn: Python 3.11's ``asyncio.wait_for`` kept the
    wake-up and dropped the cancel (CPython gh-86296), and the watch ran on for ever."""

    async def run() -> None:
        nodes = await start(tmp_path)
        hooks = len(nodes[2].on_apply)
        try:
            async def consume() -> None:
                async for _ in AllocationStore.embedded(nodes[2]).watch(-1):
                    pass

            watching = asyncio.create_task(consume())
            while len(nodes[2].on_apply) == hooks:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # past the events already there, waiting for the next
            nodes[2].on_apply[-1](0, [Command(client_id=1, seq=0, op=b"")], [b""])
            watching.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(watching, 5)
            assert len(nodes[2].on_apply) == hooks
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_watch_behind_the_kept_events_is_told_so(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path, event_limit=4)
        addresses = [spec.client_address for spec in nodes[0].config.replicas]
        embedded = AllocationStore.embedded(nodes[0])
        served = grpc_served(nodes)
        remote = AllocationStore.connect(addresses, home=1, watch_targets=await served.__aenter__())
        try:
            for k in range(6):
                await embedded.submit(gang(f"k{k}", "vc01", 100, (1, 1)))
            for store in (embedded, remote):
                with pytest.raises(EventsCompacted) as caught:
                    await take(store.watch(-1), 1)
                assert caught.value.oldest >= 0 and "compacted" in str(caught.value)
                kept = await take(store.watch(caught.value.oldest), 4)
                assert [e.subject for e in kept] == ["k2", "k3", "k4", "k5"]
        finally:
            await remote.close()
            await served.__aexit__(None, None, None)
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_retry_with_the_same_session_and_seq_takes_effect_once(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        addresses = [spec.client_address for spec in nodes[0].config.replicas]
        first = AllocationStore.embedded(nodes[0], client_id=77)
        # the same session after its scheduler lost the answers, at another replica
        again = AllocationStore.connect(addresses, client_id=77, home=2)
        try:
            spec = gang("once", "vc00", 100, (1, 8))
            placed = await first.submit(spec, seq=5)
            assert isinstance(placed, Placed)
            assert await again.submit(spec, seq=5) == placed
            assert await AllocationStore.embedded(nodes[1], client_id=77).submit(
                spec, seq=5) == placed
            released = await first.release("once", seq=6)
            assert await again.release("once", seq=6) == released  # not "no group 'once'"
            assert await first.allocations() == []
            events = await take(first.watch(-1), 2)
            assert [(e.kind, e.subject) for e in events] == [("placed", "once"),
                                                             ("released", "once")]
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(take(first.watch(events[-1].revision), 1), 0.3)
            # sessions pick random ids unless told
            ids = {AllocationStore.connect(addresses).client_id for _ in range(3)}
            assert len(ids) == 3 and min(ids) >= 1 << 62
        finally:
            await again.close()
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_bind_places_at_chosen_gpus_unless_they_changed(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        store = AllocationStore.embedded(nodes[0])
        try:
            first = await store.submit(gang("a", "vc00", 100, (1, 8)))
            assert isinstance(first, Placed)
            ((_, host, devices),) = first.pods
            await store.release("a")
            revision = (await store.digest())["revision"]
            at = [PodPlacement(host, devices)]
            with pytest.raises(InvalidRequest, match="placement lists 2 pods"):
                await store.bind(gang("b", "vc00", 100, (1, 8)), at * 2, revision)
            stale = await store.bind(gang("b", "vc00", 100, (1, 8)), at, first.token)
            assert isinstance(stale, Conflict)  # the GPUs changed (released) since then
            bound = await store.bind(gang("b", "vc00", 100, (1, 8)), at, revision)
            assert isinstance(bound, Placed) and bound.pods == first.pods
            assert bound.token > revision
            # every replica converges on the same state
            deadline = time.monotonic() + 10
            while True:
                digests = [await AllocationStore.embedded(n).digest(stale=True) for n in nodes]
                if len({d["sha256"] for d in digests}) == 1 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert len({d["sha256"] for d in digests}) == 1
            # (the replicas' log-time commands may have moved the revision on since)
            assert digests[0]["revision"] >= bound.token
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_embedding_needs_a_node_serving_the_store(tmp_path: Path) -> None:
    (tmp_path / "cluster.toml").write_text(cluster_toml(3, free_base_port(), wan=False))
    node = ReplicaNode(load_cluster_config(tmp_path / "cluster.toml"), 0, KVStore(),
                       fsync=False)
    try:
        with pytest.raises(TypeError, match="ClusterStore"):
            AllocationStore.embedded(node)
    finally:
        node.wal.close()
    with pytest.raises(ValueError, match="client_id"):
        AllocationStore.embedded(node, client_id=-1)


def test_an_update_without_an_outcome_is_retried_to_take_effect_once(tmp_path: Path) -> None:
    async def run() -> None:
        nodes = await start(tmp_path)
        store = AllocationStore.embedded(nodes[0], client_id=31, timeout_s=0.3, attempts=2)
        try:
            await store.submit(gang("before"))
            for node in nodes[1:]:  # no majority: nothing can commit
                await node.stop()
            spec = gang("during", "vc01", 100, (1, 4))
            with pytest.raises(IndefiniteFailure, match=r"within 0\.3s, 2 tries"):
                await store.submit(spec, seq=9)
            config = nodes[0].config
            nodes[1:] = [ReplicaNode(config, i, ClusterStore(synthetic_config(**GPU)),
                                     fsync=False) for i in (1, 2)]
            for node in nodes[1:]:
                await node.start()
            patient = AllocationStore.embedded(nodes[0], client_id=31, timeout_s=10)
            placed = await patient.submit(spec, seq=9)  # the same request, again
            assert isinstance(placed, Placed)
            assert [g["name"] for g in await patient.allocations()] == ["before", "during"]
            events = await take(patient.watch(-1), 2)
            assert [e.subject for e in events] == ["before", "during"]
            with pytest.raises(TimeoutError):  # placed once
                await asyncio.wait_for(take(patient.watch(events[-1].revision), 1), 0.3)
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))
