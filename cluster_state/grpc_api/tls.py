"""gRPC over a TLS cluster's certificates (``consensus.runtime.tls``): the service's server
credentials (a client certificate of the cluster's CA required), channel credentials for
clients, and the principal of a call.

The servicer authenticates each call (``authenticate_servicer`` wraps every RPC method): the
peer's certificate must name a client of this cluster and not be revoked (the replica's
``Revocations``, which a SIGHUP reloads). What it names is the principal the call's commands
carry through the log (``CALLER`` holds it for the call's task), and a scheduler's watch
streams are trimmed to the events it may see.

**Revocation.** A revoked certificate's calls are refused with UNAUTHENTICATED before any
handler runs, and a reload that revokes it ends every call of it still open at once (a watch
stream, an update waiting for the log: ``Authenticator`` keeps them by serial) with
UNAUTHENTICATED. Its TLS handshake itself still completes: grpcio offers neither a CRL nor a
verification callback on the server side, and its HTTP/2 connection is not closed (grpc.aio
has no handle on it), but nothing of the replica answers on it any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Final

import grpc

from cluster_state.grpc_api import cluster_state_pb2 as pb
from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc
from consensus.auth import SCHEDULER, Principal
from consensus.errors import ConfigError
from consensus.runtime.tls import REPLICA_DNS_NAME, Revocations, TlsConfig, TlsFiles
from consensus.runtime.tls import identity_of_pem as _identity_of_pem

__all__ = [
    "CALLER",
    "CHANNEL_OPTIONS",
    "Authenticator",
    "Unauthenticated",
    "authenticate_servicer",
    "channel_credentials",
    "server_credentials",
]

#: every replica certificate carries ``REPLICA_DNS_NAME``: a client checks the server's name
#: against it, whatever address it dialed
CHANNEL_OPTIONS: Final = (("grpc.ssl_target_name_override", REPLICA_DNS_NAME),)
#: the principal of the call a task serves (None: not a TLS cluster)
CALLER: ContextVar[Principal | None] = ContextVar("sdpaxos_grpc_caller", default=None)
#: certificates parsed lately, by their PEM bytes (a call costs a lookup, not a parse)
_CACHE_SIZE: Final = 1024


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None


def server_credentials(tls: TlsConfig, me: int) -> grpc.ServerCredentials:
    """Replica ``me``'s credentials: its certificate, and client certificates of the CA
    required."""
    files = tls.replicas[me]
    return grpc.ssl_server_credentials(
        [(_read(files.key), _read(files.cert))], root_certificates=_read(tls.ca),
        require_client_auth=True,
    )


def channel_credentials(ca: Path, files: TlsFiles | None) -> grpc.ChannelCredentials:
    """A client's credentials: the cluster's CA, and the certificate it presents."""
    if files is None:
        return grpc.ssl_channel_credentials(root_certificates=_read(ca))
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca), private_key=_read(files.key),
        certificate_chain=_read(files.cert),
    )


class Unauthenticated(Exception):
    """The call's peer is no (longer a) client of this cluster; says why."""


class Authenticator:
    """The principal of a gRPC call to a TLS cluster's replica, and the calls open for each
    certificate (ended when it is revoked)."""

    def __init__(self, cluster_id: str, revocations: Revocations) -> None:
        self.cluster_id = cluster_id
        self.revocations = revocations
        self._known: dict[bytes, tuple[int, Principal]] = {}
        #: serial -> the tasks of its calls under way
        self._open: dict[int, set[asyncio.Task[Any]]] = {}
        #: the tasks cancelled because their certificate was revoked
        self._ended: set[asyncio.Task[Any]] = set()
        revocations.subscribe(self._revoked)

    def principal(self, context: Any) -> Principal:
        """Who made the call (``Unauthenticated`` saying why not)."""
        return self.identify(context)[1]

    def identify(self, context: Any) -> tuple[int, Principal]:
        """The serial of the call's certificate and who it names (``Unauthenticated``
        saying why not)."""
        pems = context.auth_context().get("x509_pem_cert")
        if not pems:
            raise Unauthenticated("a client certificate of this cluster is required")
        pem: bytes = pems[0]
        known = self._known.get(pem)
        if known is None:
            try:
                identity = _identity_of_pem(pem, self.cluster_id)
            except ConfigError as exc:
                raise Unauthenticated(str(exc)) from None
            if identity.principal is None:
                raise Unauthenticated(f"{identity.describe()} is no client")
            if len(self._known) >= _CACHE_SIZE:
                self._known.clear()
            known = self._known[pem] = (identity.serial, identity.principal)
        serial, principal = known
        if self.revocations.is_revoked(serial):
            raise Unauthenticated(_revoked(principal, serial))
        return serial, principal

    @contextlib.contextmanager
    def open_call(self, serial: int) -> Iterator[Callable[[], bool]]:
        """The call the current task serves, kept open under ``serial`` for its duration;
        yields whether it was ended by that certificate's revocation."""
        task = asyncio.current_task()
        assert task is not None
        self._open.setdefault(serial, set()).add(task)
        try:
            yield lambda: task in self._ended
        finally:
            self._ended.discard(task)
            tasks = self._open.get(serial)
            if tasks is not None:
                tasks.discard(task)
                if not tasks:
                    del self._open[serial]

    def _revoked(self, serials: frozenset[int]) -> None:
        """A reload revoked ``serials``: end the calls they have open."""
        for serial in serials:
            for task in self._open.get(serial, ()):
                self._ended.add(task)
                task.cancel()


