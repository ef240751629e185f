"""The ``AllocationService`` servicer (grpc.aio), a replica-side adapter over ``AllocationStore``.

Every replica serving the store runs it (``sdpaxos serve`` with a ``grpc_address``) against
its own node, embedded: a call is one update through the log or one read. Errors map to
status codes: an invalid request is ``INVALID_ARGUMENT`` (nothing changed), a request naming a
group or VC the store does not hold is ``NOT_FOUND`` (nothing changed), an outcome the
replica cannot vouch for (a failover while the update was in flight) is ``UNAVAILABLE``
(retrying an update is safe when it carries a ``Session``: the same (client id, seq) takes
effect once, at any replica), compacted watch history is ``OUT_OF_RANGE``.

Query answers are typed messages (``convert``) with the revision they were read at; the
deprecated JSON copy (field 1, where older builds answered ``JsonReply``) is filled only for
requests that do not set ``typed``. Next to the service, ``serve_grpc`` runs the standard
health service (``grpc.health.v1``: SERVING while the replica is ready, NOT_SERVING while not,
as its ``/readyz`` says: ``ReadinessHealth``) and server reflection.

Watch streams come from the replica's ``WatchHub``. ``WatchAcked`` sends while fewer than
``ACK_WINDOW / 2`` events are unacknowledged: a client that stops reading stops the sending,
so what the transport holds for it is bounded whatever its HTTP/2 window, and its queue at the
hub overflows into ``EventsCompacted``, the stream's last message. Every replica serves them,
from a revision or from now (``WatchRequest.from_now``: a linearizable read of the store's
revision first, sent as the stream's first message, so a lagging replica does not start a
watch before what the cluster acknowledged). A client process shares one stream per replica
among all its watchers (``cluster_state.pushed_watch``), so a message is per process, not per
watcher.

In a TLS cluster (``serve_grpc(..., tls=...)``) clients present certificates of the cluster's
CA (``cluster_state.grpc_api.tls``): a call is refused ``UNAUTHENTICATED`` unless its
certificate names a client of this cluster and is not revoked, its commands carry that
principal through the log, and what the principal may not do is ``PERMISSION_DENIED``
(``cluster_state.authz``; nothing changed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cluster_state import ops
from cluster_state.cells import Topology
from cluster_state.client import AllocationStore, InvalidRequest
from cluster_state.config import parse_config
from cluster_state.errors import EventsCompacted, GpuConfigError, NotFound
from cluster_state.grpc_api import cluster_state_pb2 as pb
from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc
from cluster_state.grpc_api import convert
from cluster_state.grpc_api.tls import (
    CALLER,
    Authenticator,
    authenticate_servicer,
    server_credentials,
)
from cluster_state.watch_hub import ACK_WINDOW, DEFAULT_MAX_PENDING, Batch, WatchHub
from consensus.auth import SCHEDULER, PermissionDenied, Principal
from consensus.errors import DefiniteFailure, SDPaxosError

if TYPE_CHECKING:
    from consensus.runtime.node import ReplicaNode
    from consensus.runtime.tls import TlsConfig

__all__ = [
    "SERVICE_NAME",
    "AllocationServicer",
    "ReadinessHealth",
    "placed_to_pb",
    "serve_grpc",
    "spec_from_pb",
    "spec_to_pb",
]

_T = TypeVar("_T")
_MAX_ID = (1 << 63) - 1
#: how long a WatchAcked stream cut with EventsCompacted waits for its client to end it
COMPACTED_LINGER_S = 30.0
#: the service's full name (health checks and reflection name it)
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["AllocationService"].full_name


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
    return pb.Placed(group=result.group, chain=result.chain,
                     pods=convert.pods_to_pb(result.pods), token=result.token)


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
        suggested = list(request.suggested.nodes) if request.HasField("suggested") else None
        async with self._session(request.session, context) as (store, seq):
            result = await self._call(context, store.submit(spec, seq=seq, suggested=suggested))
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
        return pb.ReleaseReply(promoted=list(result.promoted),
                               already_released=result.already_released)

    async def Claim(self, request: pb.ClaimRequest, context: Any) -> pb.ClaimReply:
        async with self._session(request.session, context) as (store, seq):
            result = await self._call(context, store.claim(
                request.group, request.incarnation, request.slot, request.uid, request.pod,
                request.previous, seq=seq))
        if isinstance(result, ops.Claimed):
            return pb.ClaimReply(claimed=pb.Claimed(
                group=result.group, incarnation=result.incarnation, slot=result.slot,
                uid=result.uid))
        return pb.ClaimReply(conflict=pb.Conflict(group=result.group, reason=result.reason))

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
        except GpuConfigError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("context.abort returned") from None  # it raises
        if request.dry_run:
            with self._pool.store() as store:
                plan = await self._call(context, store.plan_reconfiguration(request.config_yaml))
            changed = bool(plan.pop("changed"))
            return convert.reconfigure_reply(topology.digest.hex(), changed, plan,
                                             request.typed)
        async with self._session(request.session, context) as (store, seq):
            result = await self._call(context, store.reconfigure(request.config_yaml, seq=seq))
        return convert.reconfigure_reply(result.digest, result.changed, result.report,
                                         request.typed)

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
    async def _read(self, context: Any, op: bytes, stale: bool) -> tuple[int, Any]:
        with self._pool.store() as store:
            return await self._call(context, store.read_at(op, stale=stale))

    async def GetGroup(self, request: pb.QueryRequest, context: Any) -> pb.GroupReply:
        revision, info = await self._read(context, ops.get_group(request.name), request.stale)
        if info is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no group {request.name!r}")
        return pb.GroupReply(json=_legacy(request.typed, info), revision=revision,
                             group=convert.group_to_pb(info))

    async def GetVC(self, request: pb.QueryRequest, context: Any) -> pb.VcReply:
        revision, info = await self._read(context, ops.get_vc(request.name), request.stale)
        return pb.VcReply(json=_legacy(request.typed, info), revision=revision,
                          vc=convert.vc_to_pb(info))

    async def GetSummary(self, request: pb.QueryRequest, context: Any) -> pb.SummaryReply:
        revision, info = await self._read(context, ops.get_summary(), request.stale)
        return pb.SummaryReply(json=_legacy(request.typed, info), revision=revision,
                               summary=convert.summary_to_pb(info))

    async def ListAllocations(
        self, request: pb.QueryRequest, context: Any
    ) -> pb.AllocationsReply:
        revision, groups = await self._read(context, ops.list_groups(request.name),
                                            request.stale)
        return pb.AllocationsReply(json=_legacy(request.typed, groups), revision=revision,
                                   groups=[convert.allocation_to_pb(g) for g in groups])

    async def Inspect(self, request: pb.InspectRequest, context: Any) -> pb.InspectReply:
        if request.kind not in ops.INSPECT_KINDS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"kind must be one of {', '.join(ops.INSPECT_KINDS)}")
        revision, info = await self._read(context, ops.inspect(request.kind, request.name),
                                          request.stale)
        if info is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no group {request.name!r}")
        reply = pb.InspectReply(json=_legacy(request.typed, info), revision=revision)
        if request.kind == "physical":
            reply.physical.CopyFrom(convert.physical_trees_to_pb(info))
        elif request.kind == "vc":
            reply.vc.CopyFrom(convert.vc_tree_to_pb(info))
        else:
            reply.group.CopyFrom(convert.group_tree_to_pb(info))
        return reply

    # ------------------------------------------------------------------ watch
    async def Watch(self, request: pb.WatchRequest, context: Any) -> AsyncIterator[pb.Event]:
        # Fed by this replica's watch hub: the stream is the replica's event log, which is
        # the same on every replica, so a client resumes anywhere from its last revision.
        # One event per message, for older clients: data_json always (they know no other).
        try:
            async for batches in self._hub.watch(request.since):
                for batch in batches:
                    for event in batch.events:
                        yield convert.event_to_pb(event, with_json=True)
        except EventsCompacted as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))

    async def WatchPushed(
        self, request: pb.WatchRequest, context: Any
    ) -> AsyncIterator[pb.EventBatch | bytes]:
        # Everything queued for this watcher in one message: each batch is encoded once for
        # all the watchers it reaches, and serialized EventBatch messages concatenated are
        # their merge (events appended, the last `through` wins), so a watcher that fell
        # behind costs one write, not one per batch.
        since = request.since
        if request.from_now:
            since = await self._now(context)
            yield pb.EventBatch(through=since)
        try:
            async for batches in self._hub.watch(since):
                yield _encoded(batches, request.typed)
        except EventsCompacted as exc:
            yield pb.EventBatch(compacted=True, revision=exc.revision, oldest=exc.oldest)

    async def WatchAcked(
        self, requests: AsyncIterator[pb.WatchControl], context: Any
    ) -> AsyncIterator[pb.EventBatch | bytes]:
        first = await anext(aiter(requests), None)
        if first is None or first.WhichOneof("control") != "start":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "WatchAcked starts with a WatchControl holding `start`")
            raise AssertionError("context.abort returned")  # it raises
        start = first.start
        since = start.since
        if start.from_now:
            since = await self._now(context)
            yield pb.EventBatch(through=since)  # no events: nothing to acknowledge
        flow = _AckedFlow()
        acks = asyncio.ensure_future(flow.read_acks(requests))
        dropped = asyncio.Event()
        batches_in = self._hub.watch(since, dropped=dropped)
        try:
            while True:
                # Take more from the hub only while the client keeps up: otherwise its
                # queue there grows until the hub drops it (``dropped``), and that is the end.
                if not await flow.wait_room(dropped):
                    await anext(batches_in)  # raises the hub's EventsCompacted
                batches = await anext(batches_in)
                for batch in batches:
                    flow.sent(batch)
                yield _encoded(batches, start.typed)  # one message (see WatchPushed)
        except EventsCompacted as exc:
            yield pb.EventBatch(compacted=True, revision=exc.revision, oldest=exc.oldest)
            # Not ended from here at once: a client still acknowledging what it reads would
            # write into a finished call, which fails the call (INTERNAL) with the unread
            # messages, the compacted one included. It ends it (it cancels once it read the
            # compacted message); one that never does is let go after a while.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(acks), COMPACTED_LINGER_S)
        finally:
            acks.cancel()
            await batches_in.aclose()

    async def _now(self, context: Any) -> int:
        """Where a watch from now starts: the store's revision, read linearizably (this
        replica has applied through it when the read answers, so it starts no earlier than
        anything the cluster acknowledged before the call; one cut off from the sequencer
        fails the call UNAVAILABLE and its client tries the next replica)."""
        with self._pool.store() as store:
            return await self._call(context, store.revision())

    # ------------------------------------------------------------------ errors
    # ------------------------------------------------------------------ members
    async def ListMembers(self, request: pb.ListMembersRequest,
                          context: Any) -> pb.ListMembersReply:
        """The current members and every address of each, as this replica's log has them
        (``consensus.runtime.members``): what clients sync their targets from."""
        from consensus.runtime.members import address_text
        from consensus.runtime.status import current_members

        node = self._node
        epoch, members = current_members(node)

        def text(address: tuple[str, int] | None) -> str:
            return "" if address is None else address_text(address)

        return pb.ListMembersReply(
            epoch=epoch, replica=node.me, applied=node.executed_slot,
            members=[pb.ClusterMember(
                id=m.id, incarnation=m.incarnation, voter=m.voter, published=m.published,
                site=m.info.site if m.info else "",
                peer_address=text(m.info.address if m.info else None),
                client_address=text(m.info.client_address if m.info else None),
                grpc_address=text(m.info.grpc_address if m.info else None),
                metrics_address=text(m.info.metrics_address if m.info else None),
            ) for m in members])

    async def _call(self, context: Any, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except NotFound as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, exc.reason)
        except InvalidRequest as exc:
            # a new cluster's log holds no configuration for a moment: again later, as a new
            # request (another session), it runs
            code = (grpc.StatusCode.UNAVAILABLE if exc.reason == ops.NOT_CONFIGURED
                    else grpc.StatusCode.INVALID_ARGUMENT)
            await context.abort(code, exc.reason)
        except PermissionDenied as exc:  # a TLS cluster's principal may not: nothing changed
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except DefiniteFailure as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except SDPaxosError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        raise AssertionError("context.abort returned")  # it raises


class _AckedFlow:
    """What a ``WatchAcked`` stream sent and what its client acknowledged."""

    __slots__ = ("_acked", "_progress", "_sent", "_unacked")

    def __init__(self) -> None:
        self._sent: deque[tuple[int, int]] = deque()  # (through revision, events) per message
        self._unacked = 0  # events sent and not acknowledged
        self._acked = -1
        self._progress = asyncio.Event()

    def sent(self, batch: Batch) -> None:
        self._sent.append((batch.last, len(batch.events)))
        self._unacked += len(batch.events)

    async def read_acks(self, requests: AsyncIterator[pb.WatchControl]) -> None:
        # A control message that is not a newer ack is ignored: a peer's bytes never end the
        # stream. Neither does the request side failing (the client went away): the
        # stream's own writes find that out.
        with contextlib.suppress(grpc.RpcError, grpc.aio.AioRpcError, grpc.aio.UsageError):
            async for control in requests:
                if control.WhichOneof("control") != "ack" or control.ack <= self._acked:
                    continue
                self._acked = control.ack
                while self._sent and self._sent[0][0] <= control.ack:
                    self._unacked -= self._sent.popleft()[1]
                self._progress.set()

    async def wait_room(self, dropped: asyncio.Event) -> bool:
        """Until fewer than half the window is unacknowledged (True) or the hub dropped the
        watcher meanwhile (False)."""
        while self._unacked >= ACK_WINDOW // 2:
            if dropped.is_set():
                return False
            self._progress.clear()
            progress = asyncio.ensure_future(self._progress.wait())
            drop = asyncio.ensure_future(dropped.wait())
            try:
                await asyncio.wait((progress, drop), return_when=asyncio.FIRST_COMPLETED)
            finally:
                progress.cancel()
                drop.cancel()
        return True


def _legacy(typed: bool, info: Any) -> str:
    """The deprecated JSON copy of a query answer: for requests that predate ``typed``."""
    return "" if typed else json.dumps(info)


#: the keys of a batch's two cached encodings (``Batch.encoded``)
_TYPED, _WITH_JSON = "typed", "with_json"


def _encoded(batches: list[Batch], typed: bool) -> bytes:
    """``batches`` as one serialized ``EventBatch`` (``_serialized`` passes it through)."""
    key = _TYPED if typed else _WITH_JSON
    parts = []
    for batch in batches:
        encoded = batch.encoded.get(key)
        if encoded is None:
            encoded = batch.encoded[key] = pb.EventBatch(
                events=[convert.event_to_pb(e, with_json=not typed) for e in batch.events],
                through=batch.last,
            ).SerializeToString()
        assert isinstance(encoded, bytes)
        parts.append(encoded)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _serialized(reply: bytes | Any) -> bytes:
    """A stream's reply on the wire: bytes already serialized (a cached batch) as they are."""
    if isinstance(reply, bytes):
        return reply
    data: bytes = reply.SerializeToString()
    return data


