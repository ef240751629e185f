"""``sdpaxos extender``: run the HiveD-compatible scheduler extender (``cluster_state.k8s``)
against a replicated allocation store.

    sdpaxos extender --config cluster.toml --listen 0.0.0.0:30096 --home 0 [--watch-nodes]
        [--force-pod-bind-threshold 3] [--waiting-pod-scheduling-block-ms 0]

The store is reached through the cluster file's client addresses (its own ``[tls]`` client
certificate when the cluster runs TLS), starting with replica ``--home``. The Kubernetes API
(through ``kubernetes_asyncio``, the ``k8s`` extra) is ``--kube-api URL`` (no credentials: a
test's fake server or ``kubectl proxy``), ``--kubeconfig PATH`` (with ``--kube-context``) or,
by default, the pod's in-cluster service account. The extender serves once its pod cache has
listed the pods (HiveD's informer sync). ``--force-pod-bind-threshold`` and
``--waiting-pod-scheduling-block-ms`` are HiveD's ``forcePodBindThreshold`` and
``waitingPodSchedulingBlockMilliSec``, with HiveD's defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from cluster_state.client import AllocationStore, new_client_id

if TYPE_CHECKING:
    from cluster_state.k8s.kube import KubeApi
    from cluster_state.k8s.web import Handler, Reply

__all__ = ["add_arguments", "connect_store", "health_check", "run"]

log = logging.getLogger("sdpaxos.extender")


def connect_store(config_path: str, home: int) -> AllocationStore:
    """A session with the store of the cluster file at ``config_path``."""
    from consensus.runtime.cluster_config import load_cluster_config

    config = load_cluster_config(config_path)
    config.replica(home)  # a ConfigError for an unknown replica
    addresses = [spec.client_address for spec in config.replicas]
    client_id = new_client_id()
    # a TLS cluster's extender presents the cluster file's client certificate
    tls = config.tls.tool() if config.tls is not None else None
    return AllocationStore.connect(addresses, client_id=client_id, home=home, tls=tls)


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, not {text!r}")
    return host or "0.0.0.0", int(port)


def _non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, not {text!r}")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the store's cluster file")
    parser.add_argument("--home", type=int, default=0,
                        help="the replica to talk to first (the one at this site)")
    parser.add_argument("--listen", type=_host_port, default=("0.0.0.0", 30096),
                        metavar="HOST:PORT",
                        help="where kube-scheduler reaches the extender (HiveD's port 30096)")
    parser.add_argument("--kube-api", default="", metavar="URL",
                        help="the Kubernetes API, without credentials (default: the pod's "
                        "in-cluster service account)")
    parser.add_argument("--kubeconfig", default="", metavar="PATH",
                        help="reach the Kubernetes API as this kubeconfig says")
    parser.add_argument("--kube-context", default="", metavar="NAME",
                        help="the kubeconfig's context (default: its current one)")
    parser.add_argument("--watch-nodes", action="store_true",
                        help="turn node Ready conditions and deletions into node health")
    parser.add_argument("--force-pod-bind-threshold", type=_non_negative, default=3,
                        metavar="N", help="filters of a binding pod after which the extender "
                        "binds it itself (HiveD's forcePodBindThreshold; default 3)")
    parser.add_argument("--waiting-pod-scheduling-block-ms", type=_non_negative, default=0,
                        metavar="MS", help="how long the filter of a pod that waits holds the "
                        "other scheduling back (HiveD's waitingPodSchedulingBlockMilliSec; "
                        "default 0)")
    parser.add_argument("--no-release", action="store_true",
                        help="do not release groups whose pods are all gone (another instance "
                        "does)")
    from consensus.runtime.logs import add_log_level_argument

    add_log_level_argument(parser)


def run(args: argparse.Namespace) -> int:
    from consensus.errors import ConfigError
    from consensus.runtime.logs import configure_logging

    configure_logging(args.log_level)  # JSON lines, as the replicas log
    try:
        import cluster_state.k8s.kube  # noqa: F401  (kubernetes_asyncio: the k8s extra)
    except ImportError as exc:
        print(f"sdpaxos extender: {exc}", file=sys.stderr)
        return 2
    try:
        store = connect_store(args.config, args.home)
    except ConfigError as exc:
        print(f"sdpaxos extender: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(store, args))


#: seconds ``/healthz`` gives the Kubernetes API server and the store to answer
HEALTH_TIMEOUT_S = 3.0


def health_check(store: AllocationStore, kube: KubeApi, synced: asyncio.Event | None = None
                 ) -> Callable[[], Awaitable[Reply]]:
    """The extender's ``/healthz`` (and ``/readyz``): 200 once the Kubernetes API server
    answers ``GET /version`` and the store a linearizable read, each within
    ``HEALTH_TIMEOUT_S``, and the pod cache has synced (``synced``); else 503 naming what
    failed (kube-scheduler should not count on an extender that can neither bind nor
    decide). ``/livez`` only says the process runs."""
    from cluster_state.k8s.web import Reply

    async def probe(what: str, call: Awaitable[Any]) -> str | None:
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                await call
        except TimeoutError:
            return f"{what}: no answer within {HEALTH_TIMEOUT_S:g} s"
        except Exception as exc:  # whatever the client raised: that is the reason
            return f"{what}: {exc or type(exc).__name__}"
        return None

    async def check() -> Reply:
        problems = [p for p in await asyncio.gather(
            probe(f"Kubernetes API {kube.server}", kube.version()),
            probe("allocation store", store.summary()),
        ) if p is not None]
        if synced is not None and not synced.is_set():
            problems.append(NOT_SYNCED)
        if problems:
            return Reply(503, {"status": "unavailable", "problems": problems})
        return Reply(200, {"status": "ok"})

    return check


#: why the extender answers no verb yet
NOT_SYNCED = "the pod cache has not synced with the Kubernetes API yet"


def _once_synced(handler: Handler, synced: asyncio.Event) -> Handler:
    """``handler`` once the pod cache has synced (HiveD decides once its informers synced);
    503 before."""
    from cluster_state.k8s.web import Reply

    async def handle(method: str, path: str, query: dict[str, list[str]], body: bytes
                     ) -> Reply:
        if not synced.is_set():
            return Reply(503, {"error": NOT_SYNCED})
        return await handler(method, path, query, body)

    return handle


async def _kube(args: argparse.Namespace) -> KubeApi:
    from cluster_state.k8s.kube import KubeApi

    if args.kube_api:
        return KubeApi(args.kube_api)
    if args.kubeconfig or args.kube_context:
        return await KubeApi.from_kubeconfig(args.kubeconfig, args.kube_context)
    return KubeApi.in_cluster()


async def _serve(store: AllocationStore, args: argparse.Namespace) -> int:
    from cluster_state.k8s.extender import Extender, GangReaper
    from cluster_state.k8s.nodes import NodeWatcher
    from cluster_state.k8s.pods import PodCache
    from cluster_state.k8s.web import serve

    try:
        kube = await _kube(args)
    except RuntimeError as exc:  # no in-cluster configuration, a bad kubeconfig
        print(f"sdpaxos extender: {exc}", file=sys.stderr)
        await store.close()
        return 2
    pods = PodCache(kube)
    tasks = [asyncio.create_task(pods.run(), name="pods")]
    watcher = NodeWatcher(store, kube) if args.watch_nodes else None
    if watcher is not None:
        tasks.append(asyncio.create_task(watcher.run(), name="nodes"))
    extender = Extender(store, kube, pods, force_bind_threshold=args.force_pod_bind_threshold,
                        waiting_block_ms=args.waiting_pod_scheduling_block_ms,
                        node_known=watcher.known.__contains__ if watcher is not None else None)
    if not args.no_release:
        tasks.append(asyncio.create_task(GangReaper(store, kube, pods).run(), name="reaper"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    try:  # listening at once: a taken port is said now, probes answer while the cache syncs
        server = await serve(_once_synced(extender.handle, pods.synced), *args.listen,
                             health=health_check(store, kube, pods.synced))
    except OSError as exc:  # the port is taken, say: said plainly, not as a traceback
        print(f"sdpaxos extender: cannot listen on {args.listen[0]}:{args.listen[1]}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        code = 1
    else:
        log.info("extender listening on %s:%d", *server.sockets[0].getsockname()[:2])
        await stop.wait()
        await server.stop()
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await kube.close()
    await store.close()
    return code
