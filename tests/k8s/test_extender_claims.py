"""Two extenders whose pod listings of one gang differ — a pod created between their two
listings, a listing served from a lagging cache — each pick "the first free member pod" for
their pod. Before member pods were claims of the store, both picked member 0 and both
Bindings named the same GPUs; now the second claim is refused and its extender takes member
1. Interleavings are forced with a gate in one extender's pod listing, so the race happens
every run. Also: a pod that is gone
for good gives its member pod to its replacement (and a live holder does not), and the reaper
does not release a new gang of the same name that appeared between its reads."""

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
from cluster_state.k8s.kube import KubeApi
from cluster_state.ops import Claimed, Conflict
from cluster_state.store import ClusterStore

from .fake_apiserver import FakeApiServer, hived_pod
from .test_extender_phases import GPU_CONFIG, NODES, LocalChannel


class View(KubeApi):
    """One extender's API server: its pod listings leave out ``hidden`` pods (a listing
    taken before they were created), repeat the first one if ``frozen`` (a cache that lags)
    and, while ``gate`` is closed, wait after listing."""

    def __init__(self, url: str, *, hidden: tuple[str, ...] = (),
                 gate: asyncio.Event | None = None, frozen: bool = False) -> None:
        super().__init__(url)
        self.hidden = set(hidden)
        self.gate = gate
        self.frozen = frozen
        self.first: dict[str, Any] | None = None
        self.listed = asyncio.Event()

    async def list_pods(self) -> dict[str, Any]:
        if self.first is not None:
            return copy.deepcopy(self.first)
        listing = await super().list_pods()
        listing["items"] = [p for p in listing.get("items") or []
                            if p["metadata"]["name"] not in self.hidden]
        if self.frozen:
            self.first = copy.deepcopy(listing)
        self.listed.set()
        if self.gate is not None:
            await self.gate.wait()
        return listing


class Env:
    def __init__(self) -> None:
        self.store = ClusterStore(load_config(GPU_CONFIG))
        self.api = FakeApiServer()
        self.client = AllocationStore(LocalChannel(self.store), 1)
        self.views: list[View] = []  # closed at the end of the test

    def view(self, **view: Any) -> View:
        self.views.append(View(self.api.url, **view))
        return self.views[-1]

    def extender(self, **view: Any) -> Extender:
        return Extender(self.client, self.view(**view))

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
    assert len(result["nodenames"]) == 1, result
    node: str = result["nodenames"][0]
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
    # X listed before g-a existed: for it, g-b is the gang's only pending pod (member 0).
    # Y's (lagging) listing shows both unbound, g-a first in name order: member 0 for g-a
    # too. That was the race: both Bindings named member 0's GPUs.
    x = env.extender(hidden=("g-a",))
    y = env.extender(gate=gate, frozen=True)
    y_view = y.kube
    assert isinstance(y_view, View)
    y_filter = asyncio.create_task(filter_node(y, a_pod))
    await asyncio.wait_for(y_view.listed.wait(), 5)  # Y has read the claims (none), listed
    x_node = await filter_node(x, b_pod)  # X claims member 0 for g-b meanwhile, binds it
    assert env.claims("g") == {0: "uid-g-b"}
    assert (await bind(x, b_pod, x_node)) == {"error": ""}
    gate.set()
    y_node = await asyncio.wait_for(y_filter, 5)
    # Y's claim of member 0 was refused; it read the claims again and took member 1
    assert any("held by uid-g-b" in r.getMessage() for r in caplog.records), caplog.text
    assert env.claims("g") == {0: "uid-g-b", 1: "uid-g-a"}
    assert (await bind(y, a_pod, y_node)) == {"error": ""}
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
    # a re-filter anywhere answers the claimed member's node (idempotent)
    assert await filter_node(x, a_pod) == y_node and await filter_node(y, b_pod) == x_node


async def test_a_gone_pod_hands_its_member_to_its_replacement(env: Env) -> None:
    pods = env.add_gang("h", ["h-0", "h-1"], leaves=2)
    ext = env.extender()
    for pod in pods:
        assert (await bind(ext, pod, await filter_node(ext, pod))) == {"error": ""}
    before = env.claims("h")
    # a third pod of a two-pod gang: both holders live, nothing to take
    extra = hived_pod("h-2", vc="vc1", priority=10, leaves=2, group="h", members=[(2, 2)])
    env.api.add_pod(extra)
    refused = await ext.filter({"Pod": extra, "NodeNames": list(NODES)})
    assert refused["nodenames"] == [] and "no free place" in str(refused["failedNodes"])
    assert env.claims("h") == before
    env.api.delete_pod("default", "h-2")
    # h-0 is deleted and created again (a new uid): its member goes to the new pod, on the
    # same GPUs
    slot = next(s for s, uid in before.items() if uid == "uid-h-0")
    env.api.delete_pod("default", "h-0")
    again = hived_pod("h-0", vc="vc1", priority=10, leaves=2, group="h", members=[(2, 2)],
                      uid="uid-h-0-again")
    env.api.add_pod(again)
    other = env.extender(hidden=("h-1",))  # a stale listing changes nothing here
    node = await filter_node(other, again)
    assert env.claims("h") == {**before, slot: "uid-h-0-again"}
    assert (await bind(other, again, node)) == {"error": ""}
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
    reaper = GangReaper(env.client, view)
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
    await GangReaper(env.client, env.view())._gone(new[0])
    assert "r" not in env.store.allocator.groups


async def test_pods_bound_before_claims_keep_their_members(env: Env) -> None:
    pods = env.add_gang("l", ["l-0", "l-1"], leaves=2)
    ext = env.extender()
    legacy_node = await filter_node(ext, pods[1])
    assert (await bind(ext, pods[1], legacy_node)) == {"error": ""}
    slot = next(iter(env.claims("l")))
    env.store.allocator.groups["l"].claims = MappingProxyType({})  # as before claims existed
    # the other pod claims the other member, not the one the bound pod's bind info names
    node = await filter_node(ext, pods[0])
    assert env.claims("l") == {1 - slot: "uid-l-0"}
    assert (await bind(ext, pods[0], node)) == {"error": ""}
    assert len(set(env.held())) == 2
    # the bound pod, filtered again, adopts its own member
    assert await filter_node(ext, pods[1]) == legacy_node
    assert env.claims("l") == {1 - slot: "uid-l-0", slot: "uid-l-1"}