class _Undecodable:
    """A request whose bytes are no message of its type (say, invalid UTF-8 in a string
    field): its handler answers ``INVALID_ARGUMENT`` naming why (grpc's own answer to a
    deserializer that raises is ``UNKNOWN``, "Unexpected DecodeError")."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _lenient(message: Any) -> Callable[[bytes], Any]:
    """``message.FromString``, giving an ``_Undecodable`` for bytes it refuses."""
    name = message.DESCRIPTOR.full_name

    def deserialize(data: bytes) -> Any:
        try:
            return message.FromString(data)
        except DecodeError as exc:
            return _Undecodable(f"the request is not a valid {name}: {exc}")

    return deserialize


async def _refuse_undecodable(request: Any, context: Any) -> None:
    if isinstance(request, _Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)


def _checked(handler: Any, client_streaming: bool, server_streaming: bool) -> Any:
    """``handler`` refusing undecodable requests (``_Undecodable``) first."""
    if client_streaming:
        async def requests(incoming: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            async for request in incoming:
                await _refuse_undecodable(request, context)
                yield request

        if server_streaming:
            async def stream_stream(incoming: AsyncIterator[Any], context: Any
                                    ) -> AsyncIterator[Any]:
                async for reply in handler(requests(incoming, context), context):
                    yield reply

            return stream_stream

        async def stream_unary(incoming: AsyncIterator[Any], context: Any) -> Any:
            return await handler(requests(incoming, context), context)

        return stream_unary
    if server_streaming:
        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await _refuse_undecodable(request, context)
            async for reply in handler(request, context):
                yield reply

        return unary_stream

    async def unary_unary(request: Any, context: Any) -> Any:
        await _refuse_undecodable(request, context)
        return await handler(request, context)

    return unary_unary


def _add_service(servicer: AllocationServicer, server: grpc.aio.Server) -> None:
    """``add_AllocationServiceServicer_to_server``, but the watch streams' replies may be
    serialized bytes (a batch is serialized once for all its watchers, not once each), and
    a request that does not decode is answered ``INVALID_ARGUMENT`` (``_Undecodable``)."""
    service = pb.DESCRIPTOR.services_by_name["AllocationService"]
    kinds = {(False, False): grpc.unary_unary_rpc_method_handler,
             (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler,
             (True, True): grpc.stream_stream_rpc_method_handler}
    handlers = {}
    for method in service.methods:
        request = getattr(pb, method.input_type.name)
        reply = getattr(pb, method.output_type.name)
        streams = (method.client_streaming, method.server_streaming)
        handlers[method.name] = kinds[streams](
            _checked(getattr(servicer, method.name), *streams),
            request_deserializer=_lenient(request),
            response_serializer=_serialized if reply is pb.EventBatch else reply.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


async def serve_grpc(
    node: ReplicaNode, host: str, port: int, *, tls: TlsConfig | None = None, me: int = 0,
    watch_max_pending: int = DEFAULT_MAX_PENDING,
) -> grpc.aio.Server:
    """Start the service for ``node`` on host:port; returns the grpc.aio server (the caller
    stops it). ``tls``: the cluster's (``me``: this replica's id), client certificates
    required and every call authenticated. ``watch_max_pending``: the events a watch stream
    may have queued at the replica before it is dropped (``WatchHub``)."""
    server = grpc.aio.server()
    servicer = AllocationServicer(node, watch_max_pending=watch_max_pending)
    if tls is not None:
        authenticate_servicer(servicer, Authenticator(node.config.cluster_id, node.revocations),
                              _visibility(node))
    _add_service(servicer, server)
    # The standard health service: "" (the server) and the allocation service are SERVING
    # while the replica is ready, NOT_SERVING while it is not, as /readyz says.
    checks = ReadinessHealth(node)
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    await checks.refresh()
    checks.follow()
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME), server)
    bound = (server.add_insecure_port(f"{host}:{port}") if tls is None
             else server.add_secure_port(f"{host}:{port}", server_credentials(tls, me)))
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port} for gRPC")
    await server.start()
    return server


#: how often the health service judges the replica's readiness again for its watchers (its
#: Check judges it at every call)
HEALTH_REFRESH_S = 0.25


class ReadinessHealth(health.aio.HealthServicer):  # type: ignore[misc]  # (untyped upstream)
    """``grpc.health.v1`` following the replica's readiness (``consensus.runtime.health``,
    what ``/readyz`` answers): SERVING for "" and the allocation service while it is ready,
    NOT_SERVING while not (no view, no majority heard, far behind, stopping). ``Check``
    judges it at each call; ``Watch`` streams follow ``refresh``, run every
    ``HEALTH_REFRESH_S`` while the node serves (``follow``)."""

    def __init__(self, node: ReplicaNode) -> None:
        super().__init__()
        self._node = node

    async def refresh(self) -> None:
        from consensus.runtime.health import readiness

        ready = readiness(self._node).ready
        status = (health_pb2.HealthCheckResponse.SERVING if ready
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", SERVICE_NAME):
            if self._server_status.get(name) != status:
                await self.set(name, status)

    async def Check(self, request: Any, context: Any) -> Any:
        await self.refresh()
        return await super().Check(request, context)

    def follow(self) -> None:
        """Refresh every ``HEALTH_REFRESH_S`` until the node stops (its ``stop`` ends it)."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(HEALTH_REFRESH_S)
                await self.refresh()

        self._node.run_beside(loop(), "grpc-health")


def _visibility(node: ReplicaNode) -> Callable[[Principal, str, str], bool]:
    """Which events a principal's watch streams show: the store's rules, or none of a
    scheduler's without them (fail closed)."""
    from cluster_state.authz import AuthorizedStore

    store = node.state_machine
    if isinstance(store, AuthorizedStore):
        return store.visible_kind
    return lambda principal, kind, subject: principal.role != SCHEDULER
