"""A small fake Kubernetes API server on loopback (aiohttp's server), answering the requests
``kubernetes_asyncio`` makes: pods and nodes in memory, the Binding subresource recorded (409
for a pod bound already, as the real one), lists with a resource version and watches
(``?watch=True&resourceVersion=N``, chunked JSON lines) that replay every event after it.

``bookmark(kind)`` sends a BOOKMARK (the current resource version, nothing changed) to the
watches that allow them. Watch trouble on demand: ``hold_watches()`` stops delivering events
(a stalled stream), ``drop_watches()`` ends every open watch (the API server's request
timeout), and ``compact()`` forgets the history so far (etcd's compaction): a watch from an
older version then gets the ``ERROR`` event with status 410 (Gone), as the real one sends.
Every request is logged in ``requests`` (method, path, query) and ``headers``."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from aiohttp import web

#: the status the API server answers a watch whose resource version was compacted away
GONE = 410


class FakeApiServer:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.bindings: list[dict[str, Any]] = []  # every accepted Binding body, in order
        self.refused_bindings: list[dict[str, Any]] = []
        self.bookmarks_sent = 0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.headers: list[dict[str, str]] = []  # of each request, in the same order
        self.version = 0
        self.compacted = 0  # a watch from an older resource version is Gone
        self.held = False
        self.history: dict[str, list[tuple[int, dict[str, Any]]]] = {"pods": [], "nodes": []}
        self.changed = asyncio.Event()
        self.cut = asyncio.Event()  # set: the watches open now end
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.handle)
        self.runner = web.AppRunner(app, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self.runner is not None
        self.drop_watches()
        await self.runner.cleanup()

    # ------------------------------------------------------------------ test-side changes
    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def _emit(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.history[kind].append((self.version, {"type": event, "object": copy.deepcopy(obj)}))
        self._wake()

    def add_pod(self, pod: dict[str, Any]) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        self.pods[key] = pod
        self._emit("pods", "ADDED", pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        pod = self.pods.pop((namespace, name))
        self._emit("pods", "DELETED", pod)

    def set_node(self, name: str, ready: bool) -> None:
        node = self.nodes.get(name)
        event = "MODIFIED" if node else "ADDED"
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                "spec": {}, "status": {"conditions": [
                    {"type": "Ready", "status": "True" if ready else "False"}]}}
        self.nodes[name] = node
        self._emit("nodes", event, node)

    def delete_node(self, name: str) -> None:
        self._emit("nodes", "DELETED", self.nodes.pop(name))

    def bookmark(self, kind: str) -> None:
        mark = {"kind": "Node" if kind == "nodes" else "Pod",
                "metadata": {"resourceVersion": str(self.version)}}
        self.history[kind].append((self.version, {"type": "BOOKMARK", "object": mark}))
        self._wake()

    def hold_watches(self) -> None:
        self.held = True

    def drop_watches(self) -> None:
        self.cut.set()
        self.cut = asyncio.Event()
        self._wake()

    def compact(self) -> None:
        """Forget the history up to now and end the open watches (which resume from their
        last version: too old now)."""
        self.compacted = self.version
        for kind in self.history:
            self.history[kind] = [(v, e) for v, e in self.history[kind] if v > self.compacted]
        self.held = False
        self.drop_watches()

    def lists(self, kind: str) -> int:
        """How many times ``kind`` was listed (not watched)."""
        return sum(1 for method, path, query in self.requests
                   if method == "GET" and path == f"/api/v1/{kind}" and not _watching(query))

    # ------------------------------------------------------------------ the API
    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append((request.method, request.path, query))
        self.headers.append(dict(request.headers))
        parts = request.path.strip("/").split("/")
        if request.method == "GET" and parts == ["version"]:
            return web.json_response({"major": "1", "minor": "30", "gitVersion": "v1.30.0-fake"})
        if request.method == "GET" and parts in (["api", "v1", "pods"], ["api", "v1", "nodes"]):
            kind = parts[2]
            if _watching(query):
                return await self._watch(request, kind, int(query.get("resourceVersion") or 0),
                                         bookmarks=_flag(query.get("allowWatchBookmarks")))
            items = self.pods.values() if kind == "pods" else self.nodes.values()
            return web.json_response({
                "kind": "List", "metadata": {"resourceVersion": str(self.version)},
                "items": copy.deepcopy(list(items))})
        if len(parts) >= 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            key = (parts[3], parts[5])
            pod = self.pods.get(key)
            if pod is None:
                return _status(404, f"pod {key} not found")
            if request.method == "GET" and len(parts) == 6:
                return web.json_response(copy.deepcopy(pod))
            if request.method == "POST" and parts[6:] == ["binding"]:
                try:
                    body = await request.json()
                except ValueError:
                    return _status(400, "the body is not JSON")
                return self._bind(pod, body)
        return _status(404, f"no route {request.method} {request.path}")

    def _bind(self, pod: dict[str, Any], body: Any) -> web.Response:
        if not isinstance(body, dict) or body.get("kind") != "Binding":
            return _status(400, "not a Binding")
        target = (body.get("target") or {}).get("name")
        uid = (body.get("metadata") or {}).get("uid")
        if target not in self.nodes:
            return _status(400, f"no node {target}")
        if uid and uid != pod["metadata"]["uid"]:
            self.refused_bindings.append(body)
            return _status(409, "uid precondition failed")
        if pod["spec"].get("nodeName"):
            self.refused_bindings.append(body)
            return _status(409, f"pod is already assigned to {pod['spec']['nodeName']}")
        pod["spec"]["nodeName"] = target
        pod["metadata"].setdefault("annotations", {}).update(
            (body.get("metadata") or {}).get("annotations") or {})
        self.bindings.append(copy.deepcopy(body))
        self._emit("pods", "MODIFIED", pod)
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)

    async def _watch(self, request: web.Request, kind: str, since: int, *,
                     bookmarks: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if since < self.compacted:
            gone = {"kind": "Status", "status": "Failure", "code": GONE, "reason": "Expired",
                    "message": f"too old resource version: {since} ({self.compacted})"}
            await response.write(_line({"type": "ERROR", "object": gone}))
            await response.write_eof()
            return response
        cut = self.cut
        sent = since
        try:
            while not cut.is_set():
                if not self.held:
                    for version, event in self.history[kind]:
                        if version <= sent:
                            continue
                        if event["type"] == "BOOKMARK" and not bookmarks:
                            continue
                        await response.write(_line(event))
                        sent = version
                        self.bookmarks_sent += event["type"] == "BOOKMARK"
                await self.changed.wait()
            await response.write_eof()
        except ConnectionError:  # the client went away (aiohttp's reset error is one)
            pass
        return response


def _flag(value: str | None) -> bool:
    """A boolean query parameter, as the API server parses it (Go's ParseBool)."""
    return (value or "").lower() in ("true", "1", "t")


def _watching(query: dict[str, str]) -> bool:
    return _flag(query.get("watch"))


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode() + b"\n"


def _status(code: int, message: str) -> web.Response:
    """The API server's ``Status`` answer for a failed request."""
    return web.json_response({"kind": "Status", "status": "Failure", "code": code,
                              "message": message}, status=code)


def hived_pod(name: str, *, vc: str, priority: int, leaves: int, group: str,
              members: list[tuple[int, int]], namespace: str = "default",
              ignore_suggested: bool = True, uid: str = "") -> dict[str, Any]:
    """A pod asking HiveD (an annotation and the enabling resource) for ``leaves`` GPUs."""
    import yaml

    spec = {"virtualCluster": vc, "priority": priority, "leafCellNumber": leaves,
            "affinityGroup": {"name": group, "members": [
                {"podNumber": p, "leafCellNumber": n} for p, n in members]},
            "ignoreK8sSuggestedNodes": ignore_suggested}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
                     "annotations": {
                         "hivedscheduler.microsoft.com/pod-scheduling-spec": yaml.safe_dump(spec)}},
        "spec": {"schedulerName": "hivedscheduler", "containers": [{
            "name": "main", "image": "busybox",
            "resources": {"limits": {"hivedscheduler.microsoft.com/pod-scheduling-enable": 1}}}]},
        "status": {"phase": "Pending"},
    }
