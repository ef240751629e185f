"""TLS 1.3 for a cluster: its certificates, contexts, identities and revocation list.

A cluster file with a ``[tls]`` table (``cluster_config``) runs every link over mutual TLS 1.3:
the peer mesh (``transport``), the native client port (``node``), gRPC (the state machine's
service) and, with ``metrics = true``, the metrics endpoint. Every certificate is signed by the
cluster's own CA and names what it is in a URI subject alternative name:

* a replica: ``sdpaxos://<cluster>/replica/<id>`` (and DNS ``REPLICA_DNS_NAME`` plus its
  host, so gRPC clients can check the server's name). A peer whose handshake claims id i must
  present replica i's certificate; a dialer checks that the replica it dialed presents its own;
* a client: ``sdpaxos://<cluster>/client/<name>?role=<role>&vcs=<vc1>,<vc2>`` (``consensus.auth``
  roles). What the certificate says is the principal the serving replica puts on the client's
  commands.

``sdpaxos cluster init --tls`` makes the CA, one certificate per replica and an admin client
certificate (ECDSA P-256, private keys mode 0600); ``sdpaxos cert issue`` issues more client
certificates with the CA's key. Revocation: ``[tls] revoked`` lists serial numbers (hex); a
replica reads it again on SIGHUP (``Revocations.reload``), closes the connections of revoked
certificates and refuses them from then on.

Private keys are read from files into the ``ssl`` contexts and written to files only: nothing
here formats a key (or a certificate) into a message, and errors name files, never contents.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import socket
import ssl
import tomllib
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, quote, unquote, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from consensus.auth import SCHEDULER, Principal, principal_problem
from consensus.errors import ConfigError
from consensus.runtime.conn_limits import HandshakeGuard, Handshaking
from consensus.runtime.logs import RateLimited

__all__ = [
    "REPLICA_DNS_NAME",
    "Identity",
    "Issued",
    "Revocations",
    "TlsConfig",
    "TlsFiles",
    "accept_tls",
    "client_context",
    "identity_of",
    "issue_client",
    "issue_replica",
    "load_ca",
    "make_ca",
    "server_context",
    "start_server",
    "write_private",
]

log = logging.getLogger("sdpaxos.tls")
#: refusals: one line per kind and port per interval, with the count since
_refusals = RateLimited(log)

URI_SCHEME: Final = "sdpaxos"
#: a DNS name every replica certificate carries: gRPC clients check the server's name against
#: it (``grpc.ssl_target_name_override``), whatever address they dialed
REPLICA_DNS_NAME: Final = "sdpaxos-replica"
#: certificates made by ``cluster init --tls`` and ``cert issue`` are valid this long
VALID_DAYS: Final = 3650
#: backdated this much, against clocks a little behind the issuer's
BACKDATE: Final = datetime.timedelta(minutes=5)
#: the owner alone may read what holds a private key
PRIVATE_MODE: Final = 0o600
#: a TLS handshake not done in this long is dropped (a slow or silent peer holds no slot)
HANDSHAKE_TIMEOUT_S: Final = 5.0
#: OpenSSL's reasons when the first bytes are no TLS record: someone speaking plaintext
_NOT_TLS_REASONS: Final = frozenset({
    "WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL",
    "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNEXPECTED_RECORD",
})


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """One certificate and its private key (PEM files)."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig:
    """A cluster file's ``[tls]`` table (paths already resolved against the file)."""

    #: the cluster's CA certificate: the only issuer any link accepts
    ca: Path
    #: the CA's private key (only ``sdpaxos cert issue`` reads it; may be absent elsewhere)
    ca_key: Path | None
    #: each replica's certificate, by id
    replicas: Mapping[int, TlsFiles]
    #: what this cluster's own tools (cluster up/health, ctl, bench) present: the admin's
    client: TlsFiles | None
    #: revoked serial numbers
    revoked: frozenset[int] = field(default_factory=frozenset)
    #: the metrics/health endpoint speaks TLS too (client certificate required)
    metrics: bool = False
    #: the cluster file it came from (what a reload of ``revoked`` reads)
    source: Path | None = None

    def revocations(self) -> Revocations:
        return Revocations(self.revoked, self.source)

    def server(self, replica: int) -> ssl.SSLContext:
        """Replica ``replica``'s listening context."""
        return server_context(self.ca, self.replicas[replica])

    def dialer(self, replica: int) -> ssl.SSLContext:
        """Replica ``replica``'s context for dialing its peers."""
        return client_context(self.ca, self.replicas[replica])

    def tool(self) -> ssl.SSLContext:
        """The context this cluster's own tools dial with (``client_cert``)."""
        if self.client is None:
            raise ConfigError("[tls] names no client_cert/client_key for this cluster's tools")
        return client_context(self.ca, self.client)