#: whether a principal may see an event of this kind about this subject
Visibility = Callable[[Principal, str, str], bool]


def authenticate_servicer(servicer: Any, authenticator: Authenticator,
                          visible: Visibility) -> None:
    """Make every RPC method of ``servicer`` (before it is added to a server) authenticate
    its call first, set ``CALLER`` for it, and trim what a scheduler's streams yield to the
    events ``visible`` lets it see."""
    for name in vars(pb_grpc.AllocationServiceServicer):
        if not name.startswith("_"):
            setattr(servicer, name, _authenticated(getattr(servicer, name), authenticator,
                                                   visible))


def _revoked(principal: Principal, serial: int) -> str:
    return f"the certificate of {principal.describe()} (serial {serial:x}) is revoked"


async def _identify(authenticator: Authenticator, context: Any) -> tuple[int, Principal]:
    try:
        return authenticator.identify(context)
    except Unauthenticated as exc:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        raise AssertionError("context.abort returned") from None  # it raises


async def _end_revoked(context: Any, principal: Principal, serial: int) -> None:
    """End a call whose certificate was revoked while it was open (its task was cancelled
    for it: the cancellation is taken back, and the call answered UNAUTHENTICATED)."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _revoked(principal, serial))
    raise AssertionError("context.abort returned")  # it raises


def _authenticated(method: Any, authenticator: Authenticator, visible: Visibility) -> Any:
    if inspect.isasyncgenfunction(method):
        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            serial, principal = await _identify(authenticator, context)
            CALLER.set(principal)
            with authenticator.open_call(serial) as ended:
                try:
                    async for item in method(request, context):
                        kept = _trimmed(item, principal, visible)
                        if kept is not None:
                            yield kept
                except asyncio.CancelledError:
                    if not ended():
                        raise
                    await _end_revoked(context, principal, serial)

        return stream

    async def unary(request: Any, context: Any) -> Any:
        serial, principal = await _identify(authenticator, context)
        CALLER.set(principal)
        with authenticator.open_call(serial) as ended:
            try:
                call: Awaitable[Any] = method(request, context)
                return await call
            except asyncio.CancelledError:
                if not ended():
                    raise
                await _end_revoked(context, principal, serial)

    return unary


def _trimmed(item: Any, principal: Principal, visible: Visibility) -> Any:
    """A streamed ``Event`` or ``EventBatch`` as ``principal`` may see it (None: nothing)."""
    if principal.role != SCHEDULER:
        return item
    if isinstance(item, bytes):  # a watch stream's batches, serialized once for every watcher
        item = pb.EventBatch.FromString(item)
    if isinstance(item, pb.Event):
        return item if visible(principal, item.kind, item.subject) else None
    if isinstance(item, pb.EventBatch):
        kept = [e for e in item.events if visible(principal, e.kind, e.subject)]
        if item.compacted or len(kept) == len(item.events):
            return item
        if not kept and not item.through:
            return None
        # What it covers and how much was left out stay: an acknowledging client (WatchAcked)
        # counts them, or the replica would wait for acks of events it never sent it.
        return pb.EventBatch(events=kept, through=item.through,
                             skipped=item.skipped + len(item.events) - len(kept))
    return item
