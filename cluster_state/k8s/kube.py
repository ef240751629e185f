"""The few Kubernetes API calls the extender makes — list nodes and pods, read a pod, bind a
pod with annotations (the Binding subresource, as HiveD does), watch nodes and pods — through
``kubernetes_asyncio`` (the ``k8s`` extra: ``pip install 'sdpaxos[k8s]'``).

Where the API server is:

* ``KubeApi.in_cluster()`` — the pod's service account, as client-go's in-cluster
  configuration (the library re-reads the token file, so rotated bound tokens keep working);
* ``await KubeApi.from_kubeconfig(path, context)`` — a kubeconfig (``$KUBECONFIG`` or
  ``~/.kube/config`` when ``path`` is empty);
* ``KubeApi("http://127.0.0.1:8001")`` — an explicit server without credentials: a test's
  fake API server, ``kubectl proxy``.

Objects come back as the API server's JSON (plain dicts, camelCase keys), not the library's
models: the extender reads pods' annotations and a few fields, and the generated models would
drop what they do not know and fail to decode a Binding's ``Status`` answer. Watches use the
library's ``Watch``: it resumes from the last resource version it saw (also advanced by
bookmarks) when a stream ends or sits idle, and raises ``ApiException(410)`` once that version
has expired ("Gone", retried once first); the callers then list again.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

try:
    import aiohttp
    from kubernetes_asyncio import client, config, watch
    from kubernetes_asyncio.client.exceptions import ApiException
except ImportError as exc:  # the extra is optional: the rest of sdpaxos runs without it
    raise ImportError(
        "the Kubernetes extender needs kubernetes_asyncio: pip install 'sdpaxos[k8s]'"
    ) from exc

from cluster_state.k8s.web import HttpError

__all__ = ["ApiException", "KubeApi"]

#: HTTP statuses of the API server the extender tells apart
CREATED, CONFLICT, OK, NOT_FOUND = 201, 409, 200, 404
#: a watch that delivers nothing (not even a bookmark) for this long is reopened from its
#: resource version: a half-open connection would otherwise hang the watcher for good
WATCH_IDLE_S = 300.0
#: the Watch decodes events into this "model": the raw JSON object, as every other call returns
RAW = "object"


class KubeApi:
    def __init__(self, server: str = "", *, configuration: client.Configuration | None = None,
                 timeout_s: float = 10.0) -> None:
        if configuration is None:
            if not server:
                raise ValueError("KubeApi needs a server URL or a client configuration")
            configuration = client.Configuration(host=server.rstrip("/"))
        self.configuration = configuration
        self.timeout_s = timeout_s
        self._client: client.ApiClient | None = None  # made on first use, in the running loop

    @classmethod
    def in_cluster(cls) -> KubeApi:
        configuration = client.Configuration()
        try:
            config.load_incluster_config(  # type: ignore[no-untyped-call]  # (untyped upstream)
                client_configuration=configuration)
        except config.ConfigException as exc:
            raise RuntimeError(f"no in-cluster Kubernetes configuration: {exc}") from exc
        return cls(configuration=configuration)

    @classmethod
    async def from_kubeconfig(cls, path: str = "", context: str = "") -> KubeApi:
        configuration = client.Configuration()
        try:
            await config.load_kube_config(config_file=path or None, context=context or None,
                                          client_configuration=configuration)
        except (config.ConfigException, OSError) as exc:
            raise RuntimeError(f"kubeconfig {path or '(default)'}: {exc}") from exc
        return cls(configuration=configuration)

    @property
    def server(self) -> str:
        return str(self.configuration.host)

    def _api_client(self) -> client.ApiClient:
        if self._client is None:
            self._client = client.ApiClient(self.configuration)
        return self._client

    def _core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self._api_client())

    async def version(self) -> dict[str, Any]:
        """``GET /version``: the API server's build (any client may ask); ``HttpError`` or an
        exception of the connection when it does not answer it."""
        return await self._get(client.VersionApi(self._api_client()).get_code)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _call(self, method: Callable[..., Awaitable[Any]], *args: Any) -> tuple[int, Any]:
        """(status, decoded JSON body) of one call; an unreachable server raises."""
        # _preload_content=False: the aiohttp response, whatever its status, read here
        response = await method(*args, _preload_content=False, _request_timeout=self.timeout_s)
        try:
            raw = await response.read()
        finally:
            response.release()
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            return response.status, {"error": raw.decode(errors="replace")}

    async def _get(self, method: Callable[..., Awaitable[Any]], *args: Any) -> dict[str, Any]:
        status, body = await self._call(method, *args)
        if status != OK or not isinstance(body, dict):
            raise HttpError(status, f"{method.__name__}{args}: {body}")
        return body

    async def list_nodes(self) -> dict[str, Any]:
        return await self._get(self._core().list_node)

    async def list_pods(self) -> dict[str, Any]:
        return await self._get(self._core().list_pod_for_all_namespaces)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._get(self._core().read_namespaced_pod, name, namespace)

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
        return await self._call(self._core().create_namespaced_pod_binding, name, namespace,
                                body)

    async def watch(self, kind: str, resource_version: str) -> AsyncIterator[dict[str, Any]]:
        """Watch events (``{"type": ADDED|MODIFIED|DELETED|BOOKMARK, "object": ...}``) of
        ``kind`` (``nodes`` or ``pods``) after ``resource_version``, reconnecting as the
        library does; ``ApiException`` (410: the version expired, list again) ends it."""
        core = self._core()
        listing = {"nodes": core.list_node, "pods": core.list_pod_for_all_namespaces}[kind]
        idle = aiohttp.ClientTimeout(sock_connect=self.timeout_s, sock_read=WATCH_IDLE_S)
        async with watch.Watch(return_type=RAW) as stream:
            async for event in stream.stream(listing, resource_version=resource_version,
                                             allow_watch_bookmarks=True,
                                             _request_timeout=idle):
                yield {"type": event["type"], "object": event["raw_object"]}
