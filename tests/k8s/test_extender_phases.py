"""The extender's HiveD phases against a fake API server, over HTTP with the extender API's
JSON, on an in-process store (every decision still goes through ``ClusterStore.apply`` /
``query`` as the replicated one does): filter reserves nothing, preempt reserves and names
victims by pod UID, re-filter is idempotent, ignoreK8sSuggestedNodes, the bind annotations
and fencing token, gang release by the reaper, node health from the node watch, inspect,
HiveD's errors. (Answers are compared with HiveD's own in ``test_hived_conformance``.)"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import yaml
from runtime.polling import wait_until

from cluster_state.client import AllocationStore
from cluster_state.config import load_config
from cluster_state.events import ChangeEvent
from cluster_state.k8s.extender import Extender, GangReaper
from cluster_state.k8s.hived import (
    BIND_INFO_ANNOTATION,
    FENCING_ANNOTATION,
    ISOLATION_ANNOTATION,
    pod_request,
)
from cluster_state.k8s.nodes import NodeWatcher
from cluster_state.k8s.pods import PodCache
from cluster_state.store import ClusterStore
from consensus.messages import Command

from .fake_apiserver import FakeApiServer, hived_pod
from .http_client import request

GPU_CONFIG = Path(__file__).with_name("gpu.yaml")
NODES = ("n0", "n1", "n2", "n3")


class LocalChannel:
    """The store in this process: updates apply at the next log position, queries read."""

    def __init__(self, store: ClusterStore) -> None:
        self.store = store
        self.positions = itertools.count()
        self.seq = itertools.count()

    async def update(self, op: bytes, seq: int | None) -> bytes:
        command = Command(client_id=1, seq=next(self.seq) if seq is None else seq, op=op)
        return self.store.apply(next(self.positions), command)

    async def query(self, op: bytes, stale: bool) -> bytes:
        return self.store.query(op)

    async def watch(self, since: int, poll_s: float) -> AsyncGenerator[list[ChangeEvent], None]:
        yield self.store.events_since(since)

    async def close(self) -> None:
        return None


class Setup:
    def __init__(self) -> None:
        self.store = ClusterStore(load_config(GPU_CONFIG))
        self.api = FakeApiServer()
        self.client = AllocationStore(LocalChannel(self.store), 1)  # type: ignore[arg-type]
        self.url = ""
        self.tasks: list[asyncio.Task[None]] = []
        self.pods: PodCache
        self.extender: Extender
        self.reaper: GangReaper
        self.nodes: NodeWatcher

    async def post(self, verb: str, body: Any) -> tuple[int, Any]:
        return await request(self.url, "POST", f"/v1/extender/{verb}", body)

    async def get(self, path: str) -> tuple[int, Any]:
        return await request(self.url, "GET", path)

    async def filter(self, pod: dict[str, Any], nodes: tuple[str, ...] = NODES) -> Any:
        status, body = await self.post("filter", {"Pod": pod, "NodeNames": list(nodes)})
        assert status == 200, body
        return body

    async def cached(self, *pods: dict[str, Any]) -> None:
        """Wait until the extender's pod cache holds ``pods`` (as added to the API server)."""
        await wait_until(lambda: all(self.pods.by_uid(p["metadata"]["uid"]) for p in pods),
                         "the pod cache sees the pods")

    def group(self, name: str) -> dict[str, Any] | None:
        info: dict[str, Any] | None = self.store.allocator.group_info(name)
        return info


def gang(prefix: str, pods: int, leaves: int, *, vc: str = "vc1", priority: int = 10,
         **kw: Any) -> list[dict[str, Any]]:
    return [hived_pod(f"{prefix}-{i}", vc=vc, priority=priority, leaves=leaves, group=prefix,
                      members=[(pods, leaves)], **kw) for i in range(pods)]


async def schedule(s: Setup, pod: dict[str, Any]) -> str:
    """Filter then bind, as kube-scheduler does; the node."""
    result = await s.filter(pod)
    assert result["NodeNames"], result
    node: str = result["NodeNames"][0]
    meta = pod["metadata"]
    status, body = await s.post("bind", {"PodName": meta["name"], "PodNamespace": "default",
                                         "PodUID": meta["uid"], "Node": node})
    assert (status, body) == (200, {"Error": ""})
    return node


