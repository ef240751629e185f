"""The ``AllocationService`` servicer (grpc.aio), a replica-side adapter over ``AllocationStore``.

Every replica serving the store runs it (``sdpaxos serve`` with a ``grpc_address``) against
its own node, embedded: a call is one update through the log or one read. Errors map to
status codes: an invalid request is ``INVALID_ARGUMENT`` (nothing changed), an outcome the
replica cannot vouch for (a failover while the update was in flight) is ``UNAVAILABLE``
(retrying with the same request is safe only for reads and releases; a retried submit of the
same group name returns its current state), compacted watch history is ``OUT_OF_RANGE``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc

from cluster_state import ops
from cluster_state.client import AllocationStore, InvalidRequest
from cluster_state.errors import EventsCompacted
from cluster_state.grpc_api import cluster_state_pb2 as pb
from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc
from consensus.errors import DefiniteFailure, SDPaxosError

__all__ = ["AllocationServicer", "serve_grpc", "spec_from_pb", "spec_to_pb"]

#: client ids the servicers use for their log entries (one per call: calls are concurrent)
_SERVICE_CLIENT_BASE = 1 << 48


def spec_to_pb(spec: ops.GroupSpec) -> pb.GroupSpec:
    return pb.GroupSpec(
        name=spec.name, vc=spec.vc, priority=spec.priority,
        members=[pb.Member(pods=m.pods, leaves=m.leaves) for m in spec.members],
        leaf_type=spec.leaf_type, pinned=spec.pinned, lazy=spec.lazy,
    )


def spec_from_pb(group: pb.GroupSpec) -> ops.GroupSpec:
    return ops.GroupSpec(
        name=group.name, vc=group.vc, priority=group.priority,
        members=tuple(ops.Member(m.pods, m.leaves) for m in group.members),
        leaf_type=group.leaf_type, pinned=group.pinned, lazy=group.lazy,
    )


class AllocationServicer(pb_grpc.AllocationServiceServicer):
    def __init__(self, node: Any, replica_id: int) -> None:
        self._node = node
        # Each call gets its own client id, so the replicated session table never confuses
        # two calls; ids are unique per replica and per process start (the counter starts
        # from the clock's microseconds: a restarted replica does not reuse them).
        import time

        base = _SERVICE_CLIENT_BASE + (replica_id << 40)
        self._ids = itertools.count(base + (time.time_ns() // 1000) % (1 << 39))

    def _store(self) -> AllocationStore:
        return AllocationStore.embedded(self._node, client_id=next(self._ids))

    async def Submit(self, request: pb.SubmitRequest, context: Any) -> pb.SubmitReply:
        result = await self._call(context, self._store().submit(spec_from_pb(request.group)))
        if isinstance(result, ops.Placed):
            pods = [pb.Pod(leaves=n, node=node, devices=list(d)) for n, node, d in result.pods]
            return pb.SubmitReply(placed=pb.Placed(group=result.group, chain=result.chain,
                                                   pods=pods, token=result.token))
        if isinstance(result, ops.Preempting):
            return pb.SubmitReply(preempting=pb.Preempting(group=result.group,
                                                           victims=list(result.victims)))
        return pb.SubmitReply(waiting=pb.Waiting(group=result.group, reason=result.reason))

    async def Release(self, request: pb.ReleaseRequest, context: Any) -> pb.ReleaseReply:
        result = await self._call(context, self._store().release(request.group))
        return pb.ReleaseReply(promoted=list(result.promoted))

    async def SetNodeHealth(
        self, request: pb.NodeHealthRequest, context: Any
    ) -> pb.NodeHealthReply:
        result = await self._call(
            context, self._store().set_node_health(request.node, request.healthy)
        )
        return pb.NodeHealthReply(changed=result.changed, cancelled=list(result.cancelled))

    async def GetGroup(self, request: pb.QueryRequest, context: Any) -> pb.JsonReply:
        info = await self._call(context, self._store().status(request.name, stale=request.stale))
        if info is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no group {request.name!r}")
        return pb.JsonReply(json=json.dumps(info))

    async def GetVC(self, request: pb.QueryRequest, context: Any) -> pb.JsonReply:
        info = await self._call(context, self._store().vc(request.name, stale=request.stale))
        return pb.JsonReply(json=json.dumps(info))

    async def GetSummary(self, request: pb.QueryRequest, context: Any) -> pb.JsonReply:
        info = await self._call(context, self._store().summary(stale=request.stale))
        return pb.JsonReply(json=json.dumps(info))

    async def ListAllocations(self, request: pb.QueryRequest, context: Any) -> pb.JsonReply:
        info = await self._call(
            context, self._store().allocations(request.name, stale=request.stale)
        )
        return pb.JsonReply(json=json.dumps(info))

    async def Watch(self, request: pb.WatchRequest, context: Any) -> AsyncIterator[pb.Event]:
        try:
            async for event in self._store().watch(request.since):
                yield pb.Event(revision=event.revision, kind=event.kind, subject=event.subject,
                               data_json=json.dumps(list(event.data)))
        except EventsCompacted as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
        except SDPaxosError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def _call(self, context: Any, call: Any) -> Any:
        try:
            return await call
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.reason)
        except DefiniteFailure as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except SDPaxosError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))


async def serve_grpc(node: Any, replica_id: int, host: str, port: int) -> Any:
    """Start the service for ``node`` on host:port; returns the grpc.aio server."""
    server = grpc.aio.server()
    servicer = AllocationServicer(node, replica_id)
    pb_grpc.add_AllocationServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server