@dataclass(frozen=True, slots=True)
class Identity:
    """What a certificate of this cluster names: a replica (``replica`` set) or a client
    (``principal`` set)."""

    serial: int
    replica: int | None = None
    principal: Principal | None = None

    def describe(self) -> str:
        if self.replica is not None:
            return f"replica {self.replica} (serial {self.serial:x})"
        assert self.principal is not None
        return f"{self.principal.describe()} (serial {self.serial:x})"


# ---------------------------------------------------------------------------- issuing


@dataclass(frozen=True, slots=True)
class Issued:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def write(self, files: TlsFiles) -> None:
        """The certificate and the key to their files, mode 0600 both (the issue's rule for
        every file it makes: nothing to get wrong when copying them around)."""
        write_private(files.cert, self.cert.public_bytes(serialization.Encoding.PEM))
        write_private(files.key, self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ))


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner alone (mode 0600 from the start: no
    moment where another user could open it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_MODE)
    try:
        os.fchmod(fd, PRIVATE_MODE)  # an existing file keeps its mode through O_CREAT
        os.write(fd, data)
    finally:
        os.close(fd)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _builder(subject: str, issuer: x509.Name, public: ec.EllipticCurvePublicKey,
             ) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def make_ca(cluster_id: str) -> Issued:
    """A new self-signed CA for ``cluster_id``."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sdpaxos CA {cluster_id}")])
    cert = (
        _builder(f"sdpaxos CA {cluster_id}", name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False,
        ), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def load_ca(cert_path: Path, key_path: Path) -> Issued:
    """The CA certificate and key from their PEM files (``ConfigError`` naming the file)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{cert_path}: not a readable PEM certificate "
                          f"({type(exc).__name__})") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        # the exception's text is not shown: it could quote the file
        raise ConfigError(f"{key_path}: not a readable PEM private key "
                          f"({type(exc).__name__})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{key_path}: the CA key must be an EC key")
    return Issued(cert, key)