def user_error(pod: dict[str, Any], routine: str, message: str) -> str:
    """HiveD's user error text for ``pod`` in ``routine``."""
    meta = pod["metadata"]
    key = f"{meta['uid']}({meta['namespace']}/{meta['name']})"
    return f"Code: 400, Message: hivedscheduler: User Error: [{key}]: {routine}: Failed: {message}"


async def test_filter_preempt_bind_and_release(setup: Setup) -> None:
    s = setup
    low = gang("low", 2, 4)
    for pod in low:
        s.api.add_pod(pod)
    first = await s.filter(low[0])
    again = await s.filter(low[0])  # a re-filter of a binding pod answers the same node
    assert first["NodeNames"] == again["NodeNames"] and len(first["NodeNames"]) == 1
    assert first == {"Nodes": None, "NodeNames": first["NodeNames"], "FailedNodes": None,
                     "Error": ""}  # HiveD's answer: the node, nothing else
    placed = s.group("low")
    assert placed is not None and placed["state"] == "placed"
    nodes = {await schedule(s, pod) for pod in low}
    assert len(nodes) == 2  # a 4-GPU pod per node, the gang on two nodes
    binding = s.api.bindings[0]
    annotations = binding["metadata"]["annotations"]
    info = yaml.safe_load(annotations[BIND_INFO_ANNOTATION])
    assert info["node"] == binding["target"]["name"]
    assert set(info) == {"node", "leafCellIsolation", "cellChain", "affinityGroupBindInfo"}
    assert annotations[FENCING_ANNOTATION] == str(placed["token"])  # its own annotation
    assert annotations[ISOLATION_ANNOTATION] == ",".join(map(str, info["leafCellIsolation"]))
    (member,) = info["affinityGroupBindInfo"]
    assert len(member["podPlacements"]) == 2
    # the preassigned VC cell's type (vc1 owns GPU-NODE cells), not the chain's name
    assert {t for p in member["podPlacements"] for t in p["preassignedCellTypes"]} == {
        "GPU-NODE"} and info["cellChain"] == "GPU-RACK"
    # vc1 is full: a higher priority needs victims; the filter names them on their nodes
    # and reserves nothing
    high = gang("high", 1, 4, priority=100)[0]
    s.api.add_pod(high)
    await s.cached(high, *low)
    failed = await s.filter(high)
    low_pods = {p["spec"]["nodeName"]: p for p in low}
    assert failed["NodeNames"] is None and set(failed["FailedNodes"]) <= set(low_pods)
    for node, reason in failed["FailedNodes"].items():
        meta = low_pods[node]["metadata"]
        assert reason == f"node({node}) has preemptible Pods: {meta['uid']}(default/{meta['name']})"
    assert s.group("high") is None
    status, preempt = await s.post("preempt", {
        "Pod": high, "NodeNameToMetaVictims": {n: {"Pods": [], "NumPDBViolations": 0}
                                               for n in NODES}})
    assert status == 200
    # the victims on every node they run on (kube-scheduler picks the node it preempts on)
    victims = preempt["NodeNameToMetaVictims"]
    assert set(victims) == {p["spec"]["nodeName"] for p in low} and len(victims) == 2
    for victim_node, meta in victims.items():
        on_node = [p["metadata"]["uid"] for p in low if p["spec"]["nodeName"] == victim_node]
        assert meta == {"Pods": [{"UID": uid} for uid in on_node], "NumPDBViolations": 0}
    assert s.group("high")["state"] == "preempting"  # type: ignore[index]
    # filtered again while preempting: the victims' pods, still running, are named again
    assert (await s.filter(high))["FailedNodes"] == failed["FailedNodes"]
    status, group = await s.get("/v1/inspect/affinitygroups/high")
    assert status == 200 and group["status"]["state"] == "Preempting"
    assert group["status"]["preemptingPods"] == [high["metadata"]["uid"]]
    status, victim = await s.get("/v1/inspect/affinitygroups/low")
    assert victim["status"]["state"] == "BeingPreempted"
    for pod in low:  # Kubernetes deletes the victims (the whole gang goes)
        s.api.delete_pod("default", pod["metadata"]["name"])
    await wait_until(lambda: s.group("low") is None, "the reaper releases the gang")
    assert s.group("high")["state"] == "reserved"  # type: ignore[index]
    node = await schedule(s, high)  # the filter confirms the reservation, then binds
    assert s.group("high")["state"] == "placed"  # type: ignore[index]
    assert s.api.bindings[-1]["target"]["name"] == node


