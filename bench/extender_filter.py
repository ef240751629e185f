"""The extender's filter latency with many pods in the cluster: its pod cache (a watch, HiveD's
informer) against listing every pod from the API server on each filter (what the extender did
before it had the cache).

One process: the allocation store in memory (``synthetic_config``, ``--nodes`` x 8 GPUs,
``--vcs`` VCs; every decision still goes through ``ClusterStore.apply``), an API server
stand-in on loopback (aiohttp: a pod list of ``--pods`` HiveD pods — pending pods of 4-pod
gangs, as a busy cluster's queue — a watch that sends nothing, pod reads and Bindings), and
the extender (``Extender.handle``, HiveD's JSON in and out). Each filter is a new 1-GPU pod's
first filter (plan, conditional bind of the plan, claim of its member pod: the whole filtering
phase), its group released after. The variants alternate, ``--batch`` filters at a time, for
``--rounds`` rounds:

* ``cache``: the extender reads its pod cache (synced once, then kept by the watch);
* ``listing``: the cache is rebuilt from a full pod list before every filter (one GET of every
  pod and the parse of each pod's spec: the cost the extender paid on each filter before).

Reported per variant: filters, mean, p50, p99 and max latency (ms), and the pods listed.

    python -m bench.extender_filter [--pods 10000 --rounds 10 --batch 50] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import yaml
from aiohttp import web

from cluster_state import ClusterStore, synthetic_config
from cluster_state.client import AllocationStore
from cluster_state.k8s.extender import Extender
from cluster_state.k8s.hived import ENABLE_RESOURCE, SPEC_ANNOTATION
from cluster_state.k8s.hived_web import FILTER_PATH
from cluster_state.k8s.kube import KubeApi
from cluster_state.k8s.pods import PodCache
from cluster_state.ops import release
from consensus.messages import Command

__all__ = ["add_arguments", "run"]

VARIANTS = ("cache", "listing")
#: pods per pending gang in the API server's list
GANG = 4


def hived_pod(name: str, vc: str, group: str, pods: int) -> dict[str, Any]:
    """A pending pod asking HiveD for 1 GPU, one of ``pods`` of gang ``group``."""
    spec = {"virtualCluster": vc, "priority": 10, "leafCellNumber": 1,
            "affinityGroup": {"name": group, "members": [{"podNumber": pods,
                                                           "leafCellNumber": 1}]}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}",
                         "resourceVersion": "1",
                         "annotations": {SPEC_ANNOTATION: yaml.safe_dump(spec)}},
            "spec": {"schedulerName": "hivedscheduler", "containers": [{
                "name": "main", "image": "busybox",
                "resources": {"limits": {ENABLE_RESOURCE: "1"}}}]},
            "status": {"phase": "Pending"}}


class ApiServer:
    """Just what the extender asks during a filter: the pod list, an idle watch, a pod."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.lists = 0
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.stopping = asyncio.Event()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/pods", self.list_or_watch)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods/{name}", self.get)
        self.runner = web.AppRunner(app, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        self.stopping.set()
        assert self.runner is not None
        await self.runner.cleanup()

    async def list_or_watch(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch", "").lower() in ("true", "1"):
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            await self.stopping.wait()
            return response
        self.lists += 1
        return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": "1"},
                                  "items": list(self.pods.values())})

    async def get(self, request: web.Request) -> web.Response:
        pod = self.pods.get((request.match_info["namespace"], request.match_info["name"]))
        if pod is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        return web.json_response(pod)


