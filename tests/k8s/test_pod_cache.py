"""The extender's pod cache (HiveD's informer), force bind and the waiting block, against the
fake API server on an in-process store:

* filters and binds read the cache: the pods are listed once, whatever the number of filters;
* the cache holds live HiveD pods only, follows the watch, and a re-list after the watch's
  version expired (410) reports the pods that went meanwhile, as gone;
* a binding pod filtered ``forcePodBindThreshold`` times more is bound by the extender itself,
  and so is one whose node Kubernetes did not suggest (HiveD's force bind);
* a waiting pod's filter holds the other scheduling back ``waitingPodSchedulingBlockMilliSec``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from runtime.polling import wait_until

from cluster_state.k8s.extender import Extender

from .fake_apiserver import hived_pod
from .test_extender_phases import NODES, Setup


def extender(s: Setup, **options: Any) -> Extender:
    return Extender(s.client, s.pods.kube, s.pods, **options)


def pod(name: str, leaves: int = 1, **kw: Any) -> dict[str, Any]:
    return hived_pod(name, vc="vc1", priority=10, leaves=leaves, group=name,
                     members=[(1, leaves)], **kw)


async def test_filters_read_the_cache_and_list_the_pods_once(setup: Setup) -> None:
    s = setup
    ext = extender(s)
    pods = [pod(f"p{i}") for i in range(6)]
    for p in pods:
        s.api.add_pod(p)
    await s.cached(*pods)
    for p in pods:
        result = await ext.filter({"Pod": p, "NodeNames": list(NODES)})
        assert result["NodeNames"], result
        meta = p["metadata"]
        assert await ext.bind({"PodName": meta["name"], "PodNamespace": "default",
                               "PodUID": meta["uid"], "Node": result["NodeNames"][0]}) == {
            "Error": ""}
    assert s.api.lists("pods") == 1  # the cache's first list, nothing since
    # a pod that is not HiveD's (no enabling resource) or finished is not held
    plain = pod("plain")
    plain["spec"]["containers"][0]["resources"] = {}
    finished = pod("finished")
    finished["status"]["phase"] = "Succeeded"
    s.api.add_pod(plain)
    s.api.add_pod(finished)
    s.api.add_pod(pod("late"))
    await wait_until(lambda: s.pods.pod("default", "late") is not None, "the watch delivers")
    assert s.pods.pod("default", "plain") is None and s.pods.pod("default", "finished") is None
    assert {c.node for c in s.pods if c.uid in {p["metadata"]["uid"] for p in pods}} <= set(NODES)


async def test_a_relist_after_an_expired_watch_reports_the_pods_gone_meanwhile(
        setup: Setup) -> None:
    s = setup
    kept, lost = pod("kept"), pod("lost")
    s.api.add_pod(kept)
    s.api.add_pod(lost)
    await s.cached(kept, lost)
    ext = extender(s)
    for p in (kept, lost):
        assert (await ext.filter({"Pod": p, "NodeNames": list(NODES)}))["NodeNames"]
    assert s.group("lost") is not None
    s.api.hold_watches()  # the deletion never reaches the watch...
    s.api.delete_pod("default", "lost")
    s.api.compact()  # ...and is compacted away: the cache lists again
    await wait_until(lambda: s.api.lists("pods") == 2, "the cache lists again")
    await wait_until(lambda: s.pods.pod("default", "lost") is None, "the re-list drops it")
    # the reaper got it as gone, and released its group; the other group stays
    await wait_until(lambda: s.group("lost") is None, "the reaper releases the group")
    assert s.group("kept") is not None and s.pods.pod("default", "kept") is not None


async def test_a_pod_filtered_again_and_again_is_bound_by_the_extender(setup: Setup) -> None:
    s = setup
    ext = extender(s, force_bind_threshold=3)
    binding = pod("binding")
    s.api.add_pod(binding)
    await s.cached(binding)
    node = (await ext.filter({"Pod": binding, "NodeNames": list(NODES)}))["NodeNames"][0]
    for attempt in (1, 2):  # kube-scheduler filters it again without binding it
        assert (await ext.filter({"Pod": binding, "NodeNames": list(NODES)}))["NodeNames"] == [
            node]
        assert ext.bind_attempts["uid-binding"] == attempt and not s.api.bindings
    assert (await ext.filter({"Pod": binding, "NodeNames": list(NODES)}))["NodeNames"] == [node]
    await wait_until(lambda: len(s.api.bindings) == 1, "the extender binds it itself")
    assert s.api.bindings[0]["target"]["name"] == node
    assert s.api.pods[("default", "binding")]["spec"]["nodeName"] == node


async def test_a_node_kubernetes_did_not_suggest_is_bound_at_once(setup: Setup) -> None:
    s = setup
    ext = extender(s)
    first = pod("first", leaves=4)
    s.api.add_pod(first)
    await s.cached(first)
    # ignoreK8sSuggestedNodes (true): the store's choice stands wherever Kubernetes looked;
    # kube-scheduler would not bind a node it did not suggest, so the extender does
    suggested = ["not-a-node"]
    node = (await ext.filter({"Pod": first, "NodeNames": suggested}))["NodeNames"][0]
    assert node not in suggested
    await wait_until(lambda: len(s.api.bindings) == 1, "the extender binds it at once")
    assert s.api.bindings[0]["target"]["name"] == node
    # with the node watch's view, a node that does not exist is bound at once too
    known = extender(s, node_known=lambda n: False)
    other = pod("other", leaves=4)
    s.api.add_pod(other)
    await s.cached(other)
    assert (await known.filter({"Pod": other, "NodeNames": list(NODES)}))["NodeNames"]
    await wait_until(lambda: len(s.api.bindings) == 2, "bound though suggested")


async def test_a_waiting_pod_holds_the_scheduling_back(setup: Setup) -> None:
    s = setup
    ext = extender(s, waiting_block_ms=300)
    huge = pod("huge", leaves=4)
    big = [pod(f"big{i}", leaves=4) for i in range(2)]  # vc1's two nodes
    small = pod("small")
    for p in (*big, huge, small):
        s.api.add_pod(p)
    await s.cached(*big, huge, small)
    for p in big:
        assert (await ext.filter({"Pod": p, "NodeNames": list(NODES)}))["NodeNames"]
    done: list[tuple[str, dict[str, Any]]] = []

    async def filter_pod(p: dict[str, Any]) -> None:
        result = await ext.filter({"Pod": p, "NodeNames": list(NODES)})
        done.append((p["metadata"]["name"], result))  # in the step the filter answers

    waiting = asyncio.create_task(filter_pod(huge))
    await wait_until(ext._scheduling.locked, "the waiting pod's block starts")
    follower = asyncio.create_task(filter_pod(small))
    await asyncio.gather(waiting, follower)
    # the filter that came during the block answered only after the block
    assert [name for name, _ in done] == ["huge", "small"]
    assert done[0][1]["FailedNodes"]["hivedscheduler"].startswith("Pod is waiting")
