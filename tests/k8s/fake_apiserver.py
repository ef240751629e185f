"""A small fake Kubernetes API server on loopback: pods and nodes in memory, the Binding
subresource recorded (409 for a pod bound already, as the real one), lists with a resource
version and watches that replay every event after it (chunked JSON lines)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

from cluster_state.k8s.web import HttpError, Reply, Stream, serve


class FakeApiServer:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.bindings: list[dict[str, Any]] = []  # every accepted Binding body, in order
        self.refused_bindings: list[dict[str, Any]] = []
        self.version = 0
        self.history: dict[str, list[tuple[int, dict[str, Any]]]] = {"pods": [], "nodes": []}
        self.changed = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self.server = await serve(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()

    # ------------------------------------------------------------------ test-side changes
    def _emit(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.history[kind].append((self.version, {"type": event, "object": copy.deepcopy(obj)}))
        self.changed.set()
        self.changed = asyncio.Event()

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

    # ------------------------------------------------------------------ the API
    async def handle(self, method: str, path: str, query: dict[str, list[str]],
                     body: Any) -> Reply | Stream:
        parts = path.strip("/").split("/")
        if method == "GET" and parts in (["api", "v1", "pods"], ["api", "v1", "nodes"]):
            kind = parts[2]
            if query.get("watch") == ["true"]:
                since = int((query.get("resourceVersion") or ["0"])[0] or 0)
                return Stream(self._watch(kind, since))
            items = self.pods.values() if kind == "pods" else self.nodes.values()
            return Reply(200, {"kind": "List", "metadata": {"resourceVersion": str(self.version)},
                               "items": copy.deepcopy(list(items))})
        if len(parts) >= 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            key = (parts[3], parts[5])
            pod = self.pods.get(key)
            if pod is None:
                raise HttpError(404, f"pod {key} not found")
            if method == "GET" and len(parts) == 6:
                return Reply(200, copy.deepcopy(pod))
            if method == "POST" and parts[6:] == ["binding"]:
                return self._bind(pod, body)
        raise HttpError(404, f"no route {method} {path}")

    def _bind(self, pod: dict[str, Any], body: Any) -> Reply:
        if not isinstance(body, dict) or body.get("kind") != "Binding":
            raise HttpError(400, "not a Binding")
        target = (body.get("target") or {}).get("name")
        uid = (body.get("metadata") or {}).get("uid")
        if target not in self.nodes:
            raise HttpError(400, f"no node {target}")
        if uid and uid != pod["metadata"]["uid"]:
            self.refused_bindings.append(body)
            return Reply(409, {"message": "uid precondition failed"})
        if pod["spec"].get("nodeName"):
            self.refused_bindings.append(body)
            return Reply(409, {"message": f"pod is already assigned to {pod['spec']['nodeName']}"})
        pod["spec"]["nodeName"] = target
        pod["metadata"].setdefault("annotations", {}).update(
            (body.get("metadata") or {}).get("annotations") or {})
        self.bindings.append(copy.deepcopy(body))
        self._emit("pods", "MODIFIED", pod)
        return Reply(201, {"kind": "Status", "status": "Success"})

    async def _watch(self, kind: str, since: int) -> AsyncIterator[dict[str, Any]]:
        sent = since
        while True:
            pending = [e for v, e in self.history[kind] if v > sent]
            for event in pending:
                yield event
            if pending:
                sent = self.history[kind][-1][0]
            await self.changed.wait()


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
