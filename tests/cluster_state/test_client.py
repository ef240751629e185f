"""``AllocationStore`` against three in-process replicas serving a ``ClusterStore``: embedded
and remote calls, linearizable queries, the watch stream, clear errors for bad requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cluster_state.client import AllocationStore, InvalidRequest
from cluster_state.config import synthetic_config
from cluster_state.events import ChangeEvent
from cluster_state.ops import GroupSpec, Member, Placed
from cluster_state.store import ClusterStore
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode

GPU = dict(nodes=16, gpus_per_node=8, nodes_per_rack=4, vcs=2, pinned=1)


def gang(name: str, vc: str = "vc00", priority: int = 100, *sizes: tuple[int, int]) -> GroupSpec:
    return GroupSpec(name=name, vc=vc, priority=priority,
                     members=tuple(Member(p, g) for p, g in (sizes or ((1, 8),))))


async def start(tmp_path: Path) -> list[ReplicaNode]:
    (tmp_path / "gpu.yaml").write_text(synthetic_config(**GPU).to_yaml())
    text = cluster_toml(3, free_base_port(), wan=False)
    text += '\n[state_machine]\nkind = "cluster_state"\ngpu_config = "gpu.yaml"\n'
    (tmp_path / "cluster.toml").write_text(text)
    config = load_cluster_config(tmp_path / "cluster.toml")
    assert config.gpu_config is not None
    nodes = [
        ReplicaNode(config, i, ClusterStore(synthetic_config(**GPU)), fsync=False)
        for i in range(3)
    ]
    for node in nodes:
        await node.start()
    return nodes


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
        store = AllocationStore.connect(addresses, client_id=3, home=0)
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