async def test_ignore_k8s_suggested_nodes_false_plans_inside_the_suggested_ones(
    setup: Setup,
) -> None:
    s = setup
    pod = gang("picky", 1, 4, vc="vc2", ignore_suggested=False)[0]
    s.api.add_pod(pod)
    _, plan = await s.client.plan_submit(pod_request(pod).spec)
    planned = plan.pods[0][1]  # type: ignore[union-attr]
    others = tuple(n for n in NODES if n != planned)
    # the store searches inside the suggested nodes: another of vc2's cells
    taken = await s.filter(pod, others)
    assert taken["NodeNames"] and taken["NodeNames"][0] in others, taken
    # none of the suggested nodes will do: the pod waits, and says why
    stuck = gang("stuck", 1, 4, vc="vc2", ignore_suggested=False)[0]
    s.api.add_pod(stuck)
    await s.cached(stuck)
    refused = await s.filter(stuck, (taken["NodeNames"][0],))
    assert refused["NodeNames"] is None
    assert "suggested nodes" in refused["FailedNodes"]["hivedscheduler"]
    assert s.group("stuck") is None
    # the default (true) takes the plan whatever Kubernetes suggests, as HiveD does
    lax = gang("lax", 1, 4, vc="vc2")[0]
    s.api.add_pod(lax)
    assert (await s.filter(lax, (taken["NodeNames"][0],)))["NodeNames"]


async def test_preemption_inside_the_candidate_nodes_and_cancelled_when_they_change(
    setup: Setup,
) -> None:
    s = setup
    low = gang("low", 2, 4, vc="vc2")
    for pod in low:
        s.api.add_pod(pod)
        await schedule(s, pod)
    high = gang("high", 1, 4, vc="vc2", priority=100, ignore_suggested=False)[0]
    s.api.add_pod(high)
    first, second = sorted(p["spec"]["nodeName"] for p in low)
    gang_victims = {p["spec"]["nodeName"]: {"Pods": [{"UID": p["metadata"]["uid"]}],
                                            "NumPDBViolations": 0} for p in low}
    await s.cached(high, *low)
    # a newer kube-scheduler names its candidates in nodeToVictims; the whole victim gang
    # goes, so its pods on both nodes are named
    status, answer = await s.post("preempt", {"pod": high, "nodeToVictims": {
        second: {"pods": [], "numPDBViolations": 0}}})
    assert (status, answer) == (200, {"NodeNameToMetaVictims": gang_victims})
    info = s.group("high")
    assert info is not None and {node for _, node, _ in info["pods"]} == {second}
    # the candidates changed: the reservation on `second` is cancelled, made on `first`
    status, answer = await s.post("preempt", {"Pod": high, "NodeNameToVictims": {
        first: {"Pods": [], "NumPDBViolations": 0}}})
    assert (status, answer) == (200, {"NodeNameToMetaVictims": gang_victims})
    assert ("cancelled", "high") in [(e.kind, e.subject) for e in s.store.events_since(0)]
    info = s.group("high")
    assert info is not None and {node for _, node, _ in info["pods"]} == {first}
    # no candidate will do: cancelled, no victims named
    status, answer = await s.post("preempt", {"Pod": high, "NodeNameToMetaVictims": {
        n: {"Pods": [], "NumPDBViolations": 0} for n in NODES if n not in (first, second)}})
    assert (status, answer) == (200, {"NodeNameToMetaVictims": None})
    assert s.group("high") is None


