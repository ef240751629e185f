"""The few Kubernetes API calls the extender makes: list nodes and pods, read a pod, bind a
pod with annotations (the Binding subresource, as HiveD does), and watch nodes and pods.

``KubeApi(base_url)`` talks plain HTTP (a test's fake API server, ``kubectl proxy``);
``KubeApi.in_cluster()`` uses the pod's service account (its token and CA bundle) against
``KUBERNETES_SERVICE_HOST``, as client-go's in-cluster configuration does.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cluster_state.k8s.web import HttpError, request, stream

__all__ = ["SERVICE_ACCOUNT", "KubeApi"]

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: HTTP statuses of the API server the extender tells apart
CREATED, CONFLICT, OK, NOT_FOUND = 201, 409, 200, 404


class KubeApi:
    def __init__(self, base_url: str, *, token: str = "", tls: ssl.SSLContext | None = None,
                 timeout_s: float = 10.0) -> None:
        self.base = base_url.rstrip("/")
        self.token = token
        self.tls = tls
        self.timeout_s = timeout_s

    @classmethod
    def in_cluster(cls) -> KubeApi:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise RuntimeError("not in a Kubernetes pod: KUBERNETES_SERVICE_HOST is not set")
        tls = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        token = (SERVICE_ACCOUNT / "token").read_text().strip()
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        return cls(f"https://{host}:{port}", token=token, tls=tls)

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await request(self.base, method, path, body, token=self.token, tls=self.tls,
                             timeout_s=self.timeout_s)

    async def _get(self, path: str) -> Any:
        status, body = await self._call("GET", path)
        if status != OK:
            raise HttpError(status, f"GET {path}: {body}")
        return body

    async def list_nodes(self) -> dict[str, Any]:
        nodes: dict[str, Any] = await self._get("/api/v1/nodes")
        return nodes

    async def list_pods(self) -> dict[str, Any]:
        pods: dict[str, Any] = await self._get("/api/v1/pods")
        return pods

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = await self._get(
            f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}")
        return pod

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: dict[str, str]) -> tuple[int, Any]:
        """POST the pod's Binding (the annotations ride on its metadata, as HiveD's do):
        (status, body); 201 bound, 409 already bound."""
        body = {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid,
                         "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        return await self._call(
            "POST", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/binding", body)

    def watch(self, kind: str, resource_version: str) -> AsyncIterator[Any]:
        """Watch events (``{"type": ADDED|MODIFIED|DELETED|ERROR, "object": ...}``) of
        ``kind`` (``nodes`` or ``pods``) after ``resource_version``."""
        return stream(self.base, f"/api/v1/{kind}?watch=true&allowWatchBookmarks=false"
                      f"&resourceVersion={quote(resource_version)}", token=self.token,
                      tls=self.tls)
