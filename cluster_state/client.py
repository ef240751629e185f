"""``AllocationStore``: the scheduler's API to the replicated GPU allocation store.

One class, two ways in, the same calls:

* ``AllocationStore.connect(addresses, client_id=..., home=...)`` — remote, over the native
  client protocol to the replica at the scheduler's own site (retried on another replica with
  the same (client id, sequence number) after a timeout, so a retry takes effect once);
* ``AllocationStore.embedded(node, client_id=...)`` — a scheduler process that hosts a replica
  (``consensus.runtime.node.ReplicaNode`` serving a ``ClusterStore``) calls it directly.

Updates (``submit``, ``bind``, ``release``, ``set_node_health``) go through the log and are
linearizable; queries (``status``, ``vc``, ``summary``, ``allocations``) are linearizable reads
through the sequencer unless ``stale=True`` asks for the local replica's state. ``watch(r)``
yields every change event after revision ``r`` in order, exactly once, by reading pages of the
store's event log; if the store no longer has them it raises ``EventsCompacted``. A store
answer ``["error", reason]`` raises ``InvalidRequest``; an answer that may or may not have
taken effect raises ``consensus.errors.IndefiniteFailure`` (retry: it takes effect once).

    store = AllocationStore.connect([("10.0.0.1", 7100), ...], client_id=17, home=0)
    result = await store.submit(GroupSpec(name="job-1", vc="vc00", priority=100,
                                          members=(Member(pods=2, leaves=8),)))
    if isinstance(result, Placed):
        ...  # result.pods: (GPUs, node, devices) per pod; result.token: the fencing token
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgpack

from cluster_state import ops
from cluster_state.errors import EventsCompacted, InvalidRequest
from cluster_state.events import ChangeEvent
from cluster_state.ops import GroupSpec, Member, PodPlacement

__all__ = ["AllocationStore", "InvalidRequest", "Member", "PodPlacement"]


class _Remote:
    def __init__(self, addresses: Sequence[tuple[str, int]], client_id: int, home: int,
                 timeout_s: float) -> None:
        from consensus.runtime.client import Client

        self.client = Client(client_id, list(addresses), home=home, timeout_s=timeout_s)

    async def update(self, op: bytes) -> tuple[bytes, int]:
        reply = await self.client.execute(op)
        return bytes(reply.payload), reply.position  # type: ignore[arg-type]

    async def query(self, op: bytes, stale: bool) -> bytes:
        reply = await self.client.read(op, stale=stale)
        return bytes(reply.payload)  # type: ignore[arg-type]

    async def close(self) -> None:
        await self.client.close()


class _Embedded:
    def __init__(self, node: Any, client_id: int) -> None:
        self.node = node
        self.client_id = client_id
        self._seq = itertools.count()

    def _command(self, op: bytes) -> Any:
        from consensus.messages import Command

        return Command(client_id=self.client_id, seq=next(self._seq), op=op)

    async def update(self, op: bytes) -> tuple[bytes, int]:
        result = await self.node.submit(self._command(op))
        return result.value, result.position

    async def query(self, op: bytes, stale: bool) -> bytes:
        answer: bytes = await self.node.read(self._command(op), stale=stale)
        return answer

    async def close(self) -> None:
        return None


class AllocationStore:
    def __init__(self, channel: _Remote | _Embedded) -> None:
        self._channel = channel

    @classmethod
    def connect(
        cls, addresses: Sequence[tuple[str, int]], *, client_id: int, home: int = 0,
        timeout_s: float = 2.0,
    ) -> AllocationStore:
        """Talk to the replicas at ``addresses`` (client ports), ``addresses[home]`` first.
        ``client_id`` must be unique among the store's clients."""
        return cls(_Remote(addresses, client_id, home, timeout_s))

    @classmethod
    def embedded(cls, node: Any, *, client_id: int) -> AllocationStore:
        """Use the replica ``node`` (a ``ReplicaNode`` serving a ``ClusterStore``) hosted in
        this process."""
        return cls(_Embedded(node, client_id))

    async def close(self) -> None:
        await self._channel.close()

    # ------------------------------------------------------------------ updates
    async def submit(self, spec: GroupSpec) -> ops.Placed | ops.Preempting | ops.Waiting:
        result = await self._update(ops.submit(
            spec.name, spec.vc, spec.priority, spec.members,
            leaf_type=spec.leaf_type, pinned=spec.pinned, lazy=spec.lazy,
        ))
        assert isinstance(result, ops.Placed | ops.Preempting | ops.Waiting), result
        return result

    async def bind(
        self, spec: GroupSpec, pods: Sequence[PodPlacement], revision: int
    ) -> ops.Placed | ops.Conflict:
        """Place ``spec`` exactly at ``pods`` unless one of their GPUs changed after
        ``revision`` (a scheduler with its own placement policy)."""
        result = await self._update(ops.bind(
            spec.name, spec.vc, spec.priority, spec.members, tuple(pods), revision,
            leaf_type=spec.leaf_type, pinned=spec.pinned, lazy=spec.lazy,
        ))
        assert isinstance(result, ops.Placed | ops.Conflict), result
        return result

    async def release(self, name: str) -> ops.Released:
        result = await self._update(ops.release(name))
        assert isinstance(result, ops.Released), result
        return result

    async def set_node_health(self, node: str, healthy: bool) -> ops.NodeHealthSet:
        result = await self._update(ops.set_node_health(node, healthy))
        assert isinstance(result, ops.NodeHealthSet), result
        return result

    async def _update(self, op: bytes) -> ops.Result:
        payload, _ = await self._channel.update(op)
        result = ops.decode_result(payload)
        if isinstance(result, ops.Error):
            raise InvalidRequest(result.reason)
        return result

    # ------------------------------------------------------------------ queries
    async def status(self, name: str, *, stale: bool = False) -> dict[str, Any] | None:
        """The group ``name`` (state, placement, token...), or None if there is none."""
        info: dict[str, Any] | None = await self._query(ops.get_group(name), stale)
        return info

    async def vc(self, name: str, *, stale: bool = False) -> dict[str, Any]:
        """A virtual cluster's cells per level (free / used / bad) and GPU use."""
        info: dict[str, Any] = await self._query(ops.get_vc(name), stale)
        return info

    async def summary(self, *, stale: bool = False) -> dict[str, Any]:
        info: dict[str, Any] = await self._query(ops.get_summary(), stale)
        return info

    async def allocations(self, vc: str = "", *, stale: bool = False) -> list[dict[str, Any]]:
        """Every group (of ``vc``), in name order."""
        info: list[dict[str, Any]] = await self._query(ops.list_groups(vc), stale)
        return info

    async def _query(self, op: bytes, stale: bool) -> Any:
        answer = msgpack.unpackb(await self._channel.query(op, stale))
        if answer[0] == "error":
            raise InvalidRequest(answer[1])
        return answer[2]

    # ------------------------------------------------------------------ watch
    async def watch(
        self, since: int = -1, *, poll_s: float = 0.05
    ) -> AsyncIterator[ChangeEvent]:
        """Every change event with a revision above ``since``, in order, once each; new ones
        as they happen. Raises ``EventsCompacted`` if the store dropped some of them."""
        while True:
            answer = msgpack.unpackb(await self._channel.query(ops.get_events(since), False))
            if answer[0] == "compacted":
                raise EventsCompacted(answer[1], answer[2])
            events = [ChangeEvent.from_wire(wire) for wire in answer[2]]
            for event in events:
                yield event
            if events:
                since = events[-1].revision
            else:
                await asyncio.sleep(poll_s)