async def test_bind_needs_every_field_of_its_arguments(setup: Setup) -> None:
    s = setup
    pod = gang("tidy", 1, 2)[0]
    s.api.add_pod(pod)
    node = (await s.filter(pod))["NodeNames"][0]
    full = {"PodName": "tidy-0", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
            "Node": node}
    for missing in ("PodUID", "PodNamespace", "PodName", "Node"):
        status, body = await s.post("bind", {k: v for k, v in full.items() if k != missing})
        assert status == 200 and "All fields should not be empty" in body["Error"], missing
    assert not s.api.bindings
    wrong = await s.post("bind", {**full, "PodUID": "someone-else"})
    assert wrong[0] == 200 and "has not been informed to the scheduler" in wrong[1]["Error"]
    assert await s.post("bind", full) == (200, {"Error": ""})


async def test_bad_requests_and_inspect(setup: Setup) -> None:
    s = setup
    bad = hived_pod("bad", vc="nope", priority=10, leaves=4, group="bad", members=[(1, 4)])
    s.api.add_pod(bad)
    status, body = await s.post("filter", {"pod": bad, "nodenames": list(NODES)})
    key = "uid-bad(default/bad)"
    assert (status, body["Error"]) == (200, user_error(bad, "filterRoutine",
                                                       f"[{key}]: VC nope does not exists!"))
    no_spec = {"metadata": {"name": "plain", "namespace": "default", "uid": "u"}}
    status, body = await s.post("filter", {"pod": no_spec})
    assert (status, body["Error"]) == (200, user_error(
        no_spec, "filterRoutine", "Pod does not exist, completed or has not been informed "
        "to the scheduler"))  # not in the API server
    wrong = hived_pod("w", vc="vc1", priority=5000, leaves=4, group="w", members=[(1, 4)])
    s.api.add_pod(wrong)
    status, body = await s.post("filter", {"pod": wrong})
    assert body["Error"] == user_error(wrong, "filterRoutine", "Pod annotation hivedscheduler."
                                       "microsoft.com/pod-scheduling-spec: Priority is greater "
                                       "than 1000")
    assert (await s.post("nothing", {})) == (
        404, "hivedscheduler: User Error: Path not found: /v1/extender/nothing")
    pod = gang("seen", 1, 2)[0]
    s.api.add_pod(pod)
    await schedule(s, pod)
    status, groups = await s.get("/v1/inspect/affinitygroups/")
    assert status == 200 and [g["metadata"]["name"] for g in groups["items"]] == ["seen"]
    status, group = await s.get("/v1/inspect/affinitygroups/seen")
    assert status == 200 and group == groups["items"][0]
    assert group["status"]["state"] == "Allocated"
    assert group["status"]["allocatedPods"] == [pod["metadata"]["uid"]]
    assert (await s.get("/v1/inspect/affinitygroups/unknown")) == (
        400, "hivedscheduler: User Error: Affinity group unknown does not exist since it is "
        "not allocated or preempting")
    status, cluster = await s.get("/v1/inspect/clusterstatus")
    assert status == 200 and set(cluster["virtualClusters"]) == {"vc1", "vc2"}
    status, physical = await s.get("/v1/inspect/clusterstatus/physicalcluster")
    assert status == 200 and physical == cluster["physicalCluster"]
    status, vc2 = await s.get("/v1/inspect/clusterstatus/virtualclusters/vc2")
    assert status == 200 and vc2 == cluster["virtualClusters"]["vc2"]
    assert (await s.get("/v1/inspect/clusterstatus/virtualclusters/none")) == (
        400, "hivedscheduler: User Error: VC none not found")
    status, paths = await s.get("/")
    assert status == 200 and "/v1/inspect/clusterstatus" in paths["paths"]


