"""gRPC over a TLS cluster's certificates (``consensus.runtime.tls``): the service's server
credentials (a client certificate of the cluster's CA required), channel credentials for
clients, and the principal of a call.

The servicer authenticates each call (``Authenticator.principal``): the peer's certificate
must name a client of this cluster and not be revoked (the replica's ``Revocations``, which a
SIGHUP reloads: a revoked certificate's next call is refused, its connection may stay up).
What it names is the principal the call's commands carry through the log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import grpc

from consensus.auth import Principal
from consensus.errors import ConfigError
from consensus.runtime.tls import REPLICA_DNS_NAME, Revocations, TlsConfig, TlsFiles
from consensus.runtime.tls import identity_of_pem as _identity_of_pem

__all__ = [
    "CHANNEL_OPTIONS",
    "Authenticator",
    "Unauthenticated",
    "channel_credentials",
    "server_credentials",
]

#: every replica certificate carries ``REPLICA_DNS_NAME``: a client checks the server's name
#: against it, whatever address it dialed
CHANNEL_OPTIONS: Final = (("grpc.ssl_target_name_override", REPLICA_DNS_NAME),)
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
    """The principal of a gRPC call to a TLS cluster's replica."""

    def __init__(self, cluster_id: str, revocations: Revocations) -> None:
        self.cluster_id = cluster_id
        self.revocations = revocations
        self._known: dict[bytes, tuple[int, Principal]] = {}

    def principal(self, context: Any) -> Principal:
        """Who made the call (``Unauthenticated`` saying why not)."""
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
            raise Unauthenticated(f"the certificate of {principal.describe()} (serial "
                                  f"{serial:x}) is revoked")
        return principal
