"""Two extender instances on one 3-replica TLS store (real replica processes; one extender is
an ``sdpaxos extender`` process, the other runs in the test), each behind its own
kube-scheduler stand-in, filter and bind gangs concurrently through the extender HTTP API
against a fake API server. No GPU is bound twice, gangs are all-or-nothing, the store agrees
with the Bindings, and killing a store replica (the sequencer) and one extender changes
neither."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster_state.client import AllocationStore
from cluster_state.k8s.cli import connect_store
from cluster_state.k8s.extender import Extender, GangReaper
from cluster_state.k8s.hived import BIND_INFO_ANNOTATION
from cluster_state.k8s.kube import KubeApi
from cluster_state.k8s.pods import PodCache
from cluster_state.k8s.web import serve
from consensus.runtime.local_cluster import LocalCluster

from .fake_apiserver import FakeApiServer, hived_pod
from .http_client import request

GPU_CONFIG = Path(__file__).with_name("gpu.yaml")
NODES = ["n0", "n1", "n2", "n3"]
#: gangs per VC (2 pods x 2 GPUs each); a VC holds 8 GPUs, so 2 gangs at a time
GANGS_PER_VC = 4
ROUNDS = 4


def gangs() -> dict[str, list[dict[str, Any]]]:
    out = {}
    for vc in ("vc1", "vc2"):
        for g in range(GANGS_PER_VC):
            name = f"{vc}-g{g}"
            out[name] = [hived_pod(f"{name}-p{i}", vc=vc, priority=10, leaves=2, group=name,
                                   members=[(2, 2)]) for i in range(2)]
    return out


class Scheduler:
    """A kube-scheduler stand-in: filter then bind each pending pod through the first of its
    extenders that answers."""

    def __init__(self, name: str, urls: list[str], api: FakeApiServer, *,
                 backwards: bool = False) -> None:
        self.name = name
        self.backwards = backwards  # take the pods in the other order: they meet mid-way
        self.urls = urls
        self.api = api
        self.bound = 0
        self.failovers = 0

    async def call(self, verb: str, body: Any) -> Any:
        for url in list(self.urls):
            try:
                status, answer = await request(url, "POST", f"/v1/extender/{verb}", body,
                                               timeout_s=10.0)
            except (OSError, TimeoutError):
                self.urls.remove(url)  # that extender is gone: use the next one
                self.failovers += 1
                continue
            assert status == 200, (verb, status, answer)
            return answer
        raise AssertionError(f"{self.name}: no extender answers")

    async def round(self) -> None:
        pending = sorted(((k, p) for k, p in self.api.pods.items()
                          if not p["spec"].get("nodeName")), reverse=self.backwards)
        for (namespace, name), pod in pending:
            if pod["spec"].get("nodeName"):
                continue
            result = await self.call("filter", {"pod": pod, "nodenames": NODES})
            if not result["NodeNames"]:
                assert result["Error"] == "" or "already been bound" in result["Error"], result
                continue
            answer = await self.call("bind", {"podName": name, "podNamespace": namespace,
                                              "podUID": pod["metadata"]["uid"],
                                              "node": result["NodeNames"][0]})
            if answer["Error"] == "":
                self.bound += 1
            else:  # bound by the other scheduler meanwhile (HiveD's answers)
                assert "already been bound" in answer["Error"] or (
                    "already assigned" in answer["Error"]), answer


def bound_cells(api: FakeApiServer) -> dict[str, list[tuple[str, int]]]:
    """pod -> its (node, device) pairs, from the bind info of every bound live pod."""
    cells = {}
    for (_, name), pod in api.pods.items():
        if pod["spec"].get("nodeName"):
            info = yaml.safe_load(pod["metadata"]["annotations"][BIND_INFO_ANNOTATION])
            assert info["node"] == pod["spec"]["nodeName"]
            cells[name] = [(info["node"], d) for d in info["leafCellIsolation"]]
    return cells


async def check(api: FakeApiServer, store: AllocationStore,
                all_gangs: dict[str, list[dict[str, Any]]]) -> set[str]:
    """The invariants; the gangs that are bound."""
    cells = bound_cells(api)
    every = [cell for pod_cells in cells.values() for cell in pod_cells]
    assert len(every) == len(set(every)), f"a GPU bound twice: {Counter(every).most_common(3)}"
    bound_gangs = set()
    live = {name for _, name in api.pods}
    for gang, pods in all_gangs.items():
        names = [p["metadata"]["name"] for p in pods if p["metadata"]["name"] in live]
        done = [n for n in names if n in cells]
        assert not done or len(done) == len(names), f"gang {gang} half bound: {done}"
        if done:
            bound_gangs.add(gang)
    groups = {g["name"]: g for g in await store.allocations()}
    assert set(groups) >= bound_gangs
    for gang in bound_gangs:
        assert groups[gang]["state"] == "placed"
        store_cells = sorted((node, d) for _, node, devices in groups[gang]["pods"]
                             for d in devices)
        pods_cells = sorted(c for p in all_gangs[gang] for c in cells.get(
            p["metadata"]["name"], []))
        assert store_cells == pods_cells, gang
    return bound_gangs


@pytest.mark.timeout(120)
def test_two_extenders_share_one_store(tmp_path: Path) -> None:
    shutil.copy(GPU_CONFIG, tmp_path / "gpu.yaml")
    with LocalCluster(tmp_path, 3, state_machine='kind = "cluster_state"\n'
                      'gpu_config = "gpu.yaml"', tls=True) as cluster:
        cluster.start_all()
        asyncio.run(asyncio.wait_for(scenario(cluster, tmp_path), 100))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


#: how long three replicas and an extender process may take to serve on a busy machine
SERVE_S = 40


async def wait_serving(url: str, store: AllocationStore, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + SERVE_S
    while True:
        try:
            if (await request(url, "GET", "/healthz", timeout_s=1.0))[0] == 200:
                await store.summary()
                return
        except Exception:
            pass
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.2)


async def scenario(cluster: LocalCluster, tmp_path: Path) -> None:
    api = FakeApiServer()
    await api.start()
    for node in NODES:
        api.set_node(node, True)
    kube = KubeApi(api.url)
    config = str(cluster.config_path)
    # extender 0: `sdpaxos extender`, a process of its own, through replica 0 (over TLS)
    port = free_port()
    log = (tmp_path / "extender-0.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "extender", "--config", config, "--home", "0",
         "--listen", f"127.0.0.1:{port}", "--kube-api", api.url],
        stdout=log, stderr=subprocess.STDOUT)
    # extender 1: in this process, through replica 1
    store = connect_store(config, 1)
    pods = PodCache(kube)
    cache = asyncio.create_task(pods.run())
    await asyncio.wait_for(pods.synced.wait(), SERVE_S)
    server = await serve(Extender(store, kube, pods).handle, "127.0.0.1", 0)
    reaper = asyncio.create_task(GangReaper(store, kube, pods).run())
    urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"]
    for url in urls:
        await wait_serving(url, store, f"{url} does not serve\n" + cluster.logs()
                           + (tmp_path / "extender-0.log").read_text())
    all_gangs = gangs()
    for pods in all_gangs.values():
        for pod in pods:
            api.add_pod(pod)
    schedulers = [Scheduler("s0", [urls[0], urls[1]], api),
                  Scheduler("s1", [urls[1], urls[0]], api, backwards=True)]
    try:
        # Two pods of one gang in flight at once, one per extender: both filtered before
        # either is bound, then bound concurrently. Each gets its own part of the gang.
        p0, p1 = all_gangs["vc1-g0"]
        nodes = []
        for scheduler, pod in ((schedulers[0], p0), (schedulers[1], p1)):
            nodes.append((await scheduler.call("filter", {"pod": pod, "nodenames": NODES}))
                         ["NodeNames"][0])
        binds = await asyncio.gather(*(
            scheduler.call("bind", {"podName": pod["metadata"]["name"], "podNamespace": "default",
                                    "podUID": pod["metadata"]["uid"], "node": node})
            for scheduler, pod, node in ((schedulers[1], p1, nodes[1]),
                                         (schedulers[0], p0, nodes[0]))))
        assert binds == [{"Error": ""}] * 2
        schedulers[0].bound += 1
        schedulers[1].bound += 1
        await check(api, store, all_gangs)
        for _ in range(ROUNDS):
            await asyncio.gather(*(s.round() for s in schedulers))
        first = await check(api, store, all_gangs)
        assert len(first) == 4  # two gangs fill each VC
        assert sum(s.bound for s in schedulers) == 8

        # the sequencer (replica 0, extender 0's home) and extender 0 die
        cluster.kill(0)
        process.kill()
        done = sorted(first)[::2]  # one gang of each VC finishes: its pods go
        for gang in done:
            for pod in all_gangs[gang]:
                api.delete_pod("default", pod["metadata"]["name"])
        groups: set[str] = set()

        async def released() -> bool:
            nonlocal groups
            groups = {g["name"] for g in await store.allocations()}
            return not groups & set(done)

        deadline = asyncio.get_running_loop().time() + 30
        while not await released():
            assert asyncio.get_running_loop().time() < deadline, groups
            await asyncio.sleep(0.1)
        for _ in range(ROUNDS):
            await asyncio.gather(*(s.round() for s in schedulers))
        assert schedulers[0].failovers >= 1
        second = await check(api, store, all_gangs)
        assert len(second) == 4 and not second & set(done)
        assert sum(s.bound for s in schedulers) == 12
        assert await _converged(config), "the surviving replicas differ"
    finally:
        process.kill()
        process.wait()
        log.close()
        reaper.cancel()
        cache.cancel()
        await asyncio.gather(reaper, cache, return_exceptions=True)
        await kube.close()
        await server.stop()
        await store.close()
        await api.stop()


async def _converged(config: str) -> bool:
    """Whether replicas 1 and 2 hold the same store (one may apply a little later: poll)."""
    deadline = asyncio.get_running_loop().time() + 10
    while asyncio.get_running_loop().time() < deadline:
        digests = set()
        for replica in (1, 2):
            single = connect_store(config, replica)  # a stale read: its home replica's state
            digests.add((await single.digest(stale=True))["sha256"])
            await single.close()
        if len(digests) == 1:
            return True
        await asyncio.sleep(0.1)
    return False
