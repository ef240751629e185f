"""Two extenders whose pod caches differ on one gang — one filled before a pod was created,
one lagging behind the API server — each pick "the first free member pod" for their pod.
Before member pods were claims of the store, both picked member 0 and both Bindings named the
same GPUs; now the second claim is refused and its extender takes member 1. Interleavings
are forced with a gate on one extender's claims, so the race happens every run. Also: a pod
that is gone for good gives its member pod to its replacement (and a live holder does not),
a gang asking for more pods than it declares is HiveD's user error, and the reaper does not
release a new gang of the same name that appeared between its reads."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator
from types import MappingProxyType
from typing import Any

import pytest
import yaml

from cluster_state.client import AllocationStore
from cluster_state.config import load_config
from cluster_state.k8s.extender import Extender, GangReaper
from cluster_state.k8s.hived import BIND_INFO_ANNOTATION
from cluster_state.k8s.hived_web import WebServerError
from cluster_state.k8s.kube import KubeApi
from cluster_state.k8s.pods import PodCache
from cluster_state.ops import Claimed, Conflict
from cluster_state.store import ClusterStore

from .fake_apiserver import FakeApiServer, hived_pod
from .test_extender_phases import GPU_CONFIG, NODES, LocalChannel


class GatedStore(AllocationStore):
    """The store as one extender reaches it: its claims wait for ``gate`` once ``claiming``
    is set (the extender read the claims and chose a slot)."""

    def __init__(self, store: AllocationStore, gate: asyncio.Event) -> None:
        super().__init__(store._channel, 2)
        self.gate = gate
        self.claiming = asyncio.Event()

    async def claim(self, *args: Any, **kw: Any) -> Claimed | Conflict:
        self.claiming.set()
        await self.gate.wait()
        return await super().claim(*args, **kw)


class View(KubeApi):
    """The API server as a reaper sees it: while ``gate`` is closed, a pod listing waits
    after it is read."""

    def __init__(self, url: str, gate: asyncio.Event | None = None) -> None:
        super().__init__(url)
        self.gate = gate
        self.listed = asyncio.Event()

    async def list_pods(self) -> dict[str, Any]:
        listing = await super().list_pods()
        self.listed.set()
        if self.gate is not None:
            await self.gate.wait()
        return listing


class Env:
    def __init__(self) -> None:
        self.store = ClusterStore(load_config(GPU_CONFIG))
        self.api = FakeApiServer()
        self.client = AllocationStore(LocalChannel(self.store), 1)
        self.views: list[KubeApi] = []  # closed at the end of the test

    def view(self, gate: asyncio.Event | None = None) -> View:
        self.views.append(View(self.api.url, gate))
        return self.views[-1]  # type: ignore[return-value]

    def cache(self, *pods: dict[str, Any]) -> PodCache:
        """A pod cache holding ``pods`` only (one that saw the API server at some moment and
        nothing since), as the real one holds them."""
        cache = PodCache(self.view())
        for pod in pods:
            cache.apply("ADDED", copy.deepcopy(pod))  # as it was then
        return cache

    def extender(self, *pods: dict[str, Any], store: AllocationStore | None = None) -> Extender:
        """An extender whose pod cache holds ``pods`` (default: the API server's pods now)."""
        cache = self.cache(*(pods or self.api.pods.values()))
        return Extender(store or self.client, cache.kube, cache)

    def add_gang(self, name: str, pods: list[str], leaves: int = 1) -> list[dict[str, Any]]:
        made = [hived_pod(p, vc="vc1", priority=10, leaves=leaves, group=name,
                          members=[(len(pods), leaves)]) for p in pods]
        for pod in made:
            self.api.add_pod(pod)
        return made

    def claims(self, name: str) -> dict[int, str]:
        group = self.store.allocator.groups[name]
        return {slot: uid for slot, (uid, _) in group.claims.items()}

    def held(self) -> list[tuple[str, tuple[int, ...]]]:
        """(node, devices) of every Binding accepted by the API server."""
        out = []
        for binding in self.api.bindings:
            info = yaml.safe_load(binding["metadata"]["annotations"][BIND_INFO_ANNOTATION])
            out.append((str(info["node"]), tuple(info["leafCellIsolation"])))
        return out


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = Env()
    await e.api.start()
    for node in NODES:
        e.api.set_node(node, True)
    yield e
    for view in e.views:
        await view.close()
    await e.api.stop()


async def filter_node(extender: Extender, pod: dict[str, Any]) -> str:
    result = await extender.filter({"Pod": pod, "NodeNames": list(NODES)})
    assert result["NodeNames"] is not None and len(result["NodeNames"]) == 1, result
    node: str = result["NodeNames"][0]
    return node


async def bind(extender: Extender, pod: dict[str, Any], node: str) -> dict[str, Any]:
    meta = pod["metadata"]
    return await extender.bind({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                "PodUID": meta["uid"], "Node": node})


async def test_extenders_with_different_listings_never_share_a_member(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cluster_state.k8s.extender")
    a_pod, b_pod = env.add_gang("g", ["g-a", "g-b"])
    gate = asyncio.Event()
    # X's cache was filled before g-a existed: for it, g-b is the gang's only pending pod
    # (member 0). Y's (lagging) cache shows both unbound, g-a first in name order: member 0
    # for g-a too. That was the race: both Bindings named member 0's GPUs.
    x = env.extender(b_pod)
    gated = GatedStore(env.client, gate)
    y = env.extender(a_pod, b_pod, store=gated)
    y_filter = asyncio.create_task(filter_node(y, a_pod))
    await asyncio.wait_for(gated.claiming.wait(), 5)  # Y has read the claims (none), chosen
    x_node = await filter_node(x, b_pod)  # X claims member 0 for g-b meanwhile, binds it
    assert env.claims("g") == {0: "uid-g-b"}
    assert (await bind(x, b_pod, x_node)) == {"Error": ""}
    gate.set()
    y_node = await asyncio.wait_for(y_filter, 5)
    # Y's claim of member 0 was refused; it read the claims again and took member 1
    assert any("held by uid-g-b" in r.getMessage() for r in caplog.records), caplog.text
    assert env.claims("g") == {0: "uid-g-b", 1: "uid-g-a"}
    assert (await bind(y, a_pod, y_node)) == {"Error": ""}
    held = env.held()
    assert len(held) == 2 and len(set(held)) == 2, held  # no GPU bound twice
    placed = env.store.allocator.group_info("g")
    assert placed is not None
    assert sorted(held) == sorted((node, tuple(d)) for _, node, d in placed["pods"])
    # whoever asks, however stale its view: member 0 stays g-b's
    incarnation = placed["incarnation"]
    refused = await env.client.claim("g", incarnation, 0, "uid-g-a", "default/g-a")
    assert isinstance(refused, Conflict)
    again = await env.client.claim("g", incarnation, 0, "uid-g-b", "default/g-b")
    assert again == Claimed("g", incarnation, 0, "uid-g-b")
    # a re-filter from a lagging cache (the pod unbound) answers the claimed member's node
    # (idempotent); from the API server (X's cache lacks g-a), HiveD's answer for a bound pod
    assert await filter_node(y, b_pod) == x_node
    with pytest.raises(WebServerError, match=f"Pod has already been bound to node {y_node}"):
        await filter_node(x, a_pod)


async def test_a_gone_pod_hands_its_member_to_its_replacement(env: Env) -> None:
    pods = env.add_gang("h", ["h-0", "h-1"], leaves=2)
    ext = env.extender()
    for pod in pods:
        assert (await bind(ext, pod, await filter_node(ext, pod))) == {"Error": ""}
    before = env.claims("h")
    # a third pod of a two-pod gang: both holders live, nothing to take (HiveD's user error)
    extra = hived_pod("h-2", vc="vc1", priority=10, leaves=2, group="h", members=[(2, 2)])
    env.api.add_pod(extra)
    with pytest.raises(WebServerError) as refused:
        await env.extender().filter({"Pod": extra, "NodeNames": list(NODES)})
    assert (refused.value.code, refused.value.message) == (400, (
        "[uid-h-2(default/h-2)]: filterRoutine: Failed: Requesting more pods than the "
        "configured number for 2 leaf cells (2 pods) in affinity group h"))
    assert env.claims("h") == before
    env.api.delete_pod("default", "h-2")
    # h-0 is deleted and created again (a new uid): its member goes to the new pod, on the
    # same GPUs
    slot = next(s for s, uid in before.items() if uid == "uid-h-0")
    env.api.delete_pod("default", "h-0")
    again = hived_pod("h-0", vc="vc1", priority=10, leaves=2, group="h", members=[(2, 2)],
                      uid="uid-h-0-again")
    env.api.add_pod(again)
    other = env.extender(again)  # a stale cache (no h-1) changes nothing here
    node = await filter_node(other, again)
    assert env.claims("h") == {**before, slot: "uid-h-0-again"}
    assert (await bind(other, again, node)) == {"Error": ""}
    held = env.held()
    assert len(held) == 3 and held[2] == held[0]  # h-0's GPUs, h-0 having gone
    inc = env.store.allocator.groups["h"].created
    late = await env.client.claim("h", inc, slot, "uid-h-0", "default/h-0")
    assert isinstance(late, Conflict)  # a late claim for the old pod is refused


async def test_the_reaper_spares_a_new_gang_of_the_same_name(env: Env) -> None:
    old = env.add_gang("r", ["r-0"])
    ext = env.extender()
    await filter_node(ext, old[0])
    first = env.store.allocator.groups["r"].created
    gate = asyncio.Event()
    view = env.view(gate=gate)
    reaper = GangReaper(env.client, view, env.cache())  # its cache saw r-0 go
    env.api.delete_pod("default", "r-0")
    gone = asyncio.create_task(reaper._gone(old[0]))
    await asyncio.wait_for(view.listed.wait(), 5)  # read incarnation `first`, listed: no pod
    # meanwhile the old gang is released (another reaper) and a new "r" is created and placed
    await env.client.release("r")
    new = env.add_gang("r", ["r-new"])
    await filter_node(ext, new[0])
    second = env.store.allocator.groups["r"].created
    assert second > first
    gate.set()
    await asyncio.wait_for(gone, 5)
    assert reaper.released == [] and env.store.allocator.groups["r"].created == second
    # with a view that sees the new gang's pods gone too, the new incarnation is released
    env.api.delete_pod("default", "r-new")
    await GangReaper(env.client, env.view(), env.cache())._gone(new[0])
    assert "r" not in env.store.allocator.groups


async def test_pods_bound_before_claims_keep_their_members(env: Env) -> None:
    pods = env.add_gang("l", ["l-0", "l-1"], leaves=2)
    ext = env.extender()
    legacy_node = await filter_node(ext, pods[1])
    assert (await bind(ext, pods[1], legacy_node)) == {"Error": ""}
    slot = next(iter(env.claims("l")))
    env.store.allocator.groups["l"].claims = MappingProxyType({})  # as before claims existed
    # the other pod claims the other member, not the one the bound pod's bind info names
    ext = env.extender()  # its cache sees l-1 bound
    node = await filter_node(ext, pods[0])
    assert env.claims("l") == {1 - slot: "uid-l-0"}
    assert (await bind(ext, pods[0], node)) == {"Error": ""}
    assert len(set(env.held())) == 2
    # the bound pod, filtered again: HiveD's answer for a bound pod, nothing claimed
    with pytest.raises(WebServerError, match="Pod has already been bound"):
        await filter_node(env.extender(), pods[1])
    assert env.claims("l") == {1 - slot: "uid-l-0"}
