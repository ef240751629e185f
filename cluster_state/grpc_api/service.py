"""The ``AllocationService`` servicer (grpc.aio), a replica-side adapter over ``AllocationStore``.

Every replica serving the store runs it (``sdpaxos serve`` with a ``grpc_address``) against
its own node, embedded: a call is one update through the log or one read. Errors map to
status codes: an invalid request is ``INVALID_ARGUMENT`` (nothing changed), an outcome the
replica cannot vouch for (a failover while the update was in flight) is ``UNAVAILABLE``
(retrying an update is safe when it carries a ``Session``: the same (client id, seq) takes
effect once, at any replica), compacted watch history is ``OUT_OF_RANGE``.

In a TLS cluster (``serve_grpc(..., tls=...)``) clients present certificates of the cluster's
CA (``cluster_state.grpc_api.tls``): a call is refused ``UNAUTHENTICATED`` unless its
certificate names a client of this cluster and is not revoked, its commands carry that
principal through the log, and what the principal may not do is ``PERMISSION_DENIED``
(``cluster_state.authz``; nothing changed).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from cluster_state import ops
from cluster_state.cells import Topology
from cluster_state.client import AllocationStore, InvalidRequest
from cluster_state.config import parse_config
from cluster_state.errors import ConfigError, EventsCompacted
from cluster_state.grpc_api import cluster_state_pb2 as pb
from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc
from cluster_state.grpc_api.tls import (
    CALLER,
    Authenticator,
    authenticate_servicer,
    server_credentials,
)
from cluster_state.watch_hub import DEFAULT_MAX_PENDING, Batch, WatchHub
from consensus.auth import SCHEDULER, PermissionDenied, Principal
from consensus.errors import DefiniteFailure, SDPaxosError

if TYPE_CHECKING:
    from consensus.runtime.node import ReplicaNode
    from consensus.runtime.tls import TlsConfig

__all__ = [
    "AllocationServicer",
    "placed_to_pb",
    "serve_grpc",
    "spec_from_pb",
    "spec_to_pb",
]

_T = TypeVar("_T")
_MAX_ID = (1 << 63) - 1


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


def placed_to_pb(result: ops.Placed) -> pb.Placed:
    pods = [pb.Pod(leaves=n, node=node, devices=list(d)) for n, node, d in result.pods]
    return pb.Placed(group=result.group, chain=result.chain, pods=pods, token=result.token)


class _Pool:
    """Sessions for calls that bring none, one call at a time each.

    The replicated session table keeps an entry per client id for good, so one id per call
    would grow every replica's state (and snapshot) with every call ever made; reusing idle
    ids bounds it by the number of calls ever in flight at once.
    """

    __slots__ = ("_idle", "_node")

    def __init__(self, node: ReplicaNode) -> None:
        self._node = node
        #: by the principal the calls are made for (TLS: the caller's, ``CALLER``)
        self._idle: dict[Principal | None, list[AllocationStore]] = {}

    @contextlib.contextmanager
    def store(self) -> Iterator[AllocationStore]:
        principal = CALLER.get()
        idle = self._idle.setdefault(principal, [])
        store = idle.pop() if idle else AllocationStore.embedded(self._node, principal=principal)
        try:
            yield store
        finally:
            idle.append(store)


class AllocationServicer(pb_grpc.AllocationServiceServicer):
    def __init__(self, node: ReplicaNode, *, watch_max_pending: int = DEFAULT_MAX_PENDING
                 ) -> None:
        self._node = node
        self._pool = _Pool(node)
        # every watch stream of this replica is fed by one hook (see ``WatchHub``)
        self._hub = WatchHub(node, max_pending=watch_max_pending)

    # ------------------------------------------------------------------ updates
    async def Submit(self, request: pb.SubmitRequest, context: Any) -> pb.SubmitReply:
        spec = spec_from_pb(request.group)
        async with self._session(request.session, context) as (store, seq):
            result = await self._call(context, store.submit(spec, seq=seq))
        if isinstance(result, ops.Placed):
            return pb.SubmitReply(placed=placed_to_pb(result))
        if isinstance(result, ops.Preempting):
            return pb.SubmitReply(preempting=pb.Preempting(group=result.group,
                                                           victims=list(result.victims)))
        return pb.SubmitReply(waiting=pb.Waiting(group=result.group, reason=result.reason))

    async def Bind(self, request: pb.BindRequest, context: Any) -> pb.BindReply:
        spec = spec_from_pb(request.group)
        pods = [ops.PodPlacement(p.node, tuple(p.devices)) for p in request.pods]
        async with self._session(request.session, context) as (store, seq):
            result = await self._call(context, store.bind(spec, pods, request.revision, seq=seq))
        if isinstance(result, ops.Placed):
            return pb.BindReply(placed=placed_to_pb(result))
        return pb.BindReply(conflict=pb.Conflict(group=result.group, reason=result.reason))

    async def Release(self, request: pb.ReleaseRequest, context: Any) -> pb.ReleaseReply:
        async with self._session(request.session, context) as (store, seq):
            result = await self._call(context, store.release(request.group, seq=seq))
        return pb.ReleaseReply(promoted=list(result.promoted))

    async def SetNodeHealth(
        self, request: pb.NodeHealthRequest, context: Any
    ) -> pb.NodeHealthReply:
        async with self._session(request.session, context) as (store, seq):
            result = await self._call(
                context, store.set_node_health(request.node, request.healthy, seq=seq)
            )
        return pb.NodeHealthReply(changed=result.changed, cancelled=list(result.cancelled),
                                  warning=result.warning)

    async def Reconfigure(
        self, request: pb.ReconfigureRequest, context: Any
    ) -> pb.ReconfigureReply:
        # Validated before anything is proposed: an invalid file never reaches the log.
        try:
            topology = Topology(parse_config(request.config_yaml))
        except ConfigError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("context.abort returned") from None  # it raises
        if request.dry_run:
            with self._pool.store() as store:
                plan = await self._call(context, store.plan_reconfiguration(request.config_yaml))
            changed = bool(plan.pop("changed"))
            return pb.ReconfigureReply(digest=topology.digest.hex(), changed=changed,
                                       report_json=json.dumps(plan))
        async with self._session(request.session, context) as (store, seq):
            result = await self._call(context, store.reconfigure(request.config_yaml, seq=seq))
        return pb.ReconfigureReply(digest=result.digest, changed=result.changed,
                                   report_json=json.dumps(result.report))

    @contextlib.asynccontextmanager
    async def _session(
        self, session: pb.Session, context: Any
    ) -> AsyncIterator[tuple[AllocationStore, int | None]]:
        if not session.client_id:
            with self._pool.store() as store:
                yield store, None
            return
        if session.client_id > _MAX_ID or session.seq > _MAX_ID:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"session client_id and seq must be below 2^63, got ({session.client_id}, "
                f"{session.seq})",
            )
        yield AllocationStore.embedded(self._node, client_id=session.client_id,
                                       principal=CALLER.get()), session.seq

    # ------------------------------------------------------------------ queries
    async def GetGroup(self, request: pb.QueryRequest, context: Any) -> pb.JsonReply:
        with self._pool.store() as store:
            info = await self._call(context, store.status(request.name, stale=request.stale))
        if info is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no group {request.name!r}")
        return pb.JsonReply(json=json.dumps(info))

    async def GetVC(self, request: pb.QueryRequest, context: Any) -> pb.JsonReply:
        with self._pool.store() as store:
            info = await self._call(context, store.vc(request.name, stale=request.stale))
        return pb.JsonReply(json=json.dumps(info))

    async def GetSummary(self, request: pb.QueryRequest, context: Any) -> pb.JsonReply:
        with self._pool.store() as store:
            info = await self._call(context, store.summary(stale=request.stale))
        return pb.JsonReply(json=json.dumps(info))

    async def ListAllocations(self, request: pb.QueryRequest, context: Any) -> pb.JsonReply:
        with self._pool.store() as store:
            info = await self._call(
                context, store.allocations(request.name, stale=request.stale)
            )
        return pb.JsonReply(json=json.dumps(info))

    async def Inspect(self, request: pb.InspectRequest, context: Any) -> pb.JsonReply:
        if request.kind not in ops.INSPECT_KINDS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"kind must be one of {', '.join(ops.INSPECT_KINDS)}")
        with self._pool.store() as store:
            info = await self._call(
                context, store.inspect(request.kind, request.name, stale=request.stale)
            )
        if info is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no group {request.name!r}")
        return pb.JsonReply(json=json.dumps(info))

    # ------------------------------------------------------------------ watch
    async def Watch(self, request: pb.WatchRequest, context: Any) -> AsyncIterator[pb.Event]:
        # Fed by this replica's watch hub: the stream is the replica's event log, which is
        # the same on every replica, so a client resumes anywhere from its last revision.
        try:
            async for batches in self._hub.watch(request.since):
                for batch in batches:
                    for event in _batch_pb(batch).events:
                        yield event
        except EventsCompacted as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))

    async def WatchPushed(
        self, request: pb.WatchRequest, context: Any
    ) -> AsyncIterator[pb.EventBatch]:
        # One message per batch: a batch is encoded once for all the watchers it reaches
        # (merging the batches a slow reader has queued would copy them for it alone).
        try:
            async for batches in self._hub.watch(request.since):
                for batch in batches:
                    yield _batch_pb(batch)
        except EventsCompacted as exc:
            yield pb.EventBatch(compacted=True, revision=exc.revision, oldest=exc.oldest)

    # ------------------------------------------------------------------ errors
    async def _call(self, context: Any, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.reason)
        except PermissionDenied as exc:  # a TLS cluster's principal may not: nothing changed
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except DefiniteFailure as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except SDPaxosError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        raise AssertionError("context.abort returned")  # it raises


def _batch_pb(batch: Batch) -> pb.EventBatch:
    if batch.encoded is None:
        batch.encoded = pb.EventBatch(events=[
            pb.Event(revision=e.revision, kind=e.kind, subject=e.subject,
                     data_json=json.dumps(list(e.data)))
            for e in batch.events
        ])
    encoded: pb.EventBatch = batch.encoded  # type: ignore[assignment]
    return encoded


async def serve_grpc(
    node: ReplicaNode, host: str, port: int, *, tls: TlsConfig | None = None, me: int = 0
) -> grpc.aio.Server:
    """Start the service for ``node`` on host:port; returns the grpc.aio server (the caller
    stops it). ``tls``: the cluster's (``me``: this replica's id), client certificates
    required and every call authenticated."""
    server = grpc.aio.server()
    servicer = AllocationServicer(node)
    if tls is not None:
        authenticate_servicer(servicer, Authenticator(node.config.cluster_id, node.revocations),
                              _visibility(node))
    pb_grpc.add_AllocationServiceServicer_to_server(  # type: ignore[no-untyped-call]
        servicer, server
    )
    bound = (server.add_insecure_port(f"{host}:{port}") if tls is None
             else server.add_secure_port(f"{host}:{port}", server_credentials(tls, me)))
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port} for gRPC")
    await server.start()
    return server


def _visibility(node: ReplicaNode) -> Callable[[Principal, str, str], bool]:
    """Which events a principal's watch streams show: the store's rules, or none of a
    scheduler's without them (fail closed)."""
    from cluster_state.authz import AuthorizedStore

    store = node.state_machine
    if isinstance(store, AuthorizedStore):
        return store.visible_kind
    return lambda principal, kind, subject: principal.role != SCHEDULER
