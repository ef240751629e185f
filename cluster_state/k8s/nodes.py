"""Node health from Kubernetes: ``NodeWatcher`` lists the nodes, then watches them, and turns
each node's ``Ready`` condition (and ``spec.unschedulable``) into the store's node-health
operation, as HiveD's node informer does: a node is healthy when it is Ready and schedulable;
a deleted node is bad. Only changes are sent (the store ignores a node its configuration does
not know, with a warning). Several extenders may run it: the reports are idempotent.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from cluster_state.client import AllocationStore
from cluster_state.k8s.kube import KubeApi

__all__ = ["NodeWatcher", "node_healthy"]

log = logging.getLogger(__name__)

#: how long the watcher waits before listing again after its watch broke
REWATCH_S = 1.0


def node_healthy(node: dict[str, Any]) -> bool:
    """Ready and schedulable (HiveD's ``isNodeHealthy``)."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


class NodeWatcher:
    def __init__(self, store: AllocationStore, kube: KubeApi) -> None:
        self.store = store
        self.kube = kube
        self.known: dict[str, bool] = {}  # the health last reported per node

    async def _report(self, name: str, healthy: bool) -> None:
        if self.known.get(name) == healthy:
            return
        result = await self.store.set_node_health(name, healthy)
        self.known[name] = healthy
        if result.warning:
            log.warning("node %s: %s", name, result.warning)
        elif result.changed:
            log.info("node %s is %s", name, "healthy" if healthy else "bad")

    async def sync(self) -> str:
        """Report every listed node; the list's resource version (to watch from)."""
        listing = await self.kube.list_nodes()
        seen = set()
        for node in listing.get("items") or []:
            name = str((node.get("metadata") or {}).get("name") or "")
            if name:
                seen.add(name)
                await self._report(name, node_healthy(node))
        for name in sorted(set(self.known) - seen):  # gone while we were not watching
            await self._report(name, False)
        return str((listing.get("metadata") or {}).get("resourceVersion") or "0")

    async def run(self) -> None:
        while True:
            try:
                version = await self.sync()
                async for event in self.kube.watch("nodes", version):
                    node = event.get("object") or {}
                    name = str((node.get("metadata") or {}).get("name") or "")
                    kind = event.get("type")
                    if not name or kind not in ("ADDED", "MODIFIED", "DELETED"):
                        continue  # a BOOKMARK only moves the watch's resume version on
                    await self._report(name, kind != "DELETED" and node_healthy(node))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server or the store went away, or the
                # version expired (410 Gone: the watch resumes by itself otherwise): list again
                log.warning("node watch: %s; listing again", exc)
            await asyncio.sleep(REWATCH_S)
