"""The extender's pod informer: HiveD's pod cache, so a filter or a bind reads memory instead
of listing every pod of the cluster from the API server.

``PodCache.run`` lists the pods once, then watches them from the list's resource version
(``kube.KubeApi.watch``: it resumes by itself after a dropped stream, and raises once the
version has expired, 410 Gone); whenever the watch fails it lists again and diffs. It keeps
the pods HiveD's informer keeps (``IsInterested``): live (not Succeeded or Failed, no
deletion timestamp) and asking for HiveD (``hived.hived_enabled``), indexed by
namespace/name, by UID and by affinity group (a pod whose spec HiveD would refuse is kept, in
no group). A pod that leaves that set — deleted, finished, or replaced by another UID under
its name, also when a re-list finds it gone — is put on ``gone`` (a queue the gang reaper
reads), as HiveD's informer calls its delete handler.

The cache may lag the API server; nothing that must be exact is decided from it alone: which
pod holds which member pod is the store's claim (the cache only suggests the slot), a
member's holder is declared gone only after a GET of that pod, and the reaper lists the API
server before it releases a group. ``synced`` is set once the first list is in (HiveD serves
only after ``WaitForCacheSync``; the extender answers what the cache does not hold with a GET
of the pod meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cluster_state.k8s.hived import PodRequest, SpecError, hived_enabled, pod_request
from cluster_state.k8s.kube import KubeApi

__all__ = ["CachedPod", "PodCache", "interesting", "live"]

log = logging.getLogger(__name__)

#: pod phases that hold no resources any more
FINISHED = ("Succeeded", "Failed")
#: how long the cache waits before listing again after its watch broke
REWATCH_S = 1.0


def live(pod: dict[str, Any]) -> bool:
    """Not finished and not being deleted."""
    meta = pod.get("metadata") or {}
    return not meta.get("deletionTimestamp") and (
        (pod.get("status") or {}).get("phase") not in FINISHED)


def interesting(pod: dict[str, Any]) -> bool:
    """HiveD's ``IsInterested``: a live pod that asks for HiveD."""
    return live(pod) and hived_enabled(pod)


@dataclass(frozen=True, slots=True)
class CachedPod:
    """One pod of the cache, with its request read once (None: a spec HiveD refuses)."""

    pod: dict[str, Any]
    request: PodRequest | None

    @property
    def uid(self) -> str:
        return str((self.pod.get("metadata") or {}).get("uid") or "")

    @property
    def node(self) -> str:
        return str((self.pod.get("spec") or {}).get("nodeName") or "")


def _key(pod: dict[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class PodCache:
    """The live HiveD pods the API server has, as of ``version`` (see the module
    documentation)."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self.synced = asyncio.Event()
        self.version = ""
        self.gone: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.lists = 0  # how many times it listed (a test counts them)
        self._pods: dict[tuple[str, str], CachedPod] = {}
        self._uids: dict[str, tuple[str, str]] = {}
        self._groups: dict[str, set[tuple[str, str]]] = {}

    # ------------------------------------------------------------------ reads
    def __len__(self) -> int:
        return len(self._pods)

    def pod(self, namespace: str, name: str) -> CachedPod | None:
        return self._pods.get((namespace, name))

    def by_uid(self, uid: str) -> CachedPod | None:
        key = self._uids.get(uid)
        return self._pods.get(key) if key is not None else None

    def gang(self, group: str) -> list[CachedPod]:
        """The pods of affinity group ``group``, in namespace/name order."""
        return [self._pods[key] for key in sorted(self._groups.get(group, ()))]

    def __iter__(self) -> Iterator[CachedPod]:
        return iter(list(self._pods.values()))

    # ------------------------------------------------------------------ changes
    def apply(self, kind: str, pod: dict[str, Any]) -> None:
        """One watch event (``ADDED`` / ``MODIFIED`` / ``DELETED``) about ``pod``."""
        key = _key(pod)
        version = (pod.get("metadata") or {}).get("resourceVersion")
        if version:
            self.version = str(version)
        if kind == "BOOKMARK":
            return
        old = self._pods.get(key)
        keep = kind != "DELETED" and interesting(pod)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if old is not None and (not keep or old.uid != uid):
            self._remove(key)
            self.gone.put_nowait(old.pod if keep else pod)
        if keep:
            self._add(key, pod)

    def _add(self, key: tuple[str, str], pod: dict[str, Any]) -> None:
        try:
            request: PodRequest | None = pod_request(pod)
        except SpecError:
            request = None
        old = self._pods.get(key)
        if old is not None and old.request is not None:
            self._groups[old.request.spec.name].discard(key)
            if not self._groups[old.request.spec.name]:
                del self._groups[old.request.spec.name]
        cached = CachedPod(pod, request)
        self._pods[key] = cached
        self._uids[cached.uid] = key
        if request is not None:
            self._groups.setdefault(request.spec.name, set()).add(key)

    def _remove(self, key: tuple[str, str]) -> None:
        old = self._pods.pop(key)
        if self._uids.get(old.uid) == key:
            del self._uids[old.uid]
        if old.request is not None:
            members = self._groups[old.request.spec.name]
            members.discard(key)
            if not members:
                del self._groups[old.request.spec.name]

    def replace(self, listing: dict[str, Any]) -> None:
        """Take a full list: pods missing from it are gone."""
        self.lists += 1
        pods = [p for p in listing.get("items") or [] if isinstance(p, dict)]
        seen = {_key(p) for p in pods if interesting(p)}
        for key in [k for k in self._pods if k not in seen]:
            gone = self._pods[key].pod
            self._remove(key)
            self.gone.put_nowait(gone)
        for pod in pods:
            self.apply("MODIFIED", pod)
        self.version = str((listing.get("metadata") or {}).get("resourceVersion") or "0")

    # ------------------------------------------------------------------ the informer
    async def sync(self) -> None:
        self.replace(await self.kube.list_pods())
        self.synced.set()

    async def run(self) -> None:
        while True:
            try:
                await self.sync()
                async for event in self.kube.watch("pods", self.version):
                    kind = str(event.get("type") or "")
                    obj = event.get("object")
                    if kind in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK") and isinstance(
                            obj, dict):
                        self.apply(kind, obj)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server went away, or the version expired
                log.warning("pod watch: %s; listing again", exc)
            await asyncio.sleep(REWATCH_S)