async def test_node_watch_feeds_node_health(setup: Setup) -> None:
    s = setup
    bad = lambda: set(s.store.allocator.bad_nodes)  # noqa: E731
    await wait_until(lambda: s.nodes.known == dict.fromkeys(NODES, True),
                     "the watcher reports every listed node")
    s.api.set_node("n3", False)
    await wait_until(lambda: bad() == {"n3"}, "a NotReady node becomes bad")
    s.api.set_node("n3", True)
    await wait_until(lambda: bad() == set(), "Ready again: healthy")
    s.api.delete_node("n2")
    await wait_until(lambda: bad() == {"n2"}, "a deleted node is bad")
    for vc in ("vc1", "vc2"):  # four nodes' worth of cells, three healthy nodes
        pods = gang(f"wide-{vc}", 2, 4, vc=vc)
        for pod in pods:
            s.api.add_pod(pod)
        nodes = [(await s.filter(pod))["NodeNames"] for pod in pods]
        if vc == "vc1":
            assert all(n and n[0] != "n2" for n in nodes), nodes
        else:  # no two healthy nodes left for vc2: it waits, nothing placed
            assert nodes == [None, None] and s.group("wide-vc2") is None


async def test_bytes_that_are_not_http_get_400_and_the_extender_goes_on(setup: Setup) -> None:
    s = setup
    port = int(s.url.rsplit(":", 1)[1])
    for garbage, status in (
        (b"\x00\xff garbage\r\n\r\n", b"400"),
        (b"POST /v1/extender/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n"
         b"\r\n", b"413"),
        (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", b"400"),
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(garbage)
        await writer.drain()
        async with asyncio.timeout(10):  # answered at once (a body over the limit unread)
            answer = await reader.readline()
        writer.close()
        assert answer.startswith(b"HTTP/1.") and answer.split()[1] == status, (garbage, answer)
    status, body = await s.get("/healthz")
    assert (status, body) == (200, {"status": "ok"})


async def test_healthz_fails_while_the_api_server_or_the_store_is_out_of_reach(
    setup: Setup,
) -> None:
    """Issue 34: the extender's /healthz was 200 while the Kubernetes API server was down."""
    from cluster_state.k8s.cli import health_check
    from cluster_state.k8s.kube import KubeApi
    from cluster_state.k8s.web import serve
    from consensus.runtime.local_cluster import free_base_port

    s = setup
    nowhere = free_base_port()  # nothing listens there
    down_api = KubeApi(f"http://127.0.0.1:{nowhere}", timeout_s=1.0)
    down_store = AllocationStore.connect([("127.0.0.1", nowhere + 1)], timeout_s=0.5,
                                         attempts=1)
    cases = [(s.client, KubeApi(s.api.url), 200, ""),
             (s.client, down_api, 503, f"Kubernetes API http://127.0.0.1:{nowhere}: "),
             (down_store, KubeApi(s.api.url), 503, "allocation store: ")]
    try:
        for store, kube, status, problem in cases:
            server = await serve(s.extender.handle, "127.0.0.1", 0,
                                 health=health_check(store, kube, s.pods.synced))
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            try:
                for path in ("/healthz", "/readyz"):
                    got, body = await request(url, "GET", path)
                    assert got == status, (path, body)
                    assert problem in " ".join(body.get("problems", [""]))
                assert await request(url, "GET", "/livez") == (200, {"status": "ok"})
            finally:
                await server.stop()
                await kube.close()
    finally:
        await down_store.close()


async def test_a_taken_port_is_a_clear_error_not_a_traceback(
    tmp_path: Path, setup: Setup
) -> None:
    """Issue 34: the extender on a taken port died with a traceback."""
    import subprocess
    import sys

    from consensus.runtime.cli import cluster_toml

    s = setup
    taken = int(s.url.rsplit(":", 1)[1])  # the fixture's extender listens there
    config = tmp_path / "cluster.toml"
    config.write_text(cluster_toml(3, 20_000, wan=False))
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "bench.cli", "extender", "--config", str(config), "--listen",
         f"127.0.0.1:{taken}", "--kube-api", s.api.url],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().endswith(f"cannot listen on 127.0.0.1:{taken}: Address already "
                                        "in use"), done.stderr
    assert "Traceback" not in done.stderr