class LocalChannel:
    """The store in this process: updates apply at the next log position."""

    def __init__(self, store: ClusterStore) -> None:
        self.store = store
        self.position = 0

    async def update(self, op: bytes, seq: int | None) -> bytes:
        self.position += 1
        return self.store.apply(self.position, Command(client_id=1, seq=self.position, op=op))

    async def query(self, op: bytes, stale: bool) -> bytes:
        return self.store.query(op)

    async def close(self) -> None:
        return None


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    config = synthetic_config(nodes=args.nodes, vcs=args.vcs)
    store = ClusterStore(config)
    vcs = [vc.name for vc in config.virtual_clusters]
    background = [hived_pod(f"queued-{i:05d}", vcs[i // GANG % len(vcs)], f"queued-{i // GANG}",
                            GANG) for i in range(args.pods)]
    api = ApiServer(background)
    await api.start()
    kube = KubeApi(api.url)
    channel = LocalChannel(store)
    client = AllocationStore(channel, 1)  # type: ignore[arg-type]
    pods = PodCache(kube)
    watching = asyncio.create_task(pods.run())
    await asyncio.wait_for(pods.synced.wait(), 60)
    extender = Extender(client, kube, pods)
    nodes = list(store.topology.nodes)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    lists = dict.fromkeys(VARIANTS, 0)
    serial = 0
    try:
        for _ in range(args.rounds):
            for variant in VARIANTS:
                for _ in range(args.batch):
                    serial += 1
                    pod = hived_pod(f"probe-{serial:06d}", vcs[serial % len(vcs)],
                                    f"probe-{serial}", 1)
                    api.pods[("bench", pod["metadata"]["name"])] = pod
                    pods.apply("ADDED", pod)  # as the watch would have delivered it
                    body = json.dumps({"Pod": pod, "NodeNames": nodes}).encode()
                    before = api.lists
                    start = time.perf_counter()
                    if variant == "listing":
                        await pods.sync()
                    reply = await extender.handle("POST", FILTER_PATH, {}, body)
                    times[variant].append(time.perf_counter() - start)
                    lists[variant] += api.lists - before
                    if not reply.body["NodeNames"]:
                        raise RuntimeError(f"the probe was not placed: {reply.body}")
                    await channel.update(release(f"probe-{serial}"), None)
                    del api.pods[("bench", pod["metadata"]["name"])]
                    pods.apply("DELETED", pod)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await kube.close()
        await api.stop()
    out: dict[str, Any] = {"pods": args.pods, "nodes": args.nodes, "rounds": args.rounds,
                           "batch": args.batch, "variants": {}}
    for variant, samples in times.items():
        ms = sorted(t * 1000 for t in samples)
        out["variants"][variant] = {
            "filters": len(ms), "mean_ms": round(statistics.fmean(ms), 3),
            "p50_ms": round(ms[len(ms) // 2], 3),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
            "max_ms": round(ms[-1], 3), "pod_lists": lists[variant]}
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", type=int, default=10_000,
                        help="HiveD pods the API server has (default 10000)")
    parser.add_argument("--nodes", type=int, default=1024, help="8-GPU nodes (default 1024)")
    parser.add_argument("--vcs", type=int, default=16, help="virtual clusters (default 16)")
    parser.add_argument("--rounds", type=int, default=10,
                        help="rounds of the alternated variants (default 10)")
    parser.add_argument("--batch", type=int, default=50,
                        help="filters per variant per round (default 50)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    if min(args.pods, args.nodes, args.vcs, args.rounds, args.batch) < 0 or args.rounds < 1 \
            or args.batch < 1:
        print("extender-filter: --rounds and --batch must be >= 1, sizes >= 0",
              file=sys.stderr)
        return 2
    result = asyncio.run(measure(args))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['pods']} pods in the API server, {result['nodes']} nodes; "
          f"{result['rounds']} rounds of {result['batch']} filters per variant, alternated")
    for variant, row in result["variants"].items():
        print(f"  {variant:<8} filters {row['filters']:>5}  mean {row['mean_ms']:>9.3f} ms  "
              f"p50 {row['p50_ms']:>9.3f}  p99 {row['p99_ms']:>9.3f}  max {row['max_ms']:>9.3f}"
              f"  pod lists {row['pod_lists']}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