def _leaf(ca: Issued, subject: str, sans: list[x509.GeneralName], *, server: bool) -> Issued:
    key = _new_key()
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    cert = (
        _builder(subject, ca.cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(cert, key)


def replica_uri(cluster_id: str, replica: int) -> str:
    return f"{URI_SCHEME}://{quote(cluster_id, safe='')}/replica/{replica}"


def client_uri(cluster_id: str, principal: Principal) -> str:
    query = f"role={principal.role}"
    if principal.vcs:
        query += "&vcs=" + ",".join(quote(vc, safe="") for vc in principal.vcs)
    name = quote(principal.name, safe="")
    return f"{URI_SCHEME}://{quote(cluster_id, safe='')}/client/{name}?{query}"


def issue_replica(ca: Issued, cluster_id: str, replica: int, hosts: Iterable[str]) -> Issued:
    """Replica ``replica``'s certificate (server and client: it both listens and dials)."""
    sans: list[x509.GeneralName] = [
        x509.UniformResourceIdentifier(replica_uri(cluster_id, replica)),
        x509.DNSName(REPLICA_DNS_NAME),
    ]
    for host in sorted(set(hosts)):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    return _leaf(ca, f"sdpaxos replica {replica}", sans, server=True)


def issue_client(ca: Issued, cluster_id: str, principal: Principal) -> Issued:
    """A client certificate naming ``principal`` (its role and virtual clusters)."""
    uri = x509.UniformResourceIdentifier(client_uri(cluster_id, principal))
    return _leaf(ca, principal.name, [uri], server=False)


# ---------------------------------------------------------------------------- identities


def identity_of(der: bytes, cluster_id: str) -> Identity:
    """What a peer's certificate (DER, already verified against the CA by the handshake)
    names in ``cluster_id``. ``ConfigError`` when it names nothing of this cluster."""
    try:
        cert = x509.load_der_x509_certificate(der)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        raise ConfigError("the certificate names no sdpaxos identity") from None
    found: list[Identity] = []
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        identity = _parse_uri(uri, cluster_id, cert.serial_number)
        if identity is not None:
            found.append(identity)
    if len(found) != 1:
        raise ConfigError(
            f"the certificate (serial {cert.serial_number:x}) names "
            f"{'no' if not found else 'more than one'} identity of cluster {cluster_id!r}"
        )
    return found[0]


def identity_of_pem(pem: bytes, cluster_id: str) -> Identity:
    try:
        der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    except ValueError:
        raise ConfigError("not a PEM certificate") from None
    return identity_of(der, cluster_id)


def _parse_uri(uri: str, cluster_id: str, serial: int) -> Identity | None:
    parts = urlsplit(uri)
    if parts.scheme != URI_SCHEME or unquote(parts.netloc) != cluster_id:
        return None
    kind, _, rest = parts.path.lstrip("/").partition("/")
    if kind == "replica" and rest.isdigit():
        return Identity(serial, replica=int(rest))
    if kind == "client" and rest:
        query = parse_qs(parts.query)
        role = query.get("role", [""])[0]
        vcs_text = query.get("vcs", [""])[0]
        vcs = tuple(unquote(vc) for vc in vcs_text.split(",")) if vcs_text else ()
        name = unquote(rest)
        if principal_problem(name, role, vcs) is not None:
            return None
        return Identity(serial, principal=Principal(name, role, vcs))
    return None


def serial_of_pem(pem: bytes) -> int:
    """A PEM certificate's serial number (``ConfigError`` if it is none)."""
    try:
        return int(x509.load_pem_x509_certificate(pem).serial_number)
    except ValueError:
        raise ConfigError("not a PEM certificate") from None


def parse_principal_args(name: str, role: str, vcs_text: str | None) -> Principal:
    """A principal from ``cert issue``'s options (``ConfigError`` saying what is wrong)."""
    vcs = tuple(sorted({vc.strip() for vc in vcs_text.split(",") if vc.strip()})) if (
        vcs_text) else ()
    if role == SCHEDULER and not vcs:
        raise ConfigError("a scheduler's certificate needs --vcs (its virtual clusters)")
    problem = principal_problem(name, role, vcs)
    if problem is not None:
        raise ConfigError(problem)
    return Principal(name, role, vcs)


# ---------------------------------------------------------------------------- contexts


def _context(purpose: ssl.Purpose, ca: Path, files: TlsFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(
        ssl.PROTOCOL_TLS_SERVER if purpose is ssl.Purpose.CLIENT_AUTH else ssl.PROTOCOL_TLS_CLIENT
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    # identities are checked by their URI (identity_of), not by the address dialed
    context.check_hostname = False
    try:
        context.load_verify_locations(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{ca}: cannot load the CA certificate ({type(exc).__name__})") from None
    try:
        context.load_cert_chain(certfile=str(files.cert), keyfile=str(files.key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{files.cert} / {files.key}: cannot load the certificate and its key "
                          f"({type(exc).__name__})") from None
    return context


def server_context(ca: Path, files: TlsFiles) -> ssl.SSLContext:
    """A listener's context: TLS 1.3 only, a client certificate of the CA required."""
    return _context(ssl.Purpose.CLIENT_AUTH, ca, files)


def client_context(ca: Path, files: TlsFiles) -> ssl.SSLContext:
    """A dialer's context: TLS 1.3 only, presents ``files``, the server must be of the CA."""
    return _context(ssl.Purpose.SERVER_AUTH, ca, files)


# ---------------------------------------------------------------------------- revocation


def parse_revoked(value: object, where: str) -> frozenset[int]:
    """``[tls] revoked``: a list of serial numbers in hex."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: revoked must be a list of hex serial numbers")
    serials = set()
    for text in value:
        try:
            serials.add(int(text.removeprefix("0x"), 16))
        except ValueError:
            raise ConfigError(f"{where}: revoked serial {text!r} is not hexadecimal") from None
    return frozenset(serials)


class Revocations:
    """The revoked serials a replica enforces, read again from the cluster file on demand
    (SIGHUP). Listeners (``on_change``) close the connections of newly revoked certificates."""

    def __init__(self, revoked: frozenset[int], source: Path | None = None) -> None:
        self.revoked = revoked
        self.source = source
        self._callbacks: list[Callable[[frozenset[int]], None]] = []

    def subscribe(self, callback: Callable[[frozenset[int]], None]) -> None:
        """``callback(newly revoked serials)`` after each reload that revoked some."""
        self._callbacks.append(callback)

    def is_revoked(self, serial: int) -> bool:
        return serial in self.revoked

    def reload(self) -> bool:
        """Read ``[tls] revoked`` from the cluster file again; True if it changed. A file that
        cannot be read or parsed changes nothing (logged)."""
        if self.source is None:
            return False
        try:
            raw = tomllib.loads(self.source.read_text())
            table = raw.get("tls")
            if not isinstance(table, dict):
                raise ConfigError("no [tls] table")
            revoked = parse_revoked(table.get("revoked", []), f"{self.source}: [tls]")
        except (OSError, tomllib.TOMLDecodeError, ConfigError) as exc:
            log.warning("revocation list not reloaded, keeping %d serials: %s",
                        len(self.revoked), exc)
            return False
        changed = revoked != self.revoked
        added = revoked - self.revoked
        self.revoked = revoked
        log.info("revocation list reloaded from %s: %d serials revoked (%d new)",
                 self.source, len(revoked), len(added))
        if added:
            for callback in self._callbacks:
                callback(added)
        return changed


# ---------------------------------------------------------------------------- accepting


def refusal_reason(exc: BaseException, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> str:
    """Why a TLS handshake with a connecting peer failed, in words for the log (a few
    words for each kind of failure: they key its rate-limited line)."""
    if isinstance(exc, TimeoutError):
        return (f"no TLS handshake within {timeout_s:g} s (this port requires TLS 1.3 "
                "with a certificate of the cluster's CA)")
    reason = getattr(exc, "reason", None) or type(exc).__name__
    if reason in _NOT_TLS_REASONS:
        return ("it does not speak TLS (plaintext?): this cluster requires TLS 1.3 with a "
                f"certificate of its CA [{reason}]")
    return f"TLS handshake failed: {reason} (a certificate of this cluster's CA is required)"


#: TLS handshakes under way on one port at most (a handshake costs CPU and a slot for up to
#: its timeout): a newcomer takes the place of the oldest that sent nothing, else it is closed
#: at once (``conn_limits.HandshakeGuard``)
MAX_HANDSHAKES: Final = 64


class TlsServer:
    """A listening socket whose connections are handed over only after a TLS handshake that
    began with their first byte (``loop.connect_accepted_socket``): a handshake the peer
    fails (plaintext, another CA, no certificate) is logged saying why and counted, where a
    server's own ``ssl=`` drops it silently. Handshakes under way are capped
    (``MAX_HANDSHAKES``, ``guard``): silent connections make room for newcomers."""

    def __init__(
        self, sock: socket.socket, context: ssl.SSLContext,
        callback: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]],
        port: str, on_refused: Callable[[], None] | None,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    ) -> None:
        self.sockets = [sock]
        self._context = context
        self._callback = callback
        self._port = port
        self._on_refused = on_refused
        self._timeout = handshake_timeout_s
        self.guard = HandshakeGuard(f"{port} (TLS)", MAX_HANDSHAKES)
        self._handshakes: set[asyncio.Task[None]] = set()
        #: the callbacks' tasks (referenced until done; like asyncio's, not cancelled by close)
        self._connections: set[asyncio.Task[None]] = set()
        self._accepting = asyncio.create_task(self._accept_loop(), name=f"tls-{port}")

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        sock = self.sockets[0]
        while True:
            try:
                conn, address = await loop.sock_accept(sock)
            except OSError as exc:  # out of descriptors, say: keep serving the others
                _refusals.warning(f"{self._port} accept", "%s port: accept failed: %s",
                                  self._port, exc)
                await asyncio.sleep(0.1)
                continue
            entry = self.guard.admit(conn.close)
            if entry is None:
                conn.close()  # every place taken by a talking one: counted, logged
                continue
            task = asyncio.create_task(self._handshake(conn, address, entry))
            entry.close = task.cancel  # made room for: its handshake ends, closing it
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket, address: object, entry: Handshaking) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        deadline = asyncio.timeout(self._timeout)
        try:
            async with deadline:
                await _readable(conn)
                self.guard.talked(entry)
                transport, _ = await loop.connect_accepted_socket(
                    lambda: protocol, conn, ssl=self._context,
                    ssl_handshake_timeout=self._timeout,
                )
        except (ssl.SSLError, TimeoutError, ConnectionError, OSError) as exc:
            conn.close()
            self.guard.finished(entry, timed_out=deadline.expired())
            if isinstance(exc, ssl.SSLError | TimeoutError):
                reason = refusal_reason(exc, self._timeout)
                _refusals.warning(f"{self._port} {reason}", "refusing %s connection from %s: "
                                  "%s", self._port, address, reason)
                if self._on_refused is not None:
                    self._on_refused()
            return
        except asyncio.CancelledError:  # made room for (or the server closed)
            conn.close()
            self.guard.finished(entry)
            raise
        self.guard.finished(entry)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        # the connection lives on in its own task, as asyncio.start_server's callbacks do
        task = asyncio.create_task(self._callback(reader, writer), name=f"{self._port}-conn")
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    def close(self) -> None:
        self._accepting.cancel()
        for task in self._handshakes:
            task.cancel()
        self.sockets[0].close()

    async def wait_closed(self) -> None:
        await asyncio.gather(self._accepting, *self._handshakes, return_exceptions=True)


async def start_server(
    callback: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]],
    host: str, port: int, *, tls: ssl.SSLContext | None, name: str = "",
    on_refused: Callable[[], None] | None = None,
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
) -> asyncio.Server | TlsServer:
    """``asyncio.start_server``; with ``tls``, a ``TlsServer`` whose ``callback`` gets only
    connections whose handshake (within ``handshake_timeout_s``) succeeded (``accept_tls``
    then checks their identity), and which logs (port ``name``) and counts (``on_refused``)
    the others."""
    if tls is None:
        return await asyncio.start_server(callback, host, port)
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sock = socket.socket(infos[0][0], socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(infos[0][4])
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return TlsServer(sock, tls, callback, name or f"{host}:{port}", on_refused,
                     handshake_timeout_s)


async def _readable(sock: socket.socket) -> None:
    """Until ``sock`` has bytes to read (or is closed by its peer)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


async def accept_tls(
    writer: asyncio.StreamWriter, context: ssl.SSLContext, *, port: str, cluster_id: str,
    revocations: Revocations,
) -> Identity | None:
    """The identity a connection's certificate names: the connection came from a
    ``TlsServer`` (handshake done) or is upgraded here (``context``). None (the refusal
    logged, saying why) for a peer that does not speak TLS, whose certificate is not of the
    CA, names nothing of this cluster or is revoked. The caller closes a refused
    connection."""
    if writer.get_extra_info("ssl_object") is None:
        peer = writer.get_extra_info("peername")
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                await writer.start_tls(context)
        except (ssl.SSLError, TimeoutError) as exc:
            reason = refusal_reason(exc)
            _refusals.warning(f"{port} {reason}", "refusing %s connection from %s: %s", port,
                              peer, reason)
            return None
        except (OSError, ConnectionError):
            return None  # gone during the handshake
    return checked_identity(writer, port=port, cluster_id=cluster_id, revocations=revocations)


def checked_identity(
    writer: asyncio.StreamWriter, *, port: str, cluster_id: str, revocations: Revocations,
) -> Identity | None:
    """The identity of a TLS connection's peer, or None (logged) if it names nothing of
    this cluster or is revoked."""
    peer = writer.get_extra_info("peername")
    ssl_object = writer.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        _refusals.warning(f"{port} no certificate", "refusing %s connection from %s: no "
                          "client certificate", port, peer)
        return None
    try:
        identity = identity_of(der, cluster_id)
    except ConfigError as exc:
        _refusals.warning(f"{port} no identity", "refusing %s connection from %s: %s", port,
                          peer, exc)
        return None
    if revocations.is_revoked(identity.serial):
        _refusals.warning(f"{port} revoked {identity.serial:x}", "refusing %s connection from "
                          "%s: the certificate of %s is revoked", port, peer,
                          identity.describe())
        return None
    return identity
